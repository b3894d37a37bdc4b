#include "model/fused_swiglu.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/swiglu.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

torch::Tensor swiglu_reference(const torch::Tensor& gu) {
  const int64_t F = gu.size(-1) / 2;
  return torch::silu(gu.narrow(-1, 0, F)) * gu.narrow(-1, F, F);
}

torch::Tensor swiglu_backward_reference(const torch::Tensor& gu, const torch::Tensor& dh) {
  const int64_t F = gu.size(-1) / 2;
  auto g = gu.narrow(-1, 0, F), u = gu.narrow(-1, F, F);
  auto s = torch::sigmoid(g);
  return torch::cat({dh * u * s * (1 + g * (1 - s)), dh * g * s}, -1);
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedSwigluFn : public torch::autograd::Function<FusedSwigluFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gu) {
    auto g2 = gu.contiguous();
    const int64_t F = g2.size(-1) / 2, N = g2.numel() / (2 * F);
    kernels::DType dt{};
    kernel_dtype(g2.scalar_type(), dt);
    auto out_sizes = g2.sizes().vec();
    out_sizes.back() = F;
    auto h = torch::empty(out_sizes, g2.options());
    check_kernel_launch(kernels::swiglu_forward(h.data_ptr(), g2.data_ptr(), dt, N, F, 2 * F,
                                                c10::cuda::getCurrentCUDAStream(gu.device().index()).stream()),
                        "SwiGLU forward");
    ctx->save_for_backward({g2});
    return h;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g2 = ctx->get_saved_variables()[0];
    const int64_t F = g2.size(-1) / 2, N = g2.numel() / (2 * F);
    kernels::DType dt{};
    kernel_dtype(g2.scalar_type(), dt);
    auto dh = grads[0].contiguous();
    auto dgu = torch::empty_like(g2);
    check_kernel_launch(kernels::swiglu_backward(dgu.data_ptr(), dh.data_ptr(), g2.data_ptr(), dt, N, F, 2 * F,
                                                 c10::cuda::getCurrentCUDAStream(g2.device().index()).stream()),
                        "SwiGLU backward");
    return {dgu};
  }
};

}  // namespace
#endif

torch::Tensor swiglu(const torch::Tensor& gu) {
  TORCH_CHECK(gu.dim() >= 1 && gu.size(-1) % 2 == 0, "swiglu: expected [..., 2F], got ", gu.sizes());
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (gu.is_cuda() && gu.numel() > 0 && kernel_dtype(gu.scalar_type(), dt)) return FusedSwigluFn::apply(gu);
#endif
  return swiglu_reference(gu);
}

}  // namespace model

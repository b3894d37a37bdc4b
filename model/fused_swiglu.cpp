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

torch::Tensor swiglu_weighted_reference(const torch::Tensor& gu, const torch::Tensor& w, const torch::Tensor& w_index) {
  const auto ct = gu.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto wr = w_index.defined() ? w.index_select(0, w_index) : w;
  return (swiglu_reference(gu.to(ct)) * wr.to(ct).unsqueeze(-1)).to(gu.scalar_type());
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const int64_t* index_or_null(const torch::Tensor& index) {
  return index.numel() > 0 ? index.data_ptr<int64_t>() : nullptr;
}

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

class FusedSwigluWeightedFn : public torch::autograd::Function<FusedSwigluWeightedFn> {
 public:
  // w_index: empty (row n reads w[n]; autograd takes no undefined tensor argument) or a contiguous
  // int64 permutation.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gu, const torch::Tensor& w,
                               const torch::Tensor& w_index) {
    auto g2 = gu.contiguous();
    auto wc = w.contiguous();
    const int64_t N = g2.size(0), F = g2.size(1) / 2;
    auto h = torch::empty({N, F}, g2.options());
    check_kernel_launch(kernels::swiglu_weighted_forward(h.data_ptr(), g2.data_ptr(), wc.data_ptr<float>(),
                                                         index_or_null(w_index),
                                                         checked_kernel_dtype(g2.scalar_type(), "weighted SwiGLU"),
                                                         N, F, 2 * F, stream_of(g2)),
                        "weighted SwiGLU forward");
    ctx->save_for_backward({g2, wc, w_index});
    return h;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &g2 = saved[0], &w = saved[1], &w_index = saved[2];
    const int64_t N = g2.size(0), F = g2.size(1) / 2;
    auto dh = grads[0].contiguous();
    auto dgu = torch::empty_like(g2);
    auto dw = torch::empty_like(w);  // every entry written: w_index is a permutation
    check_kernel_launch(kernels::swiglu_weighted_backward(dgu.data_ptr(), dw.data_ptr<float>(), dh.data_ptr(),
                                                          g2.data_ptr(), w.data_ptr<float>(), index_or_null(w_index),
                                                          checked_kernel_dtype(g2.scalar_type(), "weighted SwiGLU"),
                                                          N, F, 2 * F, stream_of(g2)),
                        "weighted SwiGLU backward");
    return {dgu, dw, torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor swiglu_weighted(const torch::Tensor& gu, const torch::Tensor& w, const torch::Tensor& w_index) {
  TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0 && w.dim() == 1 && w.size(0) == gu.size(0),
              "swiglu_weighted: expected gu [N, 2F] and w [N], got ", gu.sizes(), " and ", w.sizes());
  TORCH_CHECK(!w_index.defined() || (w_index.dim() == 1 && w_index.size(0) == gu.size(0) &&
                                     w_index.scalar_type() == torch::kInt64 && w_index.device() == w.device()),
              "swiglu_weighted: expected w_index int64 [", gu.size(0), "] on w's device, got ",
              w_index.defined() ? w_index.sizes() : torch::IntArrayRef{}, " ",
              w_index.defined() ? w_index.scalar_type() : torch::kInt64);
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (gu.is_cuda() && gu.numel() > 0 && kernel_dtype(gu.scalar_type(), dt) && w.scalar_type() == torch::kFloat32 &&
      w.device() == gu.device())
    return FusedSwigluWeightedFn::apply(gu, w, w_index.defined() ? w_index.contiguous()
                                                                 : torch::empty({0}, w.options().dtype(torch::kInt64)));
#endif
  return swiglu_weighted_reference(gu, w, w_index);
}

torch::Tensor swiglu(const torch::Tensor& gu) {
  TORCH_CHECK(gu.dim() >= 1 && gu.size(-1) % 2 == 0, "swiglu: expected [..., 2F], got ", gu.sizes());
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (gu.is_cuda() && gu.numel() > 0 && kernel_dtype(gu.scalar_type(), dt)) return FusedSwigluFn::apply(gu);
#endif
  return swiglu_reference(gu);
}

}  // namespace model

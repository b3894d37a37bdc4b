#include "model/fused_short_conv.h"

#include <torch/torch.h>

#include "model/gated_deltanet.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/short_conv.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x as the kernel reads it: rows of T tokens at a common token stride with unit channel stride.
torch::Tensor kernel_layout(const torch::Tensor& x) {
  const bool ok = x.stride(2) == 1 && x.stride(0) == x.size(1) * x.stride(1);
  return ok ? x : x.contiguous();
}

class FusedShortConvFn : public torch::autograd::Function<FusedShortConvFn> {
 public:
  // pos: [B·T] int64 positions in the document (packed rows), or None (dense rows); an IValue, since
  // autograd refuses an undefined tensor among a function's inputs.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& w,
                               const c10::IValue& pos_or_none) {
    const torch::Tensor pos = pos_or_none.isTensor() ? pos_or_none.toTensor() : torch::Tensor();
    auto x = kernel_layout(x_in);
    auto wf = w.to(torch::kFloat32).contiguous();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    kernels::DType dt{};
    kernel_dtype(x.scalar_type(), dt);
    auto y = torch::empty({B, T, C}, x.options().memory_format(torch::MemoryFormat::Contiguous));
    check_kernel_launch(kernels::short_conv_forward(y.data_ptr(), x.data_ptr(), dt, wf.data_ptr<float>(),
                                                    pos.defined() ? pos.data_ptr<int64_t>() : nullptr, B, T, C,
                                                    x.stride(1), static_cast<int>(w.size(1)),
                                                    c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                        "short conv forward");
    ctx->save_for_backward({x, wf});
    ctx->saved_data["pos"] = pos_or_none;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& wf = saved[1];
    const auto pos_or_none = ctx->saved_data["pos"];
    const torch::Tensor pos = pos_or_none.isTensor() ? pos_or_none.toTensor() : torch::Tensor();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    kernels::DType dt{};
    kernel_dtype(x.scalar_type(), dt);
    auto dy = grads[0].to(x.scalar_type()).contiguous();
    auto dx = torch::empty({B, T, C}, x.options().memory_format(torch::MemoryFormat::Contiguous));
    auto dw = torch::zeros_like(wf);
    check_kernel_launch(kernels::short_conv_backward(dx.data_ptr(), dw.data_ptr<float>(), dy.data_ptr(), x.data_ptr(),
                                                     dt, wf.data_ptr<float>(),
                                                     pos.defined() ? pos.data_ptr<int64_t>() : nullptr, B, T, C,
                                                     x.stride(1), static_cast<int>(wf.size(1)),
                                                     c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                        "short conv backward");
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    return {dx, dw.to(w_dtype), torch::Tensor()};
  }
};

bool kernel_taps(int64_t W) { return W == 2 || W == 3 || W == 4 || W == 6 || W == 8; }

}  // namespace
#endif

torch::Tensor fused_short_conv(const torch::Tensor& x, const torch::Tensor& w, const Positions& p) {
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (x.is_cuda() && x.dim() == 3 && x.numel() > 0 && kernel_dtype(x.scalar_type(), dt) && w.dim() == 2 &&
      w.size(0) == x.size(2) && kernel_taps(w.size(1))) {
    c10::IValue pos;
    if (p.varlen()) {
      TORCH_CHECK(p.pos.numel() == x.size(0) * x.size(1), "short_conv: positions ", p.pos.sizes(),
                  " do not match x ", x.sizes());
      pos = p.pos.reshape({-1}).to(torch::kInt64).contiguous();
    }
    return FusedShortConvFn::apply(x, w, pos);
  }
#endif
  return short_conv(x, w, p);
}

}  // namespace model

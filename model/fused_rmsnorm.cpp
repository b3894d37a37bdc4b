#include "model/fused_rmsnorm.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/rmsnorm_train.h"
#endif

namespace model {

torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  // fp32 math whatever the input dtype (MODEL.md §0); convert only when x is not fp32 already.
  const bool is_f32 = x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kFloat64;
  auto xf = is_f32 ? x : x.to(torch::kFloat32);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (w.defined()) y = y * w.to(y.scalar_type());
  return is_f32 ? y : y.to(x.scalar_type());
}

bool fused_rms_norm_applies(const torch::Tensor& x) {
#if defined(DD_HAVE_CUDA)
  return x.is_cuda() && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
         x.dim() >= 1 && x.size(-1) > 0;
#else
  (void)x;
  return false;
#endif
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_launch(int err, const char* what) {
  TORCH_CHECK(err == 0, what, " kernel launch failed (cudaError ", err, ")");
}

class FusedRmsNormFn : public torch::autograd::Function<FusedRmsNormFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w, double eps) {
    const int64_t C = x.size(-1), N = x.numel() / C;
    auto x2 = x.contiguous().view({N, C});
    // A weight-free norm arrives as an empty tensor (autograd functions take no undefined inputs).
    auto wf = w.numel() > 0 ? w.to(torch::kFloat32).contiguous() : torch::Tensor();
    auto y = torch::empty_like(x2);
    auto rstd = torch::empty({N}, x2.options().dtype(torch::kFloat32));
    check_launch(kernels::rmsnorm_train_forward(y.data_ptr(), rstd.data_ptr<float>(), x2.data_ptr(),
                                                wf.defined() ? wf.data_ptr<float>() : nullptr,
                                                x2.scalar_type() == torch::kBFloat16, N, C, static_cast<float>(eps),
                                                c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                 "RMSNorm forward");
    ctx->save_for_backward({x2, wf.defined() ? wf : torch::empty({0}, rstd.options()), rstd});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto wf = saved[1].numel() > 0 ? saved[1] : torch::Tensor();
    const auto& rstd = saved[2];
    const int64_t N = x2.size(0), C = x2.size(1);
    auto dy = grads[0].to(x2.scalar_type()).contiguous().view({N, C});
    auto dx = torch::empty_like(x2);
    torch::Tensor partial;
    if (wf.defined()) partial = torch::empty({kernels::rmsnorm_backward_partial_rows(N), C}, x2.options().dtype(torch::kFloat32));
    check_launch(kernels::rmsnorm_train_backward(dx.data_ptr(), partial.defined() ? partial.data_ptr<float>() : nullptr,
                                                 dy.data_ptr(), x2.data_ptr(),
                                                 wf.defined() ? wf.data_ptr<float>() : nullptr, rstd.data_ptr<float>(),
                                                 x2.scalar_type() == torch::kBFloat16, N, C,
                                                 c10::cuda::getCurrentCUDAStream(x2.device().index()).stream()),
                 "RMSNorm backward");
    torch::Tensor dw;
    if (wf.defined())
      dw = partial.sum(0).to(static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
    return {dx.view(grads[0].sizes()), dw, torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
#if defined(DD_HAVE_CUDA)
  if (fused_rms_norm_applies(x))
    return FusedRmsNormFn::apply(x, w.defined() ? w : torch::empty({0}, x.options().dtype(torch::kFloat32)), eps);
#endif
  return rms_norm_reference(x, w, eps);
}

}  // namespace model

#include "model/fused_rmsnorm.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/column_sum.h"
#include "kernels/rmsnorm_train.h"
#include "model/kernel_dtype.h"
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

AddNormOut add_rms_norm_reference(const torch::Tensor& x, const torch::Tensor& b, const torch::Tensor& w, double eps,
                                  torch::ScalarType y_dtype) {
  auto h = b.defined() ? x + b : x;
  auto y = rms_norm_reference(h, w, eps);
  return {h, y.scalar_type() == y_dtype ? y : y.to(y_dtype)};
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::DType dtype_of(torch::ScalarType t) { return checked_kernel_dtype(t, "RMSNorm kernels"); }

void* ptr_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// x as [N, C] rows: a view with x's own row stride where its rows are C unit-stride columns equally
// far apart (a column slice of wider rows, such as MLA's latent out of its K|V projection), which the
// kernels read in place; else contiguous (a copy where x is not).
torch::Tensor rows_of(const torch::Tensor& x, int64_t N, int64_t C) {
  bool strided = x.dim() >= 2 && x.size(-2) > 1 && x.stride(-1) == 1 && x.stride(-2) > C;
  // Each outer dim (but those of size 1, whose stride means nothing) steps over the whole of the
  // dims inside it.
  int64_t span = x.size(-2) * x.stride(-2);
  for (int64_t d = x.dim() - 3; strided && d >= 0; --d) {
    if (x.size(d) == 1) continue;
    strided = x.stride(d) == span;
    span = x.size(d) * x.stride(d);
  }
  return strided ? x.as_strided({N, C}, {x.stride(-2), 1}) : x.contiguous().view({N, C});
}

// Inputs: x, b (empty = no add), w (empty = weight-free). Outputs: y, then h when there is an add.
class FusedAddRmsNormFn : public torch::autograd::Function<FusedAddRmsNormFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& b,
                               const torch::Tensor& w, double eps, int64_t y_dtype) {
    const int64_t C = x.size(-1), N = x.numel() / C;
    const bool has_b = b.numel() > 0;
    const auto yt = static_cast<torch::ScalarType>(y_dtype);
    // An output nothing reads (the final norm's sum h) hands the backward an undefined gradient,
    // not a zero tensor: materialised, it cost a 50 MB fill and the kernel's read of it each step
    // at 16384 × 768 fp32 (docs/perf.md, stop 89).
    ctx->set_materialize_grads(false);
    // With no add, x is read in place even as a column slice (its rows x_ld apart) and kept so for
    // the backward; with one, h is written contiguous and x read so too.
    auto x2 = has_b ? x.contiguous().view({N, C}) : rows_of(x, N, C);
    const int64_t x_ld = x2.stride(0);
    auto b2 = has_b ? b.contiguous().view({N, C}) : torch::Tensor();
    auto wf = w.numel() > 0 ? w.to(torch::kFloat32).contiguous() : torch::Tensor();
    auto y = torch::empty({N, C}, x2.options().dtype(yt));
    auto h = has_b ? torch::empty({N, C}, x2.options()) : x2;
    auto rstd = torch::empty({N}, x2.options().dtype(torch::kFloat32));
    const auto b_dt = has_b ? b.scalar_type() : yt;
    check_kernel_launch(
        kernels::add_rmsnorm_forward(y.data_ptr(), dtype_of(yt), has_b ? h.data_ptr() : nullptr,
                                     rstd.data_ptr<float>(), x2.data_ptr(), dtype_of(x.scalar_type()),
                                     ptr_or_null(b2), dtype_of(b_dt), wf.defined() ? wf.data_ptr<float>() : nullptr,
                                     N, C, static_cast<float>(eps),
                                     c10::cuda::getCurrentCUDAStream(x.device().index()).stream(), x_ld),
        "RMSNorm forward");
    ctx->save_for_backward({h, wf.defined() ? wf : torch::empty({0}, rstd.options()), rstd});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(b_dt);
    ctx->saved_data["has_b"] = has_b;
    ctx->saved_data["y_dtype"] = y_dtype;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    if (!has_b) return {y.view(x.sizes())};
    return {y.view(x.sizes()), h.view(x.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto wf = saved[1].numel() > 0 ? saved[1] : torch::Tensor();
    const auto& rstd = saved[2];
    const bool has_b = ctx->saved_data["has_b"].toBool();
    const auto b_dt = static_cast<torch::ScalarType>(ctx->saved_data["b_dtype"].toInt());
    const int64_t N = h.size(0), C = h.size(1);
    const auto shape = ctx->saved_data["x_shape"].toIntVector();
    torch::Tensor dh;
    if (has_b && grads.size() > 1 && grads[1].defined()) dh = grads[1].to(h.scalar_type()).contiguous().view({N, C});
    if (!grads[0].defined() && !dh.defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    // y unread, h's gradient defined: dy is zeros.
    auto dy = grads[0].defined()
                  ? grads[0].contiguous().view({N, C})
                  : torch::zeros({N, C}, h.options().dtype(static_cast<torch::ScalarType>(ctx->saved_data["y_dtype"].toInt())));
    auto dx = torch::empty({N, C}, h.options());  // contiguous, h strided or not
    // The branch's gradient is the same value; a separate tensor only when its dtype differs.
    const bool separate_db = has_b && b_dt != h.scalar_type();
    auto db = separate_db ? torch::empty({N, C}, h.options().dtype(b_dt)) : torch::Tensor();
    const int partial_rows = kernels::rmsnorm_backward_partial_rows(N, C, dtype_of(h.scalar_type()),
                                                                   dtype_of(dy.scalar_type()), has_b);
    torch::Tensor partial;
    if (wf.defined()) partial = torch::empty({partial_rows, C}, h.options().dtype(torch::kFloat32));
    check_kernel_launch(
        kernels::add_rmsnorm_backward(dx.data_ptr(), ptr_or_null(db), partial.defined() ? partial.data_ptr<float>() : nullptr,
                                      dy.data_ptr(), ptr_or_null(dh), h.data_ptr(), dtype_of(h.scalar_type()),
                                      dtype_of(dy.scalar_type()), dtype_of(b_dt),
                                      wf.defined() ? wf.data_ptr<float>() : nullptr, rstd.data_ptr<float>(), N, C,
                                      partial_rows, c10::cuda::getCurrentCUDAStream(h.device().index()).stream(), h.stride(0)),
        "RMSNorm backward");
    torch::Tensor dw;
    if (wf.defined()) {
      dw = torch::empty({C}, partial.options());
      check_kernel_launch(kernels::column_sum_f32(dw.data_ptr<float>(), partial.data_ptr<float>(), partial.size(0), C,
                                                  c10::cuda::getCurrentCUDAStream(h.device().index()).stream()),
                          "RMSNorm weight gradient");
      dw = dw.to(static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
    }
    torch::Tensor dbv;
    if (has_b) dbv = (separate_db ? db : dx).view(shape);
    return {dx.view(shape), dbv, dw, torch::Tensor(), torch::Tensor()};
  }
};

// Whether the kernels take these tensors: a GPU, supported dtypes, b shaped like x and no wider.
bool kernels_apply(const torch::Tensor& x, const torch::Tensor& b, const torch::Tensor& w, torch::ScalarType y_dtype) {
  kernels::DType xd{}, yd{}, bd{};
  if (!x.is_cuda() || x.dim() < 1 || x.numel() == 0 || !kernel_dtype(x.scalar_type(), xd) ||
      !kernel_dtype(y_dtype, yd))
    return false;
  if (w.defined() && (w.numel() != x.size(-1) || w.device() != x.device())) return false;
  bd = yd;
  if (b.defined()) {
    if (!b.is_cuda() || b.sizes() != x.sizes() || !kernel_dtype(b.scalar_type(), bd)) return false;
    // h keeps x's dtype, as ATen's x + b does only when x is at least as wide as b.
    if (c10::promoteTypes(x.scalar_type(), b.scalar_type()) != x.scalar_type()) return false;
  }
  return kernels::add_rmsnorm_supported(xd, yd, bd, x.size(-1));
}

}  // namespace
#endif

AddNormOut fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& b, const torch::Tensor& w, double eps,
                              torch::ScalarType y_dtype) {
#if defined(DD_HAVE_CUDA)
  if (kernels_apply(x, b, w, y_dtype)) {
    // Autograd functions take no undefined inputs: a missing b or w travels as an empty tensor.
    auto empty = torch::empty({0}, x.options().dtype(torch::kFloat32));
    auto outs = FusedAddRmsNormFn::apply(x, b.defined() ? b : empty, w.defined() ? w : empty, eps,
                                         static_cast<int64_t>(y_dtype));
    return {b.defined() ? outs[1] : x, outs[0]};
  }
#endif
  return add_rms_norm_reference(x, b, w, eps, y_dtype);
}

torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return fused_add_rms_norm(x, {}, w, eps, x.scalar_type()).y;
}

}  // namespace model

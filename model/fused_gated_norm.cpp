#include "model/fused_gated_norm.h"

#include <torch/torch.h>

#include "model/fused_rmsnorm.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/gated_rmsnorm.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

void check_shapes(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w) {
  TORCH_CHECK(o.dim() == 4, "gated_rms_norm: expected o [B,T,H,D], got ", o.sizes());
  TORCH_CHECK(z.dim() == 3 && z.size(0) == o.size(0) && z.size(1) == o.size(1) && z.size(2) == o.size(2) * o.size(3),
              "gated_rms_norm: expected z [B,T,H·D] for o ", o.sizes(), ", got ", z.sizes());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == o.size(3), "gated_rms_norm: expected w [", o.size(3), "], got ",
              w.sizes());
}

}  // namespace

torch::Tensor gated_rms_norm_reference(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w,
                                       double eps, torch::ScalarType out_dtype) {
  check_shapes(o, z, w);
  const auto ft = o.scalar_type();
  auto zf = z.reshape(o.sizes()).to(ft);
  auto y = rms_norm_reference(o, w.to(ft), eps) * torch::silu(zf);
  return y.to(out_dtype);
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::DType dtype_of(torch::ScalarType t) { return checked_kernel_dtype(t, "gated RMSNorm kernels"); }

// z's rows as the kernels address them: H rows of D per token, tokens z.stride(1) apart.
kernels::GatedNormRows rows_of(const torch::Tensor& o, const torch::Tensor& z) {
  kernels::GatedNormRows r;
  r.N = o.numel() / o.size(3);
  r.D = o.size(3);
  r.z_heads = o.size(2);
  r.z_ld = z.stride(1);
  return r;
}


class GatedRmsNormFn : public torch::autograd::Function<GatedRmsNormFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& o, const torch::Tensor& z,
                               const torch::Tensor& w, double eps, int64_t out_dtype) {
    const auto yt = static_cast<torch::ScalarType>(out_dtype);
    auto oc = o.contiguous();
    auto wf = w.to(torch::kFloat32).contiguous();
    auto y = torch::empty(o.sizes(), o.options().dtype(yt));
    const auto rows = rows_of(o, z);
    auto rstd = torch::empty({rows.N}, o.options().dtype(torch::kFloat32));
    check_kernel_launch(kernels::gated_rmsnorm_forward(y.data_ptr(), dtype_of(yt), rstd.data_ptr<float>(),
                                                       oc.data_ptr<float>(), z.data_ptr(), dtype_of(z.scalar_type()),
                                                       wf.data_ptr<float>(), rows, static_cast<float>(eps),
                                                       stream_of(o)),
                        "gated RMSNorm forward");
    ctx->save_for_backward({oc, z, wf, rstd});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &o = saved[0], &z = saved[1], &wf = saved[2], &rstd = saved[3];
    auto dy = grads[0].contiguous();
    const auto rows = rows_of(o, z);
    auto d_o = torch::empty_like(o);
    auto dz = torch::empty(z.sizes(), z.options().memory_format(torch::MemoryFormat::Contiguous));
    auto partial = torch::empty({kernels::gated_rmsnorm_backward_partial_rows(rows.N), rows.D},
                                o.options().dtype(torch::kFloat32));
    check_kernel_launch(kernels::gated_rmsnorm_backward(d_o.data_ptr<float>(), dz.data_ptr(), partial.data_ptr<float>(),
                                                        dy.data_ptr(), dtype_of(dy.scalar_type()), o.data_ptr<float>(),
                                                        z.data_ptr(), dtype_of(z.scalar_type()), wf.data_ptr<float>(),
                                                        rstd.data_ptr<float>(), rows, stream_of(o)),
                        "gated RMSNorm backward");
    auto dw = partial.sum(0).to(static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
    return {d_o, dz, dw, torch::Tensor(), torch::Tensor()};
  }
};

// The kernels take fp32 o on a GPU, z with unit column stride and a token stride that covers the
// batch (z[b, t] at (b·T + t) · stride(1)), and widths up to 1024.
bool kernels_apply(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w, torch::ScalarType out) {
  kernels::DType d{};
  return o.is_cuda() && z.is_cuda() && w.is_cuda() && o.scalar_type() == torch::kFloat32 &&
         kernel_dtype(z.scalar_type(), d) && kernel_dtype(out, d) && z.stride(2) == 1 &&
         (z.size(0) == 1 || z.stride(0) == z.size(1) * z.stride(1)) && kernels::gated_rmsnorm_supports(o.size(3)) &&
         o.numel() > 0;
}

}  // namespace
#endif

torch::Tensor gated_rms_norm(const torch::Tensor& o, const torch::Tensor& z, const torch::Tensor& w, double eps,
                             torch::ScalarType out_dtype) {
  check_shapes(o, z, w);
#if defined(DD_HAVE_CUDA)
  if (kernels_apply(o, z, w, out_dtype)) return GatedRmsNormFn::apply(o, z, w, eps, static_cast<int64_t>(out_dtype));
#endif
  return gated_rms_norm_reference(o, z, w, eps, out_dtype);
}

}  // namespace model

#include "model/fused_gdn_gates.h"

#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include "kernels/gdn_gates.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

torch::Tensor as_dtype(const torch::Tensor& x, torch::ScalarType dt) { return x.scalar_type() == dt ? x : x.to(dt); }

}  // namespace

GdnGates gdn_gates_reference(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& A_log,
                             const torch::Tensor& dt_bias, bool neg_eig, torch::ScalarType ft) {
  TORCH_CHECK(a.dim() == 3 && b.sizes() == a.sizes(), "gdn gates: expected a and b [B,T,H] of one shape, got ",
              a.sizes(), " and ", b.sizes());
  TORCH_CHECK(A_log.dim() == 1 && A_log.size(0) == a.size(2) && dt_bias.sizes() == A_log.sizes(),
              "gdn gates: expected A_log and dt_bias [", a.size(2), "], got ", A_log.sizes(), " and ", dt_bias.sizes());
  auto beta = torch::sigmoid(as_dtype(b, ft));
  if (neg_eig) beta = beta * 2.0;
  auto g = -as_dtype(A_log, ft).exp() * torch::softplus(as_dtype(a, ft) + as_dtype(dt_bias, ft));
  return {beta, g};
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether ab's rows sit at one token stride with unit column stride (contiguous, or a column slice
// of a wider projection's rows, as one product hands the Gated DeltaNet's a|b beside q|k|v|g): the
// kernels read them in place at that stride.
bool rows_in_place(const torch::Tensor& ab) {
  return ab.stride(2) == 1 && ab.stride(1) >= ab.size(2) &&
         (ab.size(0) == 1 || ab.stride(0) == ab.size(1) * ab.stride(1));
}

class FusedGdnGatesFn : public torch::autograd::Function<FusedGdnGatesFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& ab, const torch::Tensor& A_log,
                               const torch::Tensor& dt_bias, bool neg_eig) {
    ctx->set_materialize_grads(false);
    const int64_t H = ab.size(2) / 2, N = ab.size(0) * ab.size(1);
    auto f32 = ab.options().dtype(torch::kFloat32);
    auto beta = torch::empty({ab.size(0), ab.size(1), H}, f32), g = torch::empty({ab.size(0), ab.size(1), H}, f32);
    check_kernel_launch(kernels::gdn_gates_forward(beta.data_ptr<float>(), g.data_ptr<float>(), ab.data_ptr(),
                                                   checked_kernel_dtype(ab.scalar_type(), "gdn gates"),
                                                   A_log.data_ptr<float>(), dt_bias.data_ptr<float>(), N, H, neg_eig,
                                                   stream_of(ab), ab.stride(1)),
                        "gdn gates forward");
    ctx->save_for_backward({ab, A_log, dt_bias});
    ctx->saved_data["neg_eig"] = neg_eig;
    return {beta, g};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &ab = saved[0], &A_log = saved[1], &dt_bias = saved[2];
    const int64_t H = ab.size(2) / 2, N = ab.size(0) * ab.size(1);
    const auto fp32_contiguous = [](const torch::Tensor& t) {
      return t.defined() ? t.to(torch::kFloat32).contiguous() : t;
    };
    const auto dbeta = fp32_contiguous(grads[0]), dg = fp32_contiguous(grads[1]);
    auto dab = torch::empty_like(ab, ab.options().memory_format(torch::MemoryFormat::Contiguous));
    auto sums = torch::zeros({2 * H}, A_log.options());  // dA_log | d_dt_bias
    const bool neg_eig = ctx->saved_data["neg_eig"].toBool();
    check_kernel_launch(
        kernels::gdn_gates_backward(dab.data_ptr(), sums.data_ptr<float>(),
                                    dbeta.defined() ? dbeta.data_ptr<float>() : nullptr,
                                    dg.defined() ? dg.data_ptr<float>() : nullptr, ab.data_ptr(),
                                    checked_kernel_dtype(ab.scalar_type(), "gdn gates"), A_log.data_ptr<float>(),
                                    dt_bias.data_ptr<float>(), N, H, neg_eig, stream_of(ab), ab.stride(1)),
        "gdn gates backward");
    return {dab, sums.narrow(0, 0, H), sums.narrow(0, H, H), torch::Tensor()};
  }
};

bool kernels_apply(const torch::Tensor& ab, const torch::Tensor& A_log, const torch::Tensor& dt_bias,
                   torch::ScalarType ft) {
  kernels::DType d{};
  const auto on_gpu_f32 = [&](const torch::Tensor& t) {
    return t.device() == ab.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
  };
  return ab.is_cuda() && ft == torch::kFloat32 && kernel_dtype(ab.scalar_type(), d) && rows_in_place(ab) &&
         on_gpu_f32(A_log) && on_gpu_f32(dt_bias) && A_log.size(0) <= kernels::kGdnGatesMaxHeads;
}

}  // namespace
#endif

GdnGates fused_gdn_gates(const torch::Tensor& ab, const torch::Tensor& A_log, const torch::Tensor& dt_bias,
                         bool neg_eig, torch::ScalarType ft) {
  TORCH_CHECK(ab.dim() == 3 && ab.size(2) % 2 == 0 && ab.size(2) / 2 == A_log.size(0),
              "gdn gates: expected ab [B,T,2H] with H = ", A_log.size(0), ", got ", ab.sizes());
  TORCH_CHECK(dt_bias.sizes() == A_log.sizes(), "gdn gates: expected dt_bias [", A_log.size(0), "], got ",
              dt_bias.sizes());
#if defined(DD_HAVE_CUDA)
  if (kernels_apply(ab, A_log, dt_bias, ft)) {
    auto out = FusedGdnGatesFn::apply(ab, A_log, dt_bias, neg_eig);
    return {out[0], out[1]};
  }
#endif
  const int64_t H = A_log.size(0);
  return gdn_gates_reference(ab.narrow(2, 0, H), ab.narrow(2, H, H), A_log, dt_bias, neg_eig, ft);
}

}  // namespace model

// Gated DeltaNet layer (MODEL.md §4): short conv, L2Norm, gates, the chunked GDR core, gated norm.
//
// The short conv is a sum of W shifted, scaled copies of x rather than a grouped Conv1d: Conv1d
// would need [B,C,T] transposes on both sides, and in packed rows each tap must be masked per token
// (pos(t) ≥ i) so that no tap reads the previous document; the shifted form does both in one place,
// and dense rows are the same code without the mask.
#include "model/gated_deltanet.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "model/fused_gated_norm.h"
#include "model/fused_gdn_gates.h"
#include "model/fused_l2norm.h"
#include "model/fused_short_conv.h"
#include "model/gdr.h"
#include "model/linear.h"
#include "model/mixed_linear.h"

namespace model {
namespace {

torch::ScalarType float_dtype(const torch::Tensor& x) {
  return x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::Tensor to_dtype(const torch::Tensor& x, torch::ScalarType dt) {
  return x.scalar_type() == dt ? x : x.to(dt);
}

// L2Norm(x) = x / sqrt(Σ x² + 1e-6) over the last dim D, in `dt`: on a GPU one kernel each way,
// reading x in place in its own dtype (model/fused_l2norm.h); the ATen formula elsewhere.
constexpr double kL2NormEps = 1e-6;
torch::Tensor l2_norm(const torch::Tensor& x, torch::ScalarType dt) { return fused_l2_norm(x, kL2NormEps, dt); }

// One token through the short conv: x [B,1,C] pre-conv input, state [B,W-1,C] the previous
// W-1 pre-conv inputs (zeros when undefined), w [C,W]. Returns silu(conv) [B,1,C]; replaces state.
torch::Tensor conv_step(const torch::Tensor& x, torch::Tensor& state, const torch::Tensor& w) {
  const int64_t B = x.size(0), C = x.size(2), W = w.size(1);
  if (!state.defined()) state = torch::zeros({B, W - 1, C}, x.options());
  TORCH_CHECK(state.size(0) == B && state.size(1) == W - 1 && state.size(2) == C,
              "gdn step: conv cache must be [B,W-1,C]=[", B, ",", W - 1, ",", C, "], got ", state.sizes());
  auto window = torch::cat({to_dtype(state, x.scalar_type()), x}, 1);  // [B,W,C], oldest first
  state = window.narrow(1, 1, W - 1);
  auto wt = to_dtype(w, x.scalar_type()).t().unsqueeze(0);             // [1,W,C]
  return torch::silu((window * wt).sum(1, /*keepdim=*/true));
}

}  // namespace

torch::Tensor short_conv(const torch::Tensor& x, const torch::Tensor& w, const Positions& p) {
  TORCH_CHECK(x.dim() == 3, "short_conv: expected x [B,T,C], got ", x.sizes());
  TORCH_CHECK(w.dim() == 2 && w.size(0) == x.size(2), "short_conv: expected w [", x.size(2), ",W], got ", w.sizes());
  const int64_t T = x.size(1), W = w.size(1);
  auto wc = to_dtype(w, x.scalar_type());
  // Tap i (shift by i tokens) uses w[:, W-1-i]; tap 0 is the current token.
  auto out = x * wc.select(1, W - 1);
  if (W == 1) return torch::silu(out);
  auto xp = torch::constant_pad_nd(x, {0, 0, W - 1, 0});  // [B,T+W-1,C], zeros before the row
  for (int64_t i = 1; i < W; ++i) {
    auto tap = xp.narrow(1, W - 1 - i, T);  // x[t-i]
    if (p.varlen()) {
      TORCH_CHECK(p.pos.dim() == 2 && p.pos.size(1) == T, "short_conv: positions ", p.pos.sizes(), " do not match T=", T);
      // Zero the taps that would reach into the previous document (pos(t) < i).
      tap = tap * (p.pos >= i).unsqueeze(-1).to(x.scalar_type());
    }
    out = torch::addcmul(out, tap, wc.select(1, W - 1 - i));
  }
  return torch::silu(out);
}

GatedDeltaNetImpl::GatedDeltaNetImpl(const ModelConfig& c)
    : d_(c.d), H_(c.gdn_heads), dk_(c.gdn_dk), dv_(c.gdn_dv), W_(c.gdn_conv), chunk_(c.gdn_chunk),
      neg_eig_(c.gdn_neg_eig), scan_precision_(c.gdn_scan_precision),
      scale_(1.0 / std::sqrt(static_cast<double>(c.gdn_dk))) {
  TORCH_CHECK(H_ > 0 && dk_ > 0 && dv_ > 0 && W_ > 0 && chunk_ > 0, "gdn: sizes must be positive");
  gdr_scan_uses_tf32(scan_precision_, torch::kFloat32);  // throws for a value that is not a precision
  const int64_t Kg = H_ * dk_, Vg = H_ * dv_;
  auto lin = [](int64_t in, int64_t out) { return Linear(in, out); };
  wq = register_module("wq", lin(d_, Kg));
  wk = register_module("wk", lin(d_, Kg));
  wv = register_module("wv", lin(d_, Vg));
  wa = register_module("wa", lin(d_, H_));
  wb = register_module("wb", lin(d_, H_));
  wg = register_module("wg", lin(d_, Vg));
  wo = register_module("wo", lin(Vg, d_));
  A_log = register_parameter("A_log", torch::empty({H_}));
  dt_bias = register_parameter("dt_bias", torch::empty({H_}));
  conv_q = register_parameter("conv_q", torch::empty({Kg, W_}));
  conv_k = register_parameter("conv_k", torch::empty({Kg, W_}));
  conv_v = register_parameter("conv_v", torch::empty({Vg, W_}));
  norm_w = register_parameter("norm_w", torch::empty({dv_}));
  reset_parameters(c.init_std,
                   c.init_std / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.n_layers, 1))));
}

void GatedDeltaNetImpl::reset_parameters(double std0, double std_out) {
  torch::NoGradGuard no_grad;
  for (auto* l : {&wq, &wk, &wv, &wa, &wb, &wg}) (*l)->weight.normal_(0.0, std0);
  wo->weight.normal_(0.0, std_out);
  // Drawn in fp64 so that softplus(dt_bias) = dt and A ≤ 16 survive the rounding to fp32.
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(A_log.device());
  // A = U(0,16]: 16 − U[0,16) never draws 0.
  auto A = 16.0 - torch::rand({H_}, f64) * 16.0;
  A_log.copy_(A.log());
  const double lo = std::log(1e-3), hi = std::log(0.1);
  auto dt = (torch::rand({H_}, f64) * (hi - lo) + lo).exp().clamp_min(1e-4);
  // Inverse softplus: softplus(dt + ln(1 − e^{−dt})) = dt.
  dt_bias.copy_(dt + torch::log(-torch::expm1(-dt)));
  const double bound = 1.0 / std::sqrt(static_cast<double>(W_));
  for (auto* w : {&conv_q, &conv_k, &conv_v}) w->uniform_(-bound, bound);
  norm_w.fill_(1.0);
}

torch::Tensor GatedDeltaNetImpl::output(const GdrOutput& r, const torch::Tensor& z_proj,
                                        torch::ScalarType out_dtype) {
  const int64_t B = z_proj.size(0), T = z_proj.size(1);
  // Per-head RMSNorm over dv with the shared weight, gated by silu(z); fp32 (fp64) math, emitted in
  // the output projection's dtype (one fused kernel each way on a GPU; the ATen formula elsewhere).
  // The chunked rule hands over its output in chunk layout, read in place by index.
  auto y = r.o_rows.defined() ? gated_rms_norm_rows(r.o_rows, r.o_row, z_proj, norm_w, 1e-6, out_dtype, r.o_pad_rows,
                                                    r.o_pad_rows_unread)
                              : gated_rms_norm(r.o, z_proj, norm_w, 1e-6, out_dtype);
  std::optional<WeightGradsOnCallerStreamScope> on_caller_stream;
  std::optional<WeightGradsDeferredScope> deferred;
  if (gdn_output_weight_grad_beside_scan() >= 0) deferred.emplace();
  else if (gdn_output_weight_grad_on_caller_stream()) on_caller_stream.emplace();
  return wo(y.reshape({B, T, H_ * dv_}));
}

torch::Tensor GatedDeltaNetImpl::forward(const torch::Tensor& u, const Positions& p) {
  TORCH_CHECK(u.dim() == 3 && u.size(2) == d_, "gdn: expected u [B,T,", d_, "], got ", u.sizes());
  const int64_t B = u.size(0), T = u.size(1);
  if (p.varlen() && B > 1) {
    // Packed rows never share a document piece, so the batch is one long packed row to the core.
    Positions flat = p;
    flat.pos = p.pos.reshape({1, B * T});
    return forward(u.reshape({1, B * T, d_}), flat).view({B, T, d_});
  }
  const auto ft = float_dtype(u);
  const bool tf32_scan = gdr_scan_uses_tf32(scan_precision_, matmul_dtype(u));
  const int64_t Kg = H_ * dk_, Vg = H_ * dv_;
  // The input projections in one op (each part's gradient still reaches its own weight), and one
  // short conv over the q|k|v channels with the three conv weights side by side: a few large
  // launches instead of six matmuls and three convs of W taps each. Where the products take
  // mixed_linear (a GPU under 16-bit autocast, in the trainer's scope) and gdn_gates_in_projection
  // is on, q|k|v|g and a|b are one GEMM each way, both outputs views of its rows, which the conv
  // and the gates read at their stride. Elsewhere two matmuls: under FP8 the H-wide gate
  // projections stay apart so that the wide ones keep sizes FP8 matmuls accept (multiples of 16);
  // u's gradient then comes out of their GEMMs already summed (mixed_linear_groups) or autograd adds
  // them. The conv's parts and the output gate's columns come out of the projection's rows
  // together, so that on a GPU their gradients go back into one tensor without concatenations;
  // a | b side by side, read whole by the gates (no split, and no concatenation in its backward).
  const auto proj = linear_cat_groups(u, {{wq, wk, wv, wg}, {wa, wb}}, gdn_gates_in_projection());
  auto front = fused_short_conv_parts(proj[0], torch::cat({conv_q, conv_k, conv_v}, 0), p, {Kg, Kg, Vg});
  const auto& gate_rows = proj[1];
  const auto& qkv_parts = front.parts;
  const auto qkv_dtype = qkv_parts[0].scalar_type();
  // q and k in the short conv's 16-bit dtype under 16-bit training, as v is (the delta rule's
  // kernels stage 16-bit q, k and v as they come: half the room and bytes), else in fp32.
  const bool qk16 = tf32_scan && !use_reference && gdn_qk_in_activation_dtype() && qkv_parts[0].is_cuda() &&
                    (qkv_dtype == torch::kBFloat16 || qkv_dtype == torch::kHalf);
  const auto qk_dt = qk16 ? qkv_dtype : ft;
  // On a GPU the chunked rule takes q and k before their L2Norm and normalises them itself, so that
  // its backward's tail kernel also writes the norm's input gradients where it can (GdrQkNorm).
  const bool norm_in_core = !use_reference && gdn_l2norm_in_core() && qkv_parts[0].is_cuda();
  const GdrQkNorm qk_norm{norm_in_core, kL2NormEps, qk_dt};
  auto q = qkv_parts[0].reshape({B, T, H_, dk_});
  auto k = qkv_parts[1].reshape({B, T, H_, dk_});
  if (!norm_in_core) {
    q = l2_norm(q, qk_dt);
    k = l2_norm(k, qk_dt);
  }
  auto v = qkv_parts[2].reshape({B, T, H_, dv_});
  auto gt = use_reference ? gdn_gates_reference(gate_rows.narrow(2, 0, H_), gate_rows.narrow(2, H_, H_), A_log, dt_bias,
                                               neg_eig_, ft)
                         : fused_gdn_gates(gate_rows, A_log, dt_bias, neg_eig_, ft);
  auto r = use_reference ? gdr_forward_ref(q, k, v, gt.beta, gt.g, scale_, {}, p.cu_seqlens)
                         : gdr_forward_chunked(q, k, v, gt.beta, gt.g, scale_, {}, p.cu_seqlens, chunk_, tf32_scan,
                                               /*o_as_rows=*/gdr_output_as_rows(), p.gdr_slots.get(),
                                               /*final_state=*/false, qk_norm);
  return output(r, front.rest, u.scalar_type());
}

torch::Tensor GatedDeltaNetImpl::step(const torch::Tensor& u, MixerCache& cache) {
  TORCH_CHECK(u.dim() == 3 && u.size(1) == 1 && u.size(2) == d_, "gdn step: expected u [B,1,", d_, "], got ",
              u.sizes());
  const int64_t B = u.size(0);
  const auto ft = float_dtype(u);
  // fp32 q and k here whatever the training precision: one token runs the recurrent rule, not the
  // chunk kernels that stage 16-bit rows (forward()'s 16-bit q and k differ by one rounding).
  auto q = l2_norm(conv_step(wq(u), cache.conv_q, conv_q).view({B, 1, H_, dk_}), ft);
  auto k = l2_norm(conv_step(wk(u), cache.conv_k, conv_k).view({B, 1, H_, dk_}), ft);
  auto v = conv_step(wv(u), cache.conv_v, conv_v).view({B, 1, H_, dv_});
  auto gt = gdn_gates_reference(wa(u), wb(u), A_log, dt_bias, neg_eig_, ft);
  auto r = gdr_forward_ref(q, k, v, gt.beta, gt.g, scale_, cache.state, {});
  cache.state = r.h;
  cache.pos += 1;
  return output(r, wg(u), u.scalar_type());
}

}  // namespace model

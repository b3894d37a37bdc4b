// Backward of the chunk-local math (notation of the header; s = scale, e = e^γ, κ = e^{γ_last − γ},
// Qg = diag(e) Q, P = (Q Kᵀ) ⊙ D, R_w = diag(b e) K, R_u = diag(b) V):
//   from O:      dP = s dO Vnᵀ,  dVn = s Pᵀ dO,  dQg = s dO h_inᵀ,  dh_in = s Qgᵀ dO
//   scan:        reverse scan -> dh_next, dU, dh0;  dW = −dU h_inᵀ,  dKd = Vn dh_nextᵀ
//   solve:       dR = Tmᵀ [dW|dU],  dA = −strict_lower(Tmᵀ ([dW|dU] [R_w|R_u]ᵀ) Tmᵀ)
//   A, P -> K, Q, b, D:   dS = dA ⊙ b_i ⊙ D (S = K Kᵀ, symmetric),  dK ∋ (dS + dSᵀ) K,
//                         dQ ∋ (dP ⊙ D) K,  dK ∋ (dP ⊙ D)ᵀ Q,  db ∋ Σ_j dA ⊙ S ⊙ D
//   D -> γ:      Z = (dA ⊙ b_i S + dP ⊙ (Q Kᵀ)) ⊙ D;  dγ ∋ rowsum(Z) − colsum(Z)
//   the rest is elementwise (R_w, R_u, Kd, decay, Qg), then dg = reverse cumsum of dγ.
// Four pieces have a kernel and an ATen twin with the same inputs and outputs: the gather with the
// gate math (prep), the masks, the masks' backward and the input gradients (kernels/gdr_chunk.h).
// At C = 64 three fused kernels take larger spans, each tested against the separate kernels
// (fused_kernels): the forward's front, the backward through the solve and the backward's tail.
#include "model/gdr_chunk_core.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <tuple>
#include <vector>

#include "model/bmm_fp32.h"
#include "model/fused_l2norm.h"
#include "model/gdr.h"
#include "model/gdr_state_grads.h"
#include "model/layers.h"
#include "model/mixed_linear.h"
#include "model/tril_solve.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/gdr_chunk.h"
#include "kernels/gdr_chunk_backward_tail.h"
#include "kernels/gdr_chunk_front.h"
#include "kernels/gdr_chunk_solve_backward.h"
#include "model/kernel_dtype.h"
#endif

namespace model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<bool> g_use_kernels{true};
std::atomic<bool> g_use_fused_kernels{true};
std::atomic<bool> g_bf16_front{true};
std::atomic<bool> g_tf32_chunk_products{true};
std::atomic<bool> g_save_front{true};
std::atomic<bool> g_l2norm_in_front{true};
std::atomic<int64_t> g_front_norms{0};
std::atomic<bool> g_dv_in_solve{true};
std::atomic<bool> g_bf16_chunk_grads{true};
std::atomic<bool> g_bf16_scan_products{true};
std::atomic<bool> g_bf16_tail_products{true};
std::atomic<int64_t> g_tail_norm_launches{0};
std::atomic<bool> g_bf16_solve_tiles{true};
std::atomic<bool> g_bf16_output{true};
std::atomic<int64_t> g_bf16_solve_tile_launches{0};
std::atomic<int64_t> g_front_recomputes{0};

torch::Tensor col(const torch::Tensor& x) { return x.unsqueeze(-1); }  // [N,H,C] -> [N,H,C,1]
torch::Tensor tr(const torch::Tensor& x) { return x.transpose(-1, -2); }
// [N,H,C,d] -> [N·H, C, d]: the scan works on rows r = chunk · H + head. A view for the layouts here
// (contiguous, or a narrow of dim 2), so the batched products below read their operands in place.
torch::Tensor rows(const torch::Tensor& x) { return x.reshape({-1, x.size(-2), x.size(-1)}); }

// alpha · a b for [..., M, K] and [..., K, N] batches with the same leading dims, as one batched
// fp32 product (split TF32 on a GPU's tensor cores, model/bmm_fp32.h); scales ride in alpha
// instead of an extra pass over the result. Returns [..., M, N].
torch::Tensor prod(const torch::Tensor& a, const torch::Tensor& b, double alpha = 1.0) {
  auto out = bmm_fp32(rows(a), rows(b), alpha);
  if (a.dim() == 3) return out;
  auto shape = a.sizes().vec();
  shape.back() = b.size(-1);
  return out.view(shape);
}

// D[i,j] = e^{γ_i − γ_j} for i ≥ j, else 0 [N,H,C,C]. The upper triangle is masked to −inf before
// exp: there γ_i − γ_j ≥ 0 and can overflow.
torch::Tensor decay_mask(const torch::Tensor& gam) {
  const int64_t C = gam.size(-1);
  auto causal = torch::ones({C, C}, torch::TensorOptions().dtype(torch::kBool).device(gam.device())).tril();
  return (gam.unsqueeze(-1) - gam.unsqueeze(-2)).masked_fill(causal.logical_not(), -INFINITY).exp();
}

// What a run of the op needs besides tensors: the layout's sizes, and for the kernels the chunk
// table on the device.
struct Ctx {
  GdrChunkLayout l;
  torch::ScalarType dt = torch::kFloat32;
  bool kernels = false;
  torch::Tensor table;  // [2, N] int32 on the device: chunk_start, chunk_len (kernels only)
  int64_t H = 0, dk = 0, dv = 0;
};

// The gather and everything derived from the gates; see kernels/gdr_chunk.h.
struct Prep {
  torch::Tensor X;             // [N,H,2C,dk]: Q rows, then K rows
  torch::Tensor Rw, Ru, Kd, Qg;  // [N,H,C,dk|dv]
  torch::Tensor gam, b;        // [N,H,C]
  torch::Tensor decay;         // [N,H]
  torch::Tensor Q() const { return X.narrow(2, 0, X.size(2) / 2); }
  torch::Tensor K() const { return X.narrow(2, X.size(2) / 2, X.size(2) / 2); }
};

Prep prep_reference(const Ctx& c, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const torch::Tensor& beta, const torch::Tensor& g) {
  const int64_t C = c.l.C;
  Prep p;
  auto Q = gdr_gather_chunks(q, c.l, c.dt), K = gdr_gather_chunks(k, c.l, c.dt);
  auto V = gdr_gather_chunks(v, c.l, c.dt);
  p.b = gdr_gather_chunks(beta.unsqueeze(-1), c.l, c.dt).squeeze(-1);
  p.gam = gdr_gather_chunks(g.unsqueeze(-1), c.l, c.dt).squeeze(-1).cumsum(-1);
  auto e = p.gam.exp();
  auto glast = p.gam.narrow(-1, C - 1, 1);
  p.X = torch::cat({Q, K}, 2);
  p.Rw = col(p.b * e) * K;
  p.Ru = col(p.b) * V;
  p.Kd = col((glast - p.gam).exp()) * K;
  p.Qg = col(e) * Q;
  p.decay = glast.exp().squeeze(-1);
  return p;
}

// P = (Q Kᵀ) ⊙ D and A = strict_lower(diag(b) (K Kᵀ) ⊙ D) from G = X Kᵀ [N,H,2C,C].
std::pair<torch::Tensor, torch::Tensor> masks_reference(const torch::Tensor& G, const Prep& p) {
  const int64_t C = G.size(-1);
  auto Dm = decay_mask(p.gam);
  auto P = G.narrow(2, 0, C) * Dm;
  auto A = (col(p.b) * G.narrow(2, C, C) * Dm).tril(-1);
  return {P, A};
}

struct MasksGrads {
  torch::Tensor dS_sym, dPm;  // [N,H,C,C]
  torch::Tensor db_A, dgam;   // [N,H,C]
};

MasksGrads masks_backward_reference(const torch::Tensor& dA_raw, const torch::Tensor& dP_raw, const torch::Tensor& G,
                                    const Prep& p, double s) {
  const int64_t C = G.size(-1);
  auto Dm = decay_mask(p.gam);
  auto QK = G.narrow(2, 0, C), S = G.narrow(2, C, C);
  auto dA = -dA_raw.tril(-1);
  MasksGrads m;
  auto dS = dA * col(p.b) * Dm;
  m.dS_sym = dS + tr(dS);
  m.dPm = dP_raw.defined() ? s * dP_raw * Dm : torch::zeros_like(dA);
  auto Z = dA * col(p.b) * S * Dm + m.dPm * QK;
  m.db_A = (dA * S * Dm).sum(-1);
  m.dgam = Z.sum(-1) - Z.sum(-2);
  return m;
}

// What the forward's scan and output products take, and what the backward keeps (Tm, W).
struct ForwardFront {
  torch::Tensor W, U, Kd, Qg;  // [N,H,C,dk|dv]
  torch::Tensor P, Tm;         // [N,H,C,C]
  torch::Tensor decay;         // [N,H]
  // Where the front took L2Norm (front_takes_norm): q and k normalised [B,T,H,dk] and the norm's
  // scales [B·T·H] fp32.
  torch::Tensor q_norm, k_norm, q_rstd, k_rstd;
};

struct Upstream {  // the gradients reaching the prep outputs, plus what the last step needs
  torch::Tensor dQ_mm, dK_mm, dQg, dRw, dRu, dKd, ddecay;
  MasksGrads m;
};

variable_list input_grads_reference(const Ctx& c, const Prep& p, const Upstream& u, const torch::Tensor& q,
                                    const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
                                    const torch::Tensor& g) {
  const int64_t C = c.l.C;
  auto e = p.gam.exp();
  auto glast = p.gam.narrow(-1, C - 1, 1);
  auto kappa = (glast - p.gam).exp();
  auto Q = p.Q(), K = p.K();
  auto V = gdr_gather_chunks(v, c.l, c.dt);
  auto dQ = u.dQg.defined() ? u.dQ_mm + col(e) * u.dQg : u.dQ_mm;
  auto dK = u.dK_mm + col(p.b * e) * u.dRw + col(kappa) * u.dKd;
  auto dV = col(p.b) * u.dRu;
  auto rw_k = (u.dRw * K).sum(-1);
  auto db = u.m.db_A + e * rw_k + (u.dRu * V).sum(-1);
  auto dgam = u.m.dgam + p.b * e * rw_k;
  if (u.dQg.defined()) dgam = dgam + e * (u.dQg * Q).sum(-1);
  auto c_kappa = kappa * (u.dKd * K).sum(-1);
  dgam = dgam - c_kappa;
  dgam.narrow(-1, C - 1, 1).add_(col(c_kappa.sum(-1) + u.ddecay * p.decay));
  // γ = cumsum(g): dg_t = Σ_{i ≥ t} dγ_i.
  auto dg = dgam.flip(-1).cumsum(-1).flip(-1);
  auto out = [&](const torch::Tensor& x, const torch::Tensor& like) {
    return gdr_scatter_chunks(x, c.l).to(like.scalar_type());
  };
  return {out(dQ, q), out(dK, k), out(dV, v), out(col(db), beta).squeeze(-1), out(col(dg), g).squeeze(-1)};
}

#if defined(DD_HAVE_CUDA)
kernels::GdrChunkList chunk_list(const Ctx& c) {
  kernels::GdrChunkList l;
  l.chunk_start = c.table.data_ptr<int32_t>();
  l.chunk_len = l.chunk_start + c.l.n_chunks;
  l.N = c.l.n_chunks;
  l.H = c.H;
  l.C = c.l.C;
  l.dk = c.dk;
  l.dv = c.dv;
  return l;
}


// The chunk table on the device: [2, N] int32, chunk starts then lengths.
torch::Tensor device_table(const GdrChunkLayout& l, const torch::Device& dev) {
  if (l.table.defined()) return l.table;  // a fixed layout's, where each batch's plan is copied in
  std::vector<int32_t> host(l.chunk_start);
  host.insert(host.end(), l.chunk_len.begin(), l.chunk_len.end());
  return cached_device_ints(host, dev).view({2, l.n_chunks});
}

// The token-layout inputs as the kernels read them: q and k contiguous in one dtype, v in its own
// (the layer's q and k leave their fp32 L2Norm, v its bf16 short conv), β and g fp32. v is read in
// place when only its token stride differs from a contiguous [B, T, H, dv] (the layer's v is a
// column slice of the conv's q|k|v output); otherwise it is copied.
struct KernelInputs {
  torch::Tensor q, k, v, beta, g;
  int64_t v_token_stride = 0;   // 0: contiguous
  int64_t qk_token_stride = 0;  // 0: contiguous; else only for the front (kernel_inputs' strided_qk)
  kernels::DType in_qk = kernels::DType::F32, in_v = kernels::DType::F32;

  // Points a chunk kernel's arguments at these inputs: the fields every such struct has (k, v and
  // its token stride, β, g, the dtypes). q is set by the callers whose struct reads it.
  template <typename Args>
  void point(Args& a) const {
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.v_token_stride = v_token_stride;
    a.beta = beta.data_ptr<float>();
    a.g = g.data_ptr<float>();
    a.in_qk = in_qk;
    a.in_v = in_v;
  }
};

// The stride between tokens of a [B, T, H, dv] tensor whose tokens are evenly spaced rows of
// contiguous heads, else 0.
int64_t token_stride(const torch::Tensor& x) {
  const int64_t T = x.size(1), H = x.size(2), D = x.size(3);
  if (x.stride(3) != 1 || (H > 1 && x.stride(2) != D)) return 0;
  const int64_t s = x.stride(1);
  if (s < H * D || (x.size(0) > 1 && x.stride(0) != T * s)) return 0;
  return s;
}

// strided_qk: q and k may stay in place where they share a token stride (the front reads them so;
// the other kernels want them contiguous).
KernelInputs kernel_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& beta, const torch::Tensor& g, bool strided_qk = false) {
  KernelInputs ki;
  auto qk_dt = q.scalar_type(), v_dt = v.scalar_type();
  if (k.scalar_type() != qk_dt || !kernel_dtype(qk_dt, ki.in_qk)) {
    qk_dt = torch::kFloat32;
    ki.in_qk = kernels::DType::F32;
  }
  if (!kernel_dtype(v_dt, ki.in_v)) {
    v_dt = torch::kFloat32;
    ki.in_v = kernels::DType::F32;
  }
  ki.q = q.to(qk_dt);
  ki.k = k.to(qk_dt);
  const int64_t qk_stride = strided_qk && !ki.q.is_contiguous() ? token_stride(ki.q) : 0;
  if (qk_stride != 0 && token_stride(ki.k) == qk_stride) {
    ki.qk_token_stride = qk_stride;
  } else {
    ki.q = ki.q.contiguous();
    ki.k = ki.k.contiguous();
  }
  ki.v = v.to(v_dt);
  ki.v_token_stride = ki.v.is_contiguous() ? 0 : token_stride(ki.v);
  if (!ki.v.is_contiguous() && ki.v_token_stride == 0) ki.v = ki.v.contiguous();
  ki.beta = beta.to(torch::kFloat32).contiguous();
  ki.g = g.to(torch::kFloat32).contiguous();
  return ki;
}

Prep prep_kernel(const Ctx& c, const KernelInputs& ki) {
  const int64_t N = c.l.n_chunks, H = c.H, C = c.l.C;
  auto opt = ki.beta.options();
  Prep p;
  p.X = torch::empty({N, H, 2 * C, c.dk}, opt);
  p.Rw = torch::empty({N, H, C, c.dk}, opt);
  p.Ru = torch::empty({N, H, C, c.dv}, opt);
  p.Kd = torch::empty({N, H, C, c.dk}, opt);
  p.Qg = torch::empty({N, H, C, c.dk}, opt);
  p.gam = torch::empty({N, H, C}, opt);
  p.b = torch::empty({N, H, C}, opt);
  p.decay = torch::empty({N, H}, opt);
  kernels::GdrChunkPrepArgs a;
  a.q = ki.q.data_ptr();
  ki.point(a);
  a.X = p.X.data_ptr<float>();
  a.Rw = p.Rw.data_ptr<float>();
  a.Ru = p.Ru.data_ptr<float>();
  a.Kd = p.Kd.data_ptr<float>();
  a.Qg = p.Qg.data_ptr<float>();
  a.gam = p.gam.data_ptr<float>();
  a.b = p.b.data_ptr<float>();
  a.decay = p.decay.data_ptr<float>();
  check_kernel_launch(kernels::gdr_chunk_prep_forward(chunk_list(c), a, stream_of(p.X)), "gated delta rule prep");
  return p;
}

std::pair<torch::Tensor, torch::Tensor> masks_kernel(const Ctx& c, const torch::Tensor& G, const Prep& p) {
  auto P = torch::empty({c.l.n_chunks, c.H, c.l.C, c.l.C}, G.options()), A = torch::empty_like(P);
  kernels::GdrChunkMasksArgs a;
  a.G = G.data_ptr<float>();
  a.gam = p.gam.data_ptr<float>();
  a.b = p.b.data_ptr<float>();
  a.P = P.data_ptr<float>();
  a.A = A.data_ptr<float>();
  check_kernel_launch(kernels::gdr_chunk_masks_forward(chunk_list(c), a, stream_of(G)), "gated delta rule masks");
  return {P, A};
}

MasksGrads masks_backward_kernel(const Ctx& c, const torch::Tensor& dA_raw, const torch::Tensor& dP_raw,
                                 const torch::Tensor& G, const Prep& p, double s) {
  MasksGrads m;
  auto dA = dA_raw.contiguous();
  auto dP = dP_raw.defined() ? dP_raw.contiguous() : dP_raw;
  m.dS_sym = torch::empty_like(dA);
  m.dPm = torch::empty_like(dA);
  m.db_A = torch::empty_like(p.gam);
  m.dgam = torch::empty_like(p.gam);
  kernels::GdrChunkMasksBackwardArgs a;
  a.dA_raw = dA.data_ptr<float>();
  a.dP_raw = dP.defined() ? dP.data_ptr<float>() : nullptr;
  a.G = G.data_ptr<float>();
  a.gam = p.gam.data_ptr<float>();
  a.b = p.b.data_ptr<float>();
  a.scale = static_cast<float>(s);
  a.dS_sym = m.dS_sym.data_ptr<float>();
  a.dPm = m.dPm.data_ptr<float>();
  a.db_A = m.db_A.data_ptr<float>();
  a.dgam = m.dgam.data_ptr<float>();
  check_kernel_launch(kernels::gdr_chunk_masks_backward(chunk_list(c), a, stream_of(G)),
                      "gated delta rule masks backward");
  return m;
}

variable_list input_grads_kernel(const Ctx& c, const Prep& p, const Upstream& u, const KernelInputs& ki,
                                 const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& beta, const torch::Tensor& g) {
  auto dq = torch::empty_like(ki.q), dk = torch::empty_like(ki.k);
  auto dv = torch::empty(ki.v.sizes(), ki.v.options());  // contiguous, whatever v's layout
  auto dbeta = torch::empty_like(ki.beta), dg = torch::empty_like(ki.g);
  auto dQ_mm = u.dQ_mm.contiguous(), dK_mm = u.dK_mm.contiguous();
  auto dQg = u.dQg.defined() ? u.dQg.contiguous() : u.dQg;
  auto dRw = u.dRw.contiguous(), dRu = u.dRu.contiguous(), dKd = u.dKd.contiguous();
  auto ddecay = u.ddecay.contiguous();
  kernels::GdrChunkInputGradsArgs a;
  a.dQ_mm = dQ_mm.data_ptr<float>();
  a.dK_mm = dK_mm.data_ptr<float>();
  a.dQg = dQg.defined() ? dQg.data_ptr<float>() : nullptr;
  a.dRw = dRw.data_ptr<float>();
  a.dRu = dRu.data_ptr<float>();
  a.dKd = dKd.data_ptr<float>();
  a.X = p.X.data_ptr<float>();
  a.gam = p.gam.data_ptr<float>();
  a.b = p.b.data_ptr<float>();
  a.decay = p.decay.data_ptr<float>();
  a.ddecay = ddecay.data_ptr<float>();
  a.db_A = u.m.db_A.data_ptr<float>();
  a.dgam = u.m.dgam.data_ptr<float>();
  a.v = ki.v.data_ptr();
  a.v_token_stride = ki.v_token_stride;
  a.in_qk = ki.in_qk;
  a.in_v = ki.in_v;
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dbeta = dbeta.data_ptr<float>();
  a.dg = dg.data_ptr<float>();
  check_kernel_launch(kernels::gdr_chunk_input_grads(chunk_list(c), a, stream_of(dq)),
                      "gated delta rule input gradients");
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dbeta.to(beta.scalar_type()),
          dg.to(g.scalar_type())};
}


// with_solve = false (the backward's recompute): Kd, Qg, P and decay only. bf16: W, U, Kd, Qg and P
// rounded to bf16 (Tm and decay stay fp32).
// With norm (front_may_take_norm and front_takes_norm held for ki), the front takes L2Norm of q and
// k (its inputs x) itself and returns their normalised rows and scales too.
ForwardFront forward_front_kernel(const Ctx& c, const KernelInputs& ki, bool with_solve, bool bf16,
                                  const GdrQkNorm* norm = nullptr) {
  const int64_t N = c.l.n_chunks, H = c.H, C = c.l.C;
  auto opt = ki.beta.options();
  auto out_opt = bf16 ? opt.dtype(torch::kBFloat16) : opt;
  ForwardFront f;
  if (with_solve) {
    f.W = torch::empty({N, H, C, c.dk}, out_opt);
    f.U = torch::empty({N, H, C, c.dv}, out_opt);
    f.Tm = torch::empty({N, H, C, C}, opt);
  }
  f.Kd = torch::empty({N, H, C, c.dk}, out_opt);
  f.Qg = torch::empty({N, H, C, c.dk}, out_opt);
  f.P = torch::empty({N, H, C, C}, out_opt);
  f.decay = torch::empty({N, H}, opt);
  kernels::GdrChunkFrontArgs a;
  a.q = ki.q.data_ptr();
  ki.point(a);
  a.W = with_solve ? f.W.data_ptr() : nullptr;
  a.U = with_solve ? f.U.data_ptr() : nullptr;
  a.Kd = f.Kd.data_ptr();
  a.Qg = f.Qg.data_ptr();
  a.P = f.P.data_ptr();
  a.Tm = with_solve ? f.Tm.data_ptr<float>() : nullptr;
  a.decay = f.decay.data_ptr<float>();
  a.bf16_out = bf16;
  a.qk_token_stride = ki.qk_token_stride;
  if (norm != nullptr) {
    const int64_t B = ki.q.size(0), T = ki.q.size(1);
    f.q_norm = torch::empty({B, T, c.H, c.dk}, ki.q.options().memory_format(at::MemoryFormat::Contiguous));
    f.k_norm = torch::empty_like(f.q_norm);
    f.q_rstd = torch::empty({B * T * c.H}, opt);
    f.k_rstd = torch::empty_like(f.q_rstd);
    a.q_norm = f.q_norm.data_ptr();
    a.k_norm = f.k_norm.data_ptr();
    a.q_rstd = f.q_rstd.data_ptr<float>();
    a.k_rstd = f.k_rstd.data_ptr<float>();
    a.norm_eps = static_cast<float>(norm->eps);
  }
  check_kernel_launch(kernels::gdr_chunk_front_forward(chunk_list(c), a, stream_of(f.P)),
                      "gated delta rule fused front");
  return f;
}

// dA_raw, dRw and dRu from Tm, dW and dU in one kernel (kernels/gdr_chunk_solve_backward.h). dA_raw
// holds its strictly lower triangle (all the masks' backward reads) and zeros above it within the
// diagonal blocks; the blocks above those are left unwritten. With take_dv the kernel writes, instead
// of dRu, v's gradient dv = b ⊙ dRu (contiguous, v's dtype) and dbeta_v = Σ dRu ⊙ V per chunk row,
// which the tail then takes in place of dRu.
struct SolveGrads {
  torch::Tensor dA_raw, dRw, dRu, dv, dbeta_v;
};
SolveGrads solve_backward_kernel(const Ctx& c, const KernelInputs& ki, const torch::Tensor& Tm, const torch::Tensor& dW,
                                 const torch::Tensor& dU, bool tf32, bool take_dv) {
  auto Tm_c = Tm.contiguous(), dW_c = dW.contiguous(), dU_c = dU.contiguous();
  SolveGrads out;
  out.dA_raw = torch::empty_like(Tm_c);
  out.dRw = torch::empty_like(dW_c);  // bf16 where dW is (gdr_bf16_chunk_grads)
  kernels::GdrChunkSolveBackwardArgs a;
  ki.point(a);
  a.Tm = Tm_c.data_ptr<float>();
  a.dW = dW_c.data_ptr();
  a.dU = dU_c.data_ptr();
  a.dA_raw = out.dA_raw.data_ptr<float>();
  a.dRw = out.dRw.data_ptr();
  a.bf16_grads = dW_c.scalar_type() == torch::kBFloat16;
  a.dU_bf16 = dU_c.scalar_type() == torch::kBFloat16;  // where the reverse scan's kernel wrote it so
  if (take_dv) {
    out.dv = torch::empty(ki.v.sizes(), ki.v.options());  // contiguous, whatever v's layout
    out.dbeta_v = torch::empty({c.l.n_chunks, c.H, c.l.C}, Tm_c.options());
    a.dv = out.dv.data_ptr();
    a.dbeta_v = out.dbeta_v.data_ptr<float>();
  } else {
    out.dRu = torch::empty(dU_c.sizes(), dU_c.options().dtype(torch::kFloat32));
    a.dRu = out.dRu.data_ptr<float>();
  }
  a.tf32_products = tf32;
  a.bf16_tiles = g_bf16_solve_tiles;
  check_kernel_launch(kernels::gdr_chunk_solve_backward(chunk_list(c), a, stream_of(out.dA_raw)),
                      "gated delta rule solve backward");
  if (kernels::gdr_chunk_solve_backward_bf16_tiles(a)) ++g_bf16_solve_tile_launches;
  return out;
}

// The input gradients from the solve's and the output products' gradients in one kernel
// (kernels/gdr_chunk_backward_tail.h). dP_raw and dQg may be undefined (no output gradient). Where
// the solve's backward took dRu's part (sg.dv defined), the tail takes dbeta_v and returns sg.dv.
// With q_rstd and k_rstd defined (the core's qk_norm), dq and dk come back as the gradients of the
// norm's inputs where the kernel takes the norm's backward (kernels::GdrChunkBackwardTailArgs::
// q_rstd), and *norm_taken says whether it did.
variable_list backward_tail_kernel(const Ctx& c, const KernelInputs& ki, double scale, const SolveGrads& sg,
                                   const torch::Tensor& dP_raw, const torch::Tensor& dQg, const torch::Tensor& dKd,
                                   const torch::Tensor& ddecay, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& beta, const torch::Tensor& g,
                                   const torch::Tensor& q_rstd, const torch::Tensor& k_rstd, bool* norm_taken) {
  auto dq = torch::empty_like(ki.q), dk = torch::empty_like(ki.k);
  const bool dv_given = sg.dv.defined();
  auto dv = dv_given ? sg.dv : torch::empty(ki.v.sizes(), ki.v.options());  // contiguous, whatever v's layout
  auto dbeta = torch::empty_like(ki.beta), dg = torch::empty_like(ki.g);
  auto dA_c = sg.dA_raw.contiguous(), dRw_c = sg.dRw.contiguous(), dKd_c = dKd.contiguous();
  auto dRu_c = dv_given ? torch::Tensor() : sg.dRu.contiguous();
  auto ddecay_c = ddecay.contiguous();
  auto dP_c = dP_raw.defined() ? dP_raw.contiguous() : dP_raw, dQg_c = dQg.defined() ? dQg.contiguous() : dQg;
  kernels::GdrChunkBackwardTailArgs a;
  a.q = ki.q.data_ptr();
  ki.point(a);
  a.scale = static_cast<float>(scale);
  a.dA_raw = dA_c.data_ptr<float>();
  a.dP_raw = dP_c.defined() ? dP_c.data_ptr<float>() : nullptr;
  a.bf16_grads = dKd_c.scalar_type() == torch::kBFloat16;
  a.bf16_products = a.bf16_grads && g_bf16_tail_products && a.in_qk == kernels::DType::BF16;
  TORCH_CHECK(dRw_c.scalar_type() == dKd_c.scalar_type() && (!dQg_c.defined() || dQg_c.scalar_type() == dKd_c.scalar_type()),
              "gated delta rule backward tail: dRw, dKd and dQg of different dtypes");
  a.dQg = dQg_c.defined() ? dQg_c.data_ptr() : nullptr;
  a.dRw = dRw_c.data_ptr();
  a.dRu = dv_given ? nullptr : dRu_c.data_ptr<float>();
  a.dbeta_v = dv_given ? sg.dbeta_v.data_ptr<float>() : nullptr;
  a.dKd = dKd_c.data_ptr();
  a.ddecay = ddecay_c.data_ptr<float>();
  a.dq = dq.data_ptr();
  a.dk = dk.data_ptr();
  a.dv = dv.data_ptr();
  a.dbeta = dbeta.data_ptr<float>();
  a.dg = dg.data_ptr<float>();
  *norm_taken = false;
  if (q_rstd.defined() && kernels::gdr_chunk_backward_tail_takes_norm(chunk_list(c), a)) {
    auto ok = [&](const torch::Tensor& r) {
      return r.defined() && r.scalar_type() == torch::kFloat32 && r.is_contiguous() && r.numel() == c.l.B * c.l.T * c.H;
    };
    TORCH_CHECK(ok(q_rstd) && ok(k_rstd),
                "gated delta rule backward tail: expected fp32 L2Norm scales [", c.l.B * c.l.T * c.H, "] for q and k");
    a.q_rstd = q_rstd.data_ptr<float>();
    a.k_rstd = k_rstd.data_ptr<float>();
    *norm_taken = true;
    ++g_tail_norm_launches;
  }
  check_kernel_launch(kernels::gdr_chunk_backward_tail(chunk_list(c), a, stream_of(dq)),
                      "gated delta rule backward tail");
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dbeta.to(beta.scalar_type()),
          dg.to(g.scalar_type())};
}
#endif

// The forward up to the scan's inputs, through the kernels or the ATen pieces.
struct Front {
  Prep p;
  torch::Tensor G;  // [N,H,2C,C] = X Kᵀ
  torch::Tensor P, A;
#if defined(DD_HAVE_CUDA)
  KernelInputs ki;
#endif
};

Front front(const Ctx& c, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& beta, const torch::Tensor& g) {
  Front f;
#if defined(DD_HAVE_CUDA)
  if (c.kernels) {
    f.ki = kernel_inputs(q, k, v, beta, g);
    f.p = prep_kernel(c, f.ki);
    f.G = prod(f.p.X, tr(f.p.K()));
    std::tie(f.P, f.A) = masks_kernel(c, f.G, f.p);
    return f;
  }
#endif
  f.p = prep_reference(c, q, k, v, beta, g);
  f.G = prod(f.p.X, tr(f.p.K()));
  std::tie(f.P, f.A) = masks_reference(f.G, f.p);
  return f;
}

// Whether the fused kernels take this run: the forward's front, and in the backward the front's
// recompute, the solve's backward and the tail (all or none, so each path is one tested whole).
bool fused_kernels(const Ctx& c) {
#if defined(DD_HAVE_CUDA)
  return c.kernels && g_use_fused_kernels && kernels::gdr_chunk_fused_supports(c.l.C, c.dk, c.dv);
#else
  (void)c;
  return false;
#endif
}

// Whether the fused backward keeps dU, dQg, dKd, dW and dRw in bf16 (gdr_bf16_chunk_grads): under
// bf16 states (the 16-bit training path) with q, k and v of one 16-bit type, as the tail takes them.
bool bf16_chunk_grads(bool fused, const Front& f, const torch::Tensor& h_in) {
#if defined(DD_HAVE_CUDA)
  return fused && g_bf16_chunk_grads && h_in.scalar_type() == torch::kBFloat16 && f.ki.in_qk == f.ki.in_v &&
         f.ki.in_qk != kernels::DType::F32;
#else
  (void)fused, (void)f, (void)h_in;
  return false;
#endif
}

// Whether the fused front writes W, U, Kd, Qg and P in bf16 (and the backward's recompute its Kd,
// Qg and P): under TF32 scan products with bf16 states, where the scan kernel reads bf16 inputs
// for these sizes. Everything after the front then reads bf16: the scan, the output products and
// the backward's products and reverse scan (model/gdr_scan.h, model/bmm_fp32.h).
bool bf16_front(const Ctx& c) {
  return g_bf16_front && fused_kernels(c) && c.l.scan.tf32_products && c.l.scan.bf16_states &&
         gdr_scan_takes_bf16_inputs(c.l.scan, c.l.C, c.dk, c.dv);
}

#if defined(DD_HAVE_CUDA)
// Whether the fused front may take L2Norm of q_in and k_in (the norm's inputs) for the core's
// qk_norm: the switch, the 16-bit path (the bf16 front) and q and k in the dtype the norm emits;
// front_takes_norm then asks the kernel about the sizes and layout.
bool front_may_take_norm(const Ctx& c, const torch::Tensor& q_in, const torch::Tensor& k_in, const GdrQkNorm& norm) {
  return norm.on && g_l2norm_in_front && bf16_front(c) && q_in.scalar_type() == norm.dtype &&
         k_in.scalar_type() == norm.dtype && (norm.dtype == torch::kBFloat16 || norm.dtype == torch::kHalf);
}

// Whether the fused front kernel takes the norm for q and k as ki holds them
// (kernels::gdr_chunk_front_takes_norm).
bool front_takes_norm(const Ctx& c, const KernelInputs& ki) {
  kernels::GdrChunkFrontArgs a;
  a.q = ki.q.data_ptr();
  ki.point(a);
  a.qk_token_stride = ki.qk_token_stride;
  return kernels::gdr_chunk_front_takes_norm(chunk_list(c), a);
}
#endif

// Whether the solve's backward kernel takes its products in TF32 (gdr_tf32_chunk_products); the
// kernel applies it to 16-bit k and v of one type only.
bool tf32_chunk_products(const Ctx& c) { return g_tf32_chunk_products && bf16_front(c); }

// The forward's front: the fused kernel where it takes the sizes (its outputs in bf16 with
// bf16_front), else the separate pieces (the reference for the fused kernel, and what the
// backward recomputes), in fp32.
ForwardFront forward_front(const Ctx& c, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& beta, const torch::Tensor& g) {
#if defined(DD_HAVE_CUDA)
  if (fused_kernels(c)) {
    return forward_front_kernel(c, kernel_inputs(q, k, v, beta, g), true, bf16_front(c));
  }
#endif
  const Front f = front(c, q, k, v, beta, g);
  ForwardFront o;
  o.Tm = unit_lower_inverse(f.A);
  o.W = prod(o.Tm, f.p.Rw);
  o.U = prod(o.Tm, f.p.Ru);
  o.Kd = f.p.Kd;
  o.Qg = f.p.Qg;
  o.P = f.P;
  o.decay = f.p.decay;
  return o;
}

Ctx make_ctx(const GdrChunkLayout& l, const torch::Tensor& q, const torch::Tensor& v, const torch::Tensor& h0) {
  Ctx c;
  c.l = l;
  c.dt = h0.scalar_type();
  c.H = q.size(2);
  c.dk = q.size(3);
  c.dv = v.size(3);
#if defined(DD_HAVE_CUDA)
  c.kernels = g_use_kernels && q.is_cuda() && c.dt == torch::kFloat32 && kernels::gdr_chunk_supports(l.C);
  if (c.kernels) c.table = device_table(l, q.device());
#endif
  return c;
}

// Where the output's rows go (gdr_chunk_row_targets; undefined: the chunk layout), and whether the
// caller takes the output in bf16 (gdr_chunk_core's bf16_output_ok). A struct, not a tensor
// argument: autograd records every tensor argument as an input and refuses undefined ones.
struct OutputTargets {
  torch::Tensor rows;
  bool bf16_ok = false;
};

// Whether the output is written in bf16 (gdr_chunk_core's bf16_output_ok): in the chunk layout on the
// 16-bit path, bf16 v and the bf16 front.
bool bf16_output(const Ctx& c, const torch::Tensor& v, const OutputTargets& targets) {
  return targets.bf16_ok && g_bf16_output && !targets.rows.defined() && v.scalar_type() == torch::kBFloat16 &&
         bf16_front(c);
}

class GdrChunkCoreFn : public torch::autograd::Function<GdrChunkCoreFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v, const torch::Tensor& beta, const torch::Tensor& g,
                               const torch::Tensor& h0, const GdrChunkLayout& l, double scale,
                               const OutputTargets& targets, const GdrQkNorm& qk_norm) {
    const torch::Tensor& o_targets = targets.rows;
    ctx->set_materialize_grads(false);
    // With qk_norm, q and k are the norm's outputs from here on; its scales are saved for the backward.
    // The fused front takes the norm itself where it can (front_takes_norm: it reads q_in and k_in
    // in place and writes the normalised rows beside its own outputs); else the norm's kernel first.
    torch::Tensor q = q_in, k = k_in, q_rstd, k_rstd;
    const Ctx c = make_ctx(l, q_in, v, h0);
    ForwardFront f;  // W, U, Kd, Qg, P bf16 with bf16_front(c)
    bool front_took_norm = false;
#if defined(DD_HAVE_CUDA)
    if (front_may_take_norm(c, q_in, k_in, qk_norm)) {
      const auto ki = kernel_inputs(q_in, k_in, v, beta, g, /*strided_qk=*/true);
      if (front_takes_norm(c, ki)) {
        f = forward_front_kernel(c, ki, true, bf16_front(c), &qk_norm);
        q = f.q_norm;
        k = f.k_norm;
        q_rstd = f.q_rstd;
        k_rstd = f.k_rstd;
        front_took_norm = true;
        ++g_front_norms;
      }
    }
#endif
    if (!front_took_norm) {
      if (qk_norm.on) {
        auto nq = l2_norm_rows(q_in, qk_norm.eps, qk_norm.dtype);
        auto nk = l2_norm_rows(k_in, qk_norm.eps, qk_norm.dtype);
        q = nq.y;
        k = nk.y;
        q_rstd = nq.rstd;
        k_rstd = nk.rstd;
      }
      f = forward_front(c, q, k, v, beta, g);
    }
    // O = s (P Vn + Qg h_in), both products in one pass over O. h_in and v_new are bf16 under the
    // plan's bf16_states (TF32 products on a GPU); the products here and in the backward read them so.
    // With o_targets, written straight into the token layout.
    // Or in bf16 where the caller takes it (bf16_output), then by the scan itself where it can
    // (gdr_scan_with_output: the same bf16 operands, the sums in another order).
    const bool tokens = o_targets.defined();
    torch::Tensor O;
    // An empty h0 starts every document from zero states: the scans take none (undefined), and make
    // zeros only where their path needs a tensor of them.
    const torch::Tensor init = h0.numel() > 0 ? h0 : torch::Tensor();
    const auto scan = !tokens && bf16_output(c, v, targets)
                          ? gdr_scan_with_output(rows(f.W), rows(f.U), rows(f.Kd), f.decay.reshape({-1}), init, l.scan,
                                                 rows(f.P), rows(f.Qg), scale, O)
                          : gdr_scan(rows(f.W), rows(f.U), rows(f.Kd), f.decay.reshape({-1}), init, l.scan);
    if (!O.defined()) {
      O = tokens ? bmm_fp32_sum_scattered(rows(f.P), scan.v_new, rows(f.Qg), scan.h_in, scale, o_targets,
                                          l.B * l.T * c.H)
                 : bmm_fp32_sum(rows(f.P), scan.v_new, rows(f.Qg), scan.h_in, scale, bf16_output(c, v, targets));
    }
    // With the fused kernels the backward reads the front's Kd, Qg, P and decay again: kept here
    // (gdr_save_front), or recomputed there.
    const bool keep_front = fused_kernels(c) && g_save_front;
    std::vector<torch::Tensor> saved{q, k, v, beta, g, f.Tm, f.W, scan.h_in, scan.v_new};
    if (keep_front) saved.insert(saved.end(), {f.Kd, f.Qg, f.P, f.decay});
    const int64_t norm_at = static_cast<int64_t>(saved.size());
    // The norm's inputs as given (views of the short conv's output, which v keeps alive anyway),
    // for its own backward where the tail kernel does not take it.
    if (qk_norm.on) saved.insert(saved.end(), {q_rstd, k_rstd, q_in, k_in});
    ctx->save_for_backward(saved);
    auto& sd = ctx->saved_data;
    sd["front_saved"] = keep_front;
    sd["no_h0"] = h0.numel() == 0;  // the backward then gives h0 (empty) no gradient
    sd["qk_norm_at"] = qk_norm.on ? norm_at : int64_t{-1};  // where the norm's scales are saved
    sd["n_docs"] = l.scan.n_docs;
    sd["heads"] = l.scan.heads;
    sd["step_count"] = l.scan.step_count;
    sd["step_off"] = l.scan.step_off;
    sd["tf32_products"] = l.scan.tf32_products;  // the reverse scan takes the forward's product mode
    sd["scan_step_off"] = l.scan.device_step_off;  // a fixed layout's device plan (else undefined)
    sd["scan_doc_chunks"] = l.scan.device_doc_chunks;
    sd["B"] = l.B;
    sd["T"] = l.T;
    sd["C"] = l.C;
    sd["n_chunks"] = l.n_chunks;
    sd["token_slot"] = l.token_slot;
    sd["table"] = c.table;
    sd["kernels"] = c.kernels;
    sd["dt"] = static_cast<int64_t>(c.dt);
    sd["scale"] = scale;
    sd["o_tokens"] = tokens;
    if (tokens) sd["o_rows"] = o_targets;  // the backward reads the output's gradient by the same map
    // In the chunk layout, a fixed layout's row map (where the caller left it on: gdr.cpp) has the
    // backward skip the padding rows of the output's gradient, which nobody then zeroes.
    if (!tokens && l.row_map.defined()) sd["o_rows"] = l.row_map;
    sd["bf16_front"] = f.W.scalar_type() == torch::kBFloat16;  // the backward's recompute writes the same
    sd["tf32_chunk"] = tf32_chunk_products(c);                  // the solve's backward in TF32
    if (tokens) return {O.view({l.B, l.T, c.H, c.dv}), scan.h_final};
    return {O.view({l.n_chunks, c.H, l.C, c.dv}), scan.h_final};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    AutocastOff fp32_core;
    const auto sv = ctx->get_saved_variables();
    const auto &q = sv[0], &k = sv[1], &v = sv[2], &beta = sv[3], &g = sv[4], &Tm = sv[5], &W = sv[6];
    const auto &h_in = sv[7], &v_new = sv[8];
    auto& sd = ctx->saved_data;
    Ctx c;
    c.l.scan.n_docs = sd["n_docs"].toInt();
    c.l.scan.heads = sd["heads"].toInt();
    c.l.scan.step_count = sd["step_count"].toIntVector();
    c.l.scan.step_off = sd["step_off"].toIntVector();
    c.l.scan.tf32_products = sd["tf32_products"].toBool();
    c.l.scan.device_step_off = sd["scan_step_off"].toTensor();
    c.l.scan.device_doc_chunks = sd["scan_doc_chunks"].toTensor();
    c.l.B = sd["B"].toInt();
    c.l.T = sd["T"].toInt();
    c.l.C = sd["C"].toInt();
    c.l.n_chunks = sd["n_chunks"].toInt();
    c.l.token_slot = sd["token_slot"].toTensor();
    c.table = sd["table"].toTensor();
    c.kernels = sd["kernels"].toBool();
    c.dt = static_cast<torch::ScalarType>(sd["dt"].toInt());
    c.H = q.size(2);
    c.dk = q.size(3);
    c.dv = v.size(3);
    const double s = sd["scale"].toDouble();
    const int64_t N = c.l.n_chunks, H = c.H, C = c.l.C, dk = c.dk, dv = c.dv;
    const auto& dO = grads[0];
    const auto& dh_final = grads[1];

    // With the fused kernels the front's Kd, Qg, P and decay (the tail recomputes the rest from q
    // and k): saved by the forward (gdr_save_front) or recomputed, in bf16 where the forward wrote
    // bf16; else the whole of prep, the masks and X Kᵀ, recomputed.
    const bool fused = fused_kernels(c);
    const int64_t norm_at = sd["qk_norm_at"].toInt();
    const torch::Tensor q_rstd = norm_at >= 0 ? sv[norm_at] : torch::Tensor();
    const torch::Tensor k_rstd = norm_at >= 0 ? sv[norm_at + 1] : torch::Tensor();
    bool norm_taken = false;  // whether the tail kernel took the norm's backward
    Front f;
    ForwardFront ff;
#if defined(DD_HAVE_CUDA)
    if (fused) {
      f.ki = kernel_inputs(q, k, v, beta, g);
      if (sd["front_saved"].toBool()) {
        ff.Kd = sv[9];
        ff.Qg = sv[10];
        ff.P = sv[11];
        ff.decay = sv[12];
      } else {
        ff = forward_front_kernel(c, f.ki, false, sd["bf16_front"].toBool());
        ++g_front_recomputes;
      }
    }
#endif
    if (!fused) {
      f = front(c, q, k, v, beta, g);
      ff.Kd = f.p.Kd;
      ff.Qg = f.p.Qg;
      ff.P = f.P;
      ff.decay = f.p.decay;
    }

    // From O = s (Qg h_in + P Vn): gradients into P, Vn, Qg and h_in. The two into Vn and h_in are
    // the reverse scan's inputs, and on a GPU the scan takes them itself from dO
    // (gdr_scan_backward_from_output_grad). The other two, and the scan's own products with the
    // states (dW, dKd, ddecay), come after it, one kernel on a GPU (model/gdr_state_grads.h).
    torch::Tensor dP_raw, dQg, dW;
    GdrScanGrads sg;
    Upstream u;
    const auto decay_rows = ff.decay.reshape({-1});
    if (dO.defined()) {
      // The output may have gone straight into token order, its gradient then coming back in that
      // layout: the products read its rows there by the output's row map (no copy into chunk rows on
      // a GPU).
      // A bf16 output's gradient stays bf16 (the scan and the state products read it so).
      const bool dO16 = dO.scalar_type() == torch::kBFloat16 && c.dt == torch::kFloat32;
      const auto dO_src = (dO16 ? dO : dO.to(c.dt)).contiguous().view({-1, dv});
      const torch::Tensor dO_rows = sd.count("o_rows") > 0 ? sd["o_rows"].toTensor() : torch::Tensor();
      const bool bf16_grads = bf16_chunk_grads(fused, f, h_in);
      // A GEMM put off until now (gdn_output_weight_grad_beside_scan) starts beside the reverse scan:
      // its node is created after the scan's, from the point before it.
      const int beside_scan_sms = gdn_output_weight_grad_beside_scan();
      if (beside_scan_sms >= 0) deferred_weight_grads_ready_here(dO.device());
      sg = gdr_scan_backward_from_output_grad(rows(W), rows(ff.Kd), decay_rows, rows(ff.P), rows(ff.Qg), dO_src,
                                              dO_rows, s, dh_final, c.l.scan, bf16_grads,
                                              bf16_grads && g_bf16_scan_products);
      if (beside_scan_sms >= 0) run_deferred_weight_grads(dO.device(), beside_scan_sms);
      // The fused kernels after it skip chunks of no tokens (a fixed layout's spare ones), so it may too.
      const auto sgr = gdr_state_grads(dO_src, dO_rows, sg.dU, rows(h_in), sg.dh_next, rows(v_new), s, bf16_grads,
                                       fused ? c.table.select(0, 1) : torch::Tensor(), H);
      dP_raw = sgr.dP_raw.view({N, H, C, C});
      dQg = sgr.dQg.view({N, H, C, dk});
      dW = sgr.dW.view({N, H, C, dk});
      u.dKd = sgr.dKd.view({N, H, C, dk});
      u.ddecay = sgr.ddecay.view({N, H});
    } else {
      sg = gdr_scan_backward(rows(W), rows(ff.Kd), decay_rows, {}, torch::zeros({N * H, C, dv}, Tm.options()),
                             dh_final, c.l.scan);
      u.dKd = prod(v_new, tr(sg.dh_next)).view({N, H, C, dk});
      // Σ h_in ⊙ dh_next per row (no [R, dk, dv] temporary).
      u.ddecay = row_dot_fp32(h_in, sg.dh_next).view({N, H});
      dW = prod(sg.dU, tr(h_in), -1.0).view({N, H, C, dk});
    }
    auto dU = sg.dU.view({N, H, C, dv});
    u.dQg = dQg;
    variable_list dx;
#if defined(DD_HAVE_CUDA)
    if (fused) {
      const auto solved = solve_backward_kernel(c, f.ki, Tm, dW, dU, sd["tf32_chunk"].toBool(), g_dv_in_solve);
      dx = backward_tail_kernel(c, f.ki, s, solved, dP_raw, dQg, u.dKd, u.ddecay, q, k, v, beta, g, q_rstd, k_rstd,
                                &norm_taken);
    }
#endif
    if (!fused) {
      const Prep& p = f.p;
      // Through the solve: W = Tm R_w, U = Tm R_u.
      auto dTm = prod(dW, tr(p.Rw));
      auto dTm_rows = rows(dTm);
      bmm_fp32_accumulate(dTm_rows, sg.dU, tr(rows(p.Ru)), 1.0, 1.0);
      auto Tmt = tr(Tm);
      auto dA_raw = prod(Tmt, prod(dTm, Tmt));
      u.dRw = prod(Tmt, dW);
      u.dRu = prod(Tmt, dU);

      // Through A = b_i S ⊙ D and P = QKᵀ ⊙ D into the products and the gates.
#if defined(DD_HAVE_CUDA)
      u.m = c.kernels ? masks_backward_kernel(c, dA_raw, dP_raw, f.G, p, s)
                      : masks_backward_reference(dA_raw, dP_raw, f.G, p, s);
#else
      u.m = masks_backward_reference(dA_raw, dP_raw, f.G, p, s);
#endif
      auto K = p.K();
      u.dQ_mm = prod(u.m.dPm, K);
      u.dK_mm = prod(u.m.dS_sym, K);
      auto dK_rows = rows(u.dK_mm);
      bmm_fp32_accumulate(dK_rows, tr(rows(u.m.dPm)), rows(p.Q()), 1.0, 1.0);
#if defined(DD_HAVE_CUDA)
      dx = c.kernels ? input_grads_kernel(c, p, u, f.ki, q, k, v, beta, g)
                     : input_grads_reference(c, p, u, q, k, v, beta, g);
#else
      dx = input_grads_reference(c, p, u, q, k, v, beta, g);
#endif
    }
    if (norm_at >= 0) {
      // The norm's own backward where the tail did not take it, as its op would run it; the norm's
      // inputs' dtypes either way.
      const auto &q_in = sv[norm_at + 2], &k_in = sv[norm_at + 3];
      dx[0] = norm_taken ? dx[0].to(q_in.scalar_type()) : l2_norm_input_grad(dx[0], q_in, q_rstd);
      dx[1] = norm_taken ? dx[1].to(k_in.scalar_type()) : l2_norm_input_grad(dx[1], k_in, k_rstd);
    }
    const torch::Tensor dh0 = sd["no_h0"].toBool() ? torch::Tensor() : sg.dh0;
    return {dx[0], dx[1], dx[2], dx[3], dx[4], dh0, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void gdr_use_kernels(bool on) {
  g_use_kernels = on;
  gdr_scan_use_kernel(on);
}

void gdr_use_fused_kernels(bool on) { g_use_fused_kernels = on; }

void gdr_bf16_output(bool on) { g_bf16_output = on; }
bool gdr_bf16_output() { return g_bf16_output; }

void gdr_bf16_front(bool on) { g_bf16_front = on; }

void gdr_save_front(bool on) { g_save_front = on; }

void gdr_l2norm_in_front(bool on) { g_l2norm_in_front = on; }
int64_t gdr_front_norms() { return g_front_norms; }

void gdr_dv_in_solve(bool on) { g_dv_in_solve = on; }

void gdr_bf16_chunk_grads(bool on) { g_bf16_chunk_grads = on; }

void gdr_bf16_scan_products(bool on) { g_bf16_scan_products = on; }

void gdr_bf16_tail_products(bool on) { g_bf16_tail_products = on; }

void gdr_bf16_solve_tiles(bool on) { g_bf16_solve_tiles = on; }

int64_t gdr_bf16_solve_tile_launches() { return g_bf16_solve_tile_launches.load(); }

int64_t gdr_front_recomputes() { return g_front_recomputes.load(); }

int64_t gdr_tail_norm_launches() { return g_tail_norm_launches.load(); }

void gdr_tf32_chunk_products(bool on) { g_tf32_chunk_products = on; }

GdrChunkCoreOutput gdr_chunk_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                                  const GdrChunkLayout& l, double scale, const torch::Tensor& o_targets,
                                  bool bf16_output_ok, const GdrQkNorm& qk_norm) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
              "gdr_chunk_core: expected q, k [B,T,H,dk] and v [B,T,H,dv], got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(beta.sizes() == q.sizes().slice(0, 3) && g.sizes() == beta.sizes(),
              "gdr_chunk_core: expected beta, g [B,T,H], got ", beta.sizes(), ", ", g.sizes());
  TORCH_CHECK(q.size(0) == l.B && q.size(1) == l.T && q.size(2) == l.scan.heads,
              "gdr_chunk_core: inputs ", q.sizes(), " do not match the chunk layout (B=", l.B, ", T=", l.T,
              ", H=", l.scan.heads, ")");
  TORCH_CHECK(h0.defined() && (h0.numel() == 0 || (h0.dim() == 3 && h0.size(0) == l.scan.n_docs * q.size(2) &&
                                  h0.size(1) == q.size(3) && h0.size(2) == v.size(3))),
              "gdr_chunk_core: expected h0 [n_docs·H, dk, dv] (or empty: zero states), got ",
              h0.defined() ? c10::str(h0.sizes()) : std::string("an undefined tensor"));
  // The core stays in fp32 under bf16 autocast (MODEL.md §0).
  AutocastOff fp32_core;
  auto outs =
      GdrChunkCoreFn::apply(q, k, v, beta, g, h0, l, scale, OutputTargets{o_targets, bf16_output_ok}, qk_norm);
  return {outs[0], outs[1]};
}

}  // namespace model

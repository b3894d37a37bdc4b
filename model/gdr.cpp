// Gated delta rule: the step-by-step reference and the chunkwise WY/UT form (MODEL.md §4).
//
// Layout decision for the chunked form: every chunk of every document is gathered into one list
// [N,H,C,·] ordered *step-major* — all documents' chunk 0, then all chunk 1, ... — with documents
// sorted by chunk count (descending). The documents still running at scan step m are then a prefix
// of the state tensor and their chunks a contiguous range of the list, so the sequential scan only
// narrows views (no per-step gather), dense and packed batches share one code path, and a finished
// document's final state is split off as the prefix shrinks. Padding chunks (q=k=v=β=g=0) are exact.
#include "model/gdr.h"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "model/gdr_scan.h"
#include "model/layers.h"
#include "model/tril_solve.h"

namespace model {
namespace {

torch::ScalarType compute_dtype(const torch::Tensor& q) {
  return q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::Tensor to_dtype(const torch::Tensor& x, torch::ScalarType dt) {
  return x.scalar_type() == dt ? x : x.to(dt);
}

// x as a contiguous tensor of dtype dt, in at most one copy (a cast and a relayout together).
torch::Tensor contiguous_as(const torch::Tensor& x, torch::ScalarType dt) {
  if (x.scalar_type() == dt) return x.contiguous();
  auto out = torch::empty(x.sizes(), x.options().dtype(dt));
  out.copy_(x);
  return out;
}

void check_inputs(const char* fn, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0,
                  const torch::Tensor& cu_seqlens) {
  TORCH_CHECK(q.dim() == 4, fn, ": expected q [B,T,H,dk], got ", q.sizes());
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3);
  TORCH_CHECK(k.sizes() == q.sizes(), fn, ": k ", k.sizes(), " must match q ", q.sizes());
  TORCH_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == T && v.size(2) == H, fn, ": expected v [B,T,H,dv], got ",
              v.sizes());
  TORCH_CHECK(beta.dim() == 3 && beta.size(0) == B && beta.size(1) == T && beta.size(2) == H, fn,
              ": expected beta [B,T,H], got ", beta.sizes());
  TORCH_CHECK(g.sizes() == beta.sizes(), fn, ": g ", g.sizes(), " must match beta ", beta.sizes());
  int64_t n_seq = B;
  if (cu_seqlens.defined()) {
    TORCH_CHECK(B == 1, fn, ": varlen expects one packed row, got B=", B);
    TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2 && cu_seqlens.device().is_cpu() &&
                    cu_seqlens.scalar_type() == torch::kInt64,
                fn, ": cu_seqlens must be int64 CPU [n_docs+1], got ", cu_seqlens.sizes());
    n_seq = cu_seqlens.size(0) - 1;
  }
  if (h0.defined()) {
    TORCH_CHECK(h0.dim() == 4 && h0.size(0) == n_seq && h0.size(1) == H && h0.size(2) == dk && h0.size(3) == v.size(3),
                fn, ": expected h0 [", n_seq, ",", H, ",", dk, ",", v.size(3), "], got ", h0.sizes());
  }
}

// One document (or a dense batch): q,k [B,T,H,dk], ..., h [B,H,dk,dv], all in the compute dtype.
// Returns o [B,T,H,dv] and replaces h with the final state.
torch::Tensor ref_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& beta, const torch::Tensor& g, double scale, torch::Tensor& h) {
  const int64_t T = q.size(1);
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    auto qt = q.select(1, t), kt = k.select(1, t), vt = v.select(1, t);  // [B,H,dk|dv]
    auto bt = beta.select(1, t), gt = g.select(1, t);                     // [B,H]
    h = gt.exp().unsqueeze(-1).unsqueeze(-1) * h;
    // e = v − hᵀk: the decayed memory's prediction error [B,H,dv].
    auto e = vt - torch::matmul(kt.unsqueeze(-2), h).squeeze(-2);
    h = h + kt.unsqueeze(-1) * (bt.unsqueeze(-1) * e).unsqueeze(-2);
    outs.push_back(scale * torch::matmul(qt.unsqueeze(-2), h).squeeze(-2));
  }
  return torch::stack(outs, 1);
}

// Where each chunk of the chunked form lives; see the file comment. Built on the CPU.
struct ChunkPlan {
  int64_t n_seq = 0;                // documents (dense: B rows)
  int64_t n_chunks = 0;             // N, the length of the chunk list
  std::vector<int64_t> step_count;  // documents still running at step m (a prefix of the sorted order)
  std::vector<int64_t> step_off;    // first chunk of step m in the list
  std::vector<int64_t> order;       // sorted position s -> document index (varlen only)
  torch::Tensor token_slot;         // [Ntok] int64: row of token t in the [N*C] list (varlen only)
};

ChunkPlan plan_dense(int64_t B, int64_t T, int64_t C) {
  ChunkPlan p;
  p.n_seq = B;
  const int64_t nc = (T + C - 1) / C;
  p.n_chunks = nc * B;
  for (int64_t m = 0; m < nc; ++m) {
    p.step_count.push_back(B);
    p.step_off.push_back(m * B);
  }
  return p;
}

ChunkPlan plan_varlen(const torch::Tensor& cu_seqlens, int64_t n_tok, int64_t C) {
  auto cu_t = cu_seqlens.contiguous();
  const int64_t* cu = cu_t.data_ptr<int64_t>();
  ChunkPlan p;
  p.n_seq = cu_t.size(0) - 1;
  TORCH_CHECK(cu[0] == 0 && cu[p.n_seq] == n_tok, "gdr: cu_seqlens must run from 0 to T=", n_tok);
  std::vector<int64_t> nch(static_cast<size_t>(p.n_seq));
  for (int64_t n = 0; n < p.n_seq; ++n) {
    const int64_t len = cu[n + 1] - cu[n];
    TORCH_CHECK(len > 0, "gdr: cu_seqlens must be strictly increasing (entry ", n + 1, ")");
    nch[n] = (len + C - 1) / C;
    p.n_chunks += nch[n];
  }
  p.order.resize(static_cast<size_t>(p.n_seq));
  std::iota(p.order.begin(), p.order.end(), 0);
  std::stable_sort(p.order.begin(), p.order.end(), [&](int64_t a, int64_t b) { return nch[a] > nch[b]; });
  const int64_t max_nc = nch[p.order[0]];
  int64_t off = 0;
  for (int64_t m = 0; m < max_nc; ++m) {
    int64_t cnt = 0;
    while (cnt < p.n_seq && nch[p.order[cnt]] > m) ++cnt;
    p.step_count.push_back(cnt);
    p.step_off.push_back(off);
    off += cnt;
  }
  p.token_slot = torch::empty({n_tok}, torch::kInt64);
  int64_t* slot = p.token_slot.data_ptr<int64_t>();
  for (int64_t s = 0; s < p.n_seq; ++s) {
    const int64_t n = p.order[s];
    for (int64_t t = cu[n]; t < cu[n + 1]; ++t) {
      const int64_t pos = t - cu[n], m = pos / C, i = pos % C;
      slot[t] = (p.step_off[m] + s) * C + i;
    }
  }
  return p;
}

// x [B,T,H,D] -> [N,H,C,D] contiguous in dtype `dt` (one copy, the cast folded in).
torch::Tensor gather_chunks(const torch::Tensor& x, const ChunkPlan& p, const torch::Tensor& slot, int64_t C,
                            torch::ScalarType dt) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  if (!slot.defined()) {
    const int64_t nc = p.n_chunks / B;
    auto xp = nc * C == T ? x : torch::constant_pad_nd(x, {0, 0, 0, 0, 0, nc * C - T});
    // [B,NC,C,H,D] -> [NC,B,H,C,D]: step-major, chunk n = m·B + b.
    auto xs = xp.view({B, nc, C, H, D}).permute({1, 0, 3, 2, 4});
    return contiguous_as(xs, dt).view({p.n_chunks, H, C, D});
  }
  auto rows = torch::zeros({p.n_chunks * C, H, D}, x.options().dtype(dt));
  rows = rows.index_copy(0, slot, to_dtype(x.select(0, 0), dt));
  return rows.view({p.n_chunks, C, H, D}).permute({0, 2, 1, 3}).contiguous();
}

// Inverse of gather_chunks for the output: o [N,H,C,D] -> [B,T,H,D].
torch::Tensor scatter_chunks(const torch::Tensor& o, const ChunkPlan& p, const torch::Tensor& slot, int64_t B,
                             int64_t T, int64_t C) {
  const int64_t H = o.size(1), D = o.size(3);
  if (!slot.defined()) {
    const int64_t nc = p.n_chunks / B;
    auto y = o.view({nc, B, H, C, D}).permute({1, 0, 3, 2, 4}).reshape({B, nc * C, H, D});
    return nc * C == T ? y : y.narrow(1, 0, T);
  }
  auto rows = o.permute({0, 2, 1, 3}).reshape({p.n_chunks * C, H, D});
  return rows.index_select(0, slot).unsqueeze(0);
}

}  // namespace

GdrOutput gdr_forward_ref(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& beta, const torch::Tensor& g, double scale, const torch::Tensor& h0,
                          const torch::Tensor& cu_seqlens) {
  check_inputs("gdr_forward_ref", q, k, v, beta, g, h0, cu_seqlens);
  // The core stays in fp32 under bf16 autocast (MODEL.md §0).
  AutocastOff fp32_core;
  const auto dt = compute_dtype(q);
  const int64_t B = q.size(0), H = q.size(2), dk = q.size(3), dv = v.size(3);
  auto qc = to_dtype(q, dt), kc = to_dtype(k, dt), vc = to_dtype(v, dt);
  auto bc = to_dtype(beta, dt), gc = to_dtype(g, dt);
  if (!cu_seqlens.defined()) {
    auto h = h0.defined() ? to_dtype(h0, dt) : torch::zeros({B, H, dk, dv}, qc.options());
    auto o = ref_rows(qc, kc, vc, bc, gc, scale, h);
    return {o, h};
  }
  auto cu_t = cu_seqlens.contiguous();
  const int64_t* cu = cu_t.data_ptr<int64_t>();
  const int64_t n_docs = cu_t.size(0) - 1;
  TORCH_CHECK(cu[0] == 0 && cu[n_docs] == q.size(1), "gdr_forward_ref: cu_seqlens must run from 0 to T=", q.size(1));
  std::vector<torch::Tensor> outs, states;
  for (int64_t n = 0; n < n_docs; ++n) {
    const int64_t s = cu[n], len = cu[n + 1] - cu[n];
    TORCH_CHECK(len > 0, "gdr_forward_ref: cu_seqlens must be strictly increasing");
    auto h = h0.defined() ? to_dtype(h0.narrow(0, n, 1), dt) : torch::zeros({1, H, dk, dv}, qc.options());
    outs.push_back(ref_rows(qc.narrow(1, s, len), kc.narrow(1, s, len), vc.narrow(1, s, len), bc.narrow(1, s, len),
                            gc.narrow(1, s, len), scale, h));
    states.push_back(h);
  }
  return {torch::cat(outs, 1), torch::cat(states, 0)};
}

GdrOutput gdr_forward_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& beta, const torch::Tensor& g, double scale,
                              const torch::Tensor& h0, const torch::Tensor& cu_seqlens, int64_t chunk) {
  check_inputs("gdr_forward_chunked", q, k, v, beta, g, h0, cu_seqlens);
  TORCH_CHECK(chunk > 0, "gdr_forward_chunked: chunk must be > 0, got ", chunk);
  // The core stays in fp32 under bf16 autocast (MODEL.md §0): no matmul here may be cast down.
  AutocastOff fp32_core;
  const auto dt = compute_dtype(q);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), dv = v.size(3), C = chunk;
  if (T == 0) {
    auto h = h0.defined() ? to_dtype(h0, dt) : torch::zeros({B, H, dk, dv}, q.options().dtype(dt));
    return {torch::zeros({B, 0, H, dv}, q.options().dtype(dt)), h};
  }
  const bool varlen = cu_seqlens.defined();
  ChunkPlan plan = varlen ? plan_varlen(cu_seqlens, T, C) : plan_dense(B, T, C);
  const torch::Tensor slot = varlen ? plan.token_slot.to(q.device()) : torch::Tensor();
  const int64_t N = plan.n_chunks;

  // Chunk list, [N,H,C,·] in the compute dtype.
  auto Q = gather_chunks(q, plan, slot, C, dt);
  auto K = gather_chunks(k, plan, slot, C, dt);
  auto V = gather_chunks(v, plan, slot, C, dt);
  auto b = gather_chunks(beta.unsqueeze(-1), plan, slot, C, dt).squeeze(-1);  // [N,H,C]
  auto gam = gather_chunks(g.unsqueeze(-1), plan, slot, C, dt).squeeze(-1).cumsum(-1);  // γ [N,H,C]

  // D[i,j] = exp(γ_i − γ_j) for i ≥ j, else 0. The upper triangle is masked to −inf before exp:
  // there γ_i − γ_j ≥ 0 and can overflow.
  auto causal = torch::ones({C, C}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril();
  auto Dm = (gam.unsqueeze(-1) - gam.unsqueeze(-2)).masked_fill(causal.logical_not(), -INFINITY).exp();  // [N,H,C,C]
  auto eg = gam.exp();                                                   // e^γ [N,H,C]
  auto glast = gam.narrow(-1, C - 1, 1);                                 // γ_{C−1} [N,H,1]
  auto Kd = (glast - gam).exp().unsqueeze(-1) * K;                       // e^{γ_{C−1}−γ} K [N,H,C,dk]
  auto decay = glast.exp();                                              // [N,H,1]

  // [Wc | Uc] = (I + A)^−1 [diag(b e^γ) K | diag(b) V] with A = strictly_lower(diag(b) (K Kᵀ) ⊙ D).
  // The solve reads only the strict lower triangle (unit diagonal), so A keeps its diagonal.
  auto A = b.unsqueeze(-1) * torch::matmul(K, K.transpose(-1, -2)) * Dm;
  auto rhs = torch::cat({(b * eg).unsqueeze(-1) * K, b.unsqueeze(-1) * V}, -1);  // [N,H,C,dk+dv]
  auto WU = unit_lower_solve(A, rhs);
  auto WU_parts = WU.split_with_sizes({dk, dv}, -1);
  auto Wc = WU_parts[0].reshape({N * H, C, dk});
  auto Uc = WU_parts[1].reshape({N * H, C, dv});
  torch::Tensor h0s;  // [n_docs·H, dk, dv] in sorted document order
  if (h0.defined()) {
    h0s = to_dtype(varlen ? h0.index_select(0, torch::tensor(plan.order, torch::kInt64).to(h0.device())) : h0, dt);
    h0s = h0s.reshape({plan.n_seq * H, dk, dv});
  } else {
    h0s = torch::zeros({plan.n_seq * H, dk, dv}, q.options().dtype(dt));
  }
  // The sequential scan over chunk steps (a CUDA kernel on the GPU; model/gdr_scan.h).
  const GdrScanPlan scan_plan{plan.n_seq, H, plan.step_count, plan.step_off};
  const auto scan = gdr_scan(Wc, Uc, Kd.view({N * H, C, dk}), decay.view({N * H}), h0s, scan_plan);
  auto h_final = scan.h_final.view({plan.n_seq, H, dk, dv});
  if (varlen) {
    std::vector<int64_t> inv(plan.order.size());
    for (size_t s = 0; s < plan.order.size(); ++s) inv[plan.order[s]] = static_cast<int64_t>(s);
    h_final = h_final.index_select(0, torch::tensor(inv, torch::kInt64).to(q.device()));
  }

  // O = scale · (diag(e^γ) Q h_in + ((Q Kᵀ) ⊙ D) Vn), batched over every chunk.
  auto P = (torch::matmul(Q, K.transpose(-1, -2)) * Dm).view({N * H, C, C});
  auto O = torch::baddbmm(torch::bmm(P, scan.v_new), (eg.unsqueeze(-1) * Q).view({N * H, C, dk}), scan.h_in, scale,
                          scale);
  return {scatter_chunks(O.view({N, H, C, dv}), plan, slot, B, T, C), h_final};
}

}  // namespace model

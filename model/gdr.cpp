// Gated delta rule: the step-by-step reference and the chunkwise WY/UT form (MODEL.md §4). The
// chunked form plans its chunk list (model/gdr_chunk_layout.h), runs the chunk core
// (model/gdr_chunk_core.h) and scatters the outputs back to the tokens.
#include "model/gdr.h"

#include <torch/torch.h>

#include <atomic>
#include <vector>

#include "model/gdr_chunk_core.h"
#include "model/gdr_plan_slots.h"
#include "model/gdr_scan.h"
#include "model/layers.h"

namespace model {
namespace {

std::atomic<bool> g_output_grad_row_map{true};

torch::ScalarType compute_dtype(const torch::Tensor& q) {
  return q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

torch::Tensor to_dtype(const torch::Tensor& x, torch::ScalarType dt) {
  return x.scalar_type() == dt ? x : x.to(dt);
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
                              const torch::Tensor& h0, const torch::Tensor& cu_seqlens, int64_t chunk,
                              bool tf32_scan, bool o_as_rows, GdrPlanSlots* slots, bool final_state,
                              const GdrQkNorm& qk_norm) {
  check_inputs("gdr_forward_chunked", q, k, v, beta, g, h0, cu_seqlens);
  TORCH_CHECK(chunk > 0, "gdr_forward_chunked: chunk must be > 0, got ", chunk);
  // The core stays in fp32 under bf16 autocast (MODEL.md §0): no matmul here may be cast down.
  AutocastOff fp32_core;
  // With the norm inside, the core computes in the dtype of the q it normalises to.
  const auto norm_dt = qk_norm.dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto dt = qk_norm.on ? norm_dt : compute_dtype(q);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), dv = v.size(3), C = chunk;
  if (T == 0) {
    auto h = h0.defined() ? to_dtype(h0, dt) : torch::zeros({B, H, dk, dv}, q.options().dtype(dt));
    return {torch::zeros({B, 0, H, dv}, q.options().dtype(dt)), h};
  }
  const bool varlen = cu_seqlens.defined();
  if (slots != nullptr) {
    TORCH_CHECK(varlen, "gdr_forward_chunked: a fixed chunk plan (slots) needs the packed row's cu_seqlens");
    TORCH_CHECK(T == slots->tokens(), "gdr_forward_chunked: the fixed chunk plan is for a packed row of ",
                slots->tokens(), " tokens, got one of ", T);
    TORCH_CHECK(!h0.defined(), "gdr_forward_chunked: a fixed chunk plan takes no initial state h0");
  }
  GdrChunkLayout layout = slots ? slots->layout(H, C) : gdr_chunk_layout(B, T, H, C, cu_seqlens, q.device());
  // The row map serves the output's gradient as chunk rows only (o_as_rows), and only where switched on.
  if (layout.row_map.defined() && (!o_as_rows || !g_output_grad_row_map || layout.row_map.device() != q.device()))
    layout.row_map = torch::Tensor();
  layout.scan.tf32_products = tf32_scan;
  layout.scan.bf16_states = tf32_scan && gdr_bf16_states();
  const int64_t n_seq = layout.scan.n_docs;
  torch::Tensor h0s;  // [n_docs·H, dk, dv] in sorted document order
  if (h0.defined()) {
    h0s = to_dtype(varlen ? h0.index_select(0, host_to_device(torch::tensor(layout.order, torch::kInt64), h0.device())) : h0, dt);
    h0s = h0s.reshape({n_seq * H, dk, dv});
  } else {
    h0s = torch::empty({0}, q.options().dtype(dt));  // zero states (gdr_chunk_core), with no tensor of them
  }
  // Token order (unless the caller reads the chunk rows in place): on a GPU the output product
  // writes each row where it belongs; elsewhere the rows are copied there after it.
  const bool direct_tokens = !o_as_rows && q.is_cuda();
  // The rows' one reader, the Gated DeltaNet's output norm, takes them in bf16 (written so on the 16-bit path).
  const auto core = gdr_chunk_core(q, k, v, beta, g, h0s, layout, scale,
                                   direct_tokens ? gdr_chunk_row_targets(layout, H, q.device()) : torch::Tensor(),
                                   /*bf16_output_ok=*/o_as_rows, qk_norm);
  torch::Tensor h_final;  // undefined unless the caller reads it
  if (final_state) {
    h_final = core.h_final.view({n_seq, H, dk, dv});
    if (layout.fixed) {
      h_final = h_final.index_select(0, layout.doc_slot);
    } else if (varlen) {
      std::vector<int64_t> inv(layout.order.size());
      for (size_t s = 0; s < layout.order.size(); ++s) inv[layout.order[s]] = static_cast<int64_t>(s);
      h_final = h_final.index_select(0, host_to_device(torch::tensor(inv, torch::kInt64), q.device()));
    }
  }
  if (o_as_rows) {
    GdrOutput out;
    out.h = h_final;
    out.o_rows = core.O.reshape({-1, dv});
    out.o_row = gdr_chunk_token_rows(layout, H, q.device());
    if (layout.row_map.defined()) {
      out.o_pad_rows_unread = true;  // the core's backward skips them (GdrChunkLayout::row_map)
    } else if (layout.pad_rows.defined() && layout.token_rows.defined() && layout.token_rows.size(1) == H &&
               layout.pad_rows.device() == q.device()) {
      out.o_pad_rows = layout.pad_rows;
    }
    return out;
  }
  return {direct_tokens ? core.O : gdr_scatter_chunks(core.O, layout), h_final};
}

namespace {
std::atomic<bool> g_output_as_rows{true};
std::atomic<bool> g_qk_in_activation_dtype{true};
std::atomic<bool> g_l2norm_in_core{true};
std::atomic<bool> g_gates_in_projection{true};
std::atomic<bool> g_output_wgrad_on_caller_stream{true};
}  // namespace

void gdn_gates_in_projection(bool on) { g_gates_in_projection = on; }
void gdn_output_weight_grad_on_caller_stream(bool on) { g_output_wgrad_on_caller_stream = on; }
namespace {
std::atomic<int> g_output_wgrad_beside_scan{0};
}
void gdn_output_weight_grad_beside_scan(int sms) { g_output_wgrad_beside_scan = sms; }
int gdn_output_weight_grad_beside_scan() { return g_output_wgrad_beside_scan; }
bool gdn_output_weight_grad_on_caller_stream() { return g_output_wgrad_on_caller_stream; }
bool gdn_gates_in_projection() { return g_gates_in_projection; }

void gdn_l2norm_in_core(bool on) { g_l2norm_in_core = on; }
bool gdn_l2norm_in_core() { return g_l2norm_in_core; }

void gdr_output_as_rows(bool on) { g_output_as_rows = on; }
bool gdr_output_as_rows() { return g_output_as_rows; }

void gdr_output_grad_row_map(bool on) { g_output_grad_row_map = on; }
bool gdr_output_grad_row_map() { return g_output_grad_row_map; }

void gdn_qk_in_activation_dtype(bool on) { g_qk_in_activation_dtype = on; }
bool gdn_qk_in_activation_dtype() { return g_qk_in_activation_dtype; }

bool gdr_scan_uses_tf32(const std::string& precision, torch::ScalarType matmul_dtype) {
  if (precision == "tf32") return true;
  if (precision == "fp32") return false;
  TORCH_CHECK(precision == "auto", "model.gdn_scan_precision: expected auto, tf32 or fp32, got \"", precision, "\"");
  return matmul_dtype == torch::kBFloat16 || matmul_dtype == torch::kHalf;
}

}  // namespace model

// MLA mixer (MODEL.md §5). The training path materialises per-head K/V from the latent and reuses
// causal_attention, so dense, varlen and V padding behave exactly as for the S mixer. Decoding
// caches only (c, RoPE'd k_r) and absorbs W_kvb into the query and output side instead of
// re-expanding K/V for every cached token: O(t·(rkv+dr)) per head and step.
#include "model/mla.h"

#include "model/fused_rope.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>

namespace model {
namespace {

std::atomic<bool> g_v_view{true};
std::atomic<bool> g_first_one_product{true};

torch::Tensor as_dtype(const torch::Tensor& t, torch::ScalarType s) {
  return t.scalar_type() == s ? t : t.to(s);
}

Linear linear(int64_t in, int64_t out) {
  return Linear(in, out);
}

}  // namespace

void mla_values_in_kv(bool on) { g_v_view = on; }
void mla_first_products_in_one_gemm(bool on) { g_first_one_product = on; }

MLAImpl::MLAImpl(const ModelConfig& c)
    : nh_(c.mla_heads), rq_(c.mla_q_rank), rkv_(c.mla_kv_rank), dn_(c.mla_nope_dim), dr_(c.mla_rope_dim),
      dva_(c.mla_v_dim), theta_(c.rope_theta),
      rope_(make_rope_tables(c.mla_rope_dim, std::max<int64_t>(c.max_seq_len, 1), c.rope_theta)) {
  // Buffers, so the tables follow the module to its device.
  rope_.cos = register_buffer("rope_cos", rope_.cos);
  rope_.sin = register_buffer("rope_sin", rope_.sin);
  const int64_t d = c.d, dqk = dn_ + dr_;
  if (rq_ > 0) {
    wq_a = register_module("wq_a", linear(d, rq_));
    q_norm = register_module("q_norm", RMSNorm(rq_, /*affine=*/true));
    wq_b = register_module("wq_b", linear(rq_, nh_ * dqk));
  } else {
    wq = register_module("wq", linear(d, nh_ * dqk));
  }
  wkv_a = register_module("wkv_a", linear(d, rkv_ + dr_));
  kv_norm = register_module("kv_norm", RMSNorm(rkv_, /*affine=*/true));
  wkv_b = register_module("wkv_b", linear(rkv_, nh_ * (dn_ + dva_)));
  wo = register_module("wo", linear(nh_ * dva_, d));
  reset_parameters(c.init_std, c.init_std / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.n_layers, 1))));
}

void MLAImpl::reset_parameters(double std0, double std_out) {
  torch::NoGradGuard no_grad;
  for (auto* lin : {&wq_a, &wq_b, &wq, &wkv_a, &wkv_b})
    if (!lin->is_empty()) (*lin)->weight.normal_(0.0, std0);
  wo->weight.normal_(0.0, std_out);
  if (!q_norm.is_empty()) q_norm->weight.fill_(1.0);
  kv_norm->weight.fill_(1.0);
}

void MLAImpl::ensure_rope(int64_t n) {
  const int64_t have = rope_.cos.size(0);
  if (n <= have) return;
  auto t = make_rope_tables(dr_, std::max(n, 2 * have), theta_);
  torch::NoGradGuard no_grad;
  // set_ swaps the storage of the registered buffers themselves.
  rope_.cos.set_(t.cos.to(rope_.cos.options()));
  rope_.sin.set_(t.sin.to(rope_.sin.options()));
}

torch::Tensor MLAImpl::project_q(const torch::Tensor& u) {
  return q_from_first(rq_ > 0 ? wq_a(u) : wq(u), u.size(0), u.size(1));
}

torch::Tensor MLAImpl::q_from_first(const torch::Tensor& first, int64_t B, int64_t T) {
  auto q = rq_ > 0 ? wq_b(q_norm(first)) : first;
  return q.view({B, T, nh_, dn_ + dr_});
}

MlaQkv MLAImpl::attention_inputs(const torch::Tensor& u, const Positions& p, bool pad_v) {
  TORCH_CHECK(u.dim() == 3 && u.size(2) == wkv_a->weight.size(1), "mla: expected u [B,T,",
              wkv_a->weight.size(1), "], got ", u.sizes());
  const int64_t B = u.size(0), T = u.size(1);
  // pos(t) <= t in dense and packed rows, so T positions always suffice.
  ensure_rope(T);
  // q's first product and the latent's read u in one op, so u's gradient comes out of their GEMMs
  // already summed. With q's low rank, one GEMM each way for both (the q latent, the kv latent and
  // the rope key as views of its columns): the two products' narrow GEMMs (384 and 288 columns at
  // hybrid base) ran at 320 – 420 TFLOP/s, and the input gradient's second one, adding into the
  // first's, at half that (docs/perf.md, issue 7, stop 89). The norms and the rope kernel read the
  // views at the product's row stride; the backward copies the three gradients into one matrix.
  std::vector<torch::Tensor> first, a;
  if (rq_ > 0 && g_first_one_product) {
    auto parts = linear_cat_columns(u, {{wq_a}, {wkv_a}}, {rq_, rkv_, dr_});
    first = {parts[0]};
    a = {parts[1], parts[2]};
  } else {
    first = linear_cat_groups(u, {{rq_ > 0 ? wq_a : wq}, {wkv_a}});
    // The rope key is cut off the latent by one split rather than two narrows: the backward is then
    // one concatenation of the parts' gradients, not a zero-filled full-size gradient per part.
    a = first[1].split_with_sizes({rkv_, dr_}, -1);  // [B,T,rkv], [B,T,dr]
  }
  auto kv = wkv_b(kv_norm(a[0])).view({B, T, nh_, dn_ + dva_});
  // Only cuDNN's kernels (dense or packed rows) take V unpadded: pad_v false is a request. The
  // packed one takes it as kv's own columns too (strided: no copy forward, and its gradient comes
  // back in rows of kv's width, which mla_qkv's backward fills in). The attention then keeps all of
  // kv for its backward, K's columns too (hybrid base: 0.09 GiB more at the peak, docs/perf.md
  // stop 61), where the copy kept only V.
  const bool v_view = !pad_v && p.varlen() && g_v_view && kv.is_contiguous() &&
                      packed_attention_takes_narrow_values(B, T, nh_, dn_ + dr_, dva_, kv.options(), scale(), p,
                                                           /*v_head_stride=*/dn_ + dva_);
  const auto takes_narrow = [&] {
    return p.varlen() ? packed_attention_takes_narrow_values(B, T, nh_, dn_ + dr_, dva_, kv.options(), scale(), p)
                      : dense_attention_takes_narrow_values(B, T, nh_, dn_ + dr_, dva_, kv.options(), scale());
  };
  const bool narrow = v_view || (!pad_v && takes_narrow());
  return mla_qkv(q_from_first(first[0], B, T), kv, a[1], dn_, p.pos, rope_, /*pad_v=*/!narrow, v_view);
}

MLAProjections MLAImpl::project(const torch::Tensor& u, const Positions& p) {
  auto qkv = attention_inputs(u, p);
  return {qkv.q.transpose(1, 2), qkv.k.transpose(1, 2), qkv.v.narrow(-1, 0, dva_).transpose(1, 2)};
}

double MLAImpl::scale() const { return 1.0 / std::sqrt(static_cast<double>(dn_ + dr_)); }

torch::Tensor MLAImpl::forward(const torch::Tensor& u, const Positions& p) {
  // V comes zero-padded to the q/k head width where the attention kernel needs it (flash): its
  // output's padding columns are zero and cut off (heads_to_tokens). cuDNN's kernels (dense and
  // packed rows) take V unpadded and leave their output in [B,T,nh,dva] memory, which is then only
  // viewed; the packed one takes Q, K and V as they are, so their gradients come back as mla_qkv's
  // backward takes them in place.
  auto qkv = attention_inputs(u, p, /*pad_v=*/false);
  return wo(causal_attention_token_rows(qkv.q, qkv.k, qkv.v, scale(), p, dva_));  // [B,T,nh·dva]
}

torch::Tensor MLAImpl::step(const torch::Tensor& u, MixerCache& cache) {
  TORCH_CHECK(u.dim() == 3 && u.size(1) == 1, "mla step: expected one token u [B,1,d], got ", u.sizes());
  const int64_t B = u.size(0);
  ensure_rope(cache.pos + 1);
  auto pos = torch::full({B, 1}, cache.pos, torch::TensorOptions().dtype(torch::kInt64).device(u.device()));
  auto q = project_q(u);                                                      // [B,1,nh,dqk]
  auto q_n = q.narrow(-1, 0, dn_).squeeze(1);                                 // [B,nh,dn]
  auto q_r = rope(q.narrow(-1, dn_, dr_), pos, rope_).squeeze(1);       // [B,nh,dr]
  auto a = wkv_a(u);                                                          // [B,1,rkv+dr]
  auto c = kv_norm(a.narrow(-1, 0, rkv_));                                    // [B,1,rkv]
  auto k_r = rope(a.narrow(-1, rkv_, dr_).unsqueeze(2), pos, rope_).squeeze(2);  // [B,1,dr]
  cache.latent = cache.latent.defined() ? torch::cat({cache.latent, c}, 1) : c;
  cache.k_rope = cache.k_rope.defined() ? torch::cat({cache.k_rope, k_r}, 1) : k_r;
  cache.pos += 1;

  const auto dt = cache.latent.scalar_type();
  auto w = as_dtype(wkv_b->weight, dt).view({nh_, dn_ + dva_, rkv_});
  auto w_uk = w.narrow(1, 0, dn_);    // [nh,dn,rkv]
  auto w_uv = w.narrow(1, dn_, dva_); // [nh,dva,rkv]
  // q̂_i = W_uk,iᵀ q_n,i, so q_n,i·k_n,i(j) = q̂_i·c_j.
  auto q_hat = torch::einsum("bhn,hnr->bhr", {as_dtype(q_n, dt), w_uk});        // [B,nh,rkv]
  auto scores = torch::matmul(q_hat, cache.latent.transpose(1, 2)) +
                torch::matmul(as_dtype(q_r, dt), cache.k_rope.transpose(1, 2));  // [B,nh,t]
  // Softmax statistics in fp32 (fp64 stays fp64); the newest token sees the whole cache.
  const auto stat = dt == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto prob = as_dtype(torch::softmax(as_dtype(scores, stat) * scale(), -1), dt);            // [B,nh,t]
  auto ctx = torch::matmul(prob, cache.latent);                                  // [B,nh,rkv]
  auto o = torch::einsum("bhr,hvr->bhv", {ctx, w_uv});                           // [B,nh,dva]
  return wo(o.reshape({B, 1, nh_ * dva_}));
}

}  // namespace model

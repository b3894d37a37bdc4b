// Shared layers: RMSNorm, RoPE, SwiGLU, GPT attention. Plain LibTorch ops; the fused CUDA
// kernels of the GPU-speed issue replace these on the fast path and are tested against them.
#include "model/layers.h"

#include <torch/torch.h>

#include <cmath>

namespace model {

RMSNormImpl::RMSNormImpl(int64_t dim, bool affine, double eps) : eps_(eps) {
  if (affine) weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor rms_norm_plain(const torch::Tensor& x, double eps) {
  auto xf = x.to(torch::kFloat32);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return y.to(x.scalar_type());
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // fp32 math whatever the input dtype (MODEL.md §0); convert only when x is not fp32 already.
  const bool is_f32 = x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kFloat64;
  auto xf = is_f32 ? x : x.to(torch::kFloat32);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  if (weight.defined()) y = y * weight.to(y.scalar_type());
  return is_f32 ? y : y.to(x.scalar_type());
}

RopeTables make_rope_tables(int64_t rotary_dim, int64_t max_pos, double theta) {
  TORCH_CHECK(rotary_dim % 2 == 0, "rope: rotary dim must be even, got ", rotary_dim);
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto j = torch::arange(rotary_dim / 2, opts);
  auto inv = torch::pow(theta, -2.0 * j / static_cast<double>(rotary_dim));  // [r/2]
  auto pos = torch::arange(max_pos, opts);                                   // [P]
  auto ang = torch::outer(pos, inv);                                        // [P, r/2]
  return {torch::cos(ang), torch::sin(ang)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& t) {
  TORCH_CHECK(x.dim() == 4, "rope: expected x [B,T,nh,r], got ", x.sizes());
  const int64_t half = x.size(-1) / 2;
  TORCH_CHECK(t.cos.size(1) == half, "rope: table has ", t.cos.size(1), " frequencies, x needs ", half);
  // Gather per-token angles [B,T,1,r/2] in the compute dtype (fp32 for fp32/bf16 inputs).
  auto compute = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  // No bounds check here: it would read a GPU scalar every call; index() itself rejects a
  // position beyond the table.
  auto cos = t.cos.index({pos}).to(compute).unsqueeze(2);
  auto sin = t.sin.index({pos}).to(compute).unsqueeze(2);
  auto xc = x.to(compute);
  auto x1 = xc.narrow(-1, 0, half);
  auto x2 = xc.narrow(-1, half, half);
  auto out = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  return out.to(x.scalar_type());
}

SwiGLUImpl::SwiGLUImpl(int64_t d, int64_t hidden) {
  gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(d, hidden).bias(false)));
  up = register_module("up", torch::nn::Linear(torch::nn::LinearOptions(d, hidden).bias(false)));
  down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(hidden, d).bias(false)));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  return down(torch::silu(gate(x)) * up(x));
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : nh_(c.attn_heads), nkv_(c.attn_kv_heads), dh_(c.attn_head_dim), qk_norm_(c.qk_norm),
      rope_(make_rope_tables(c.attn_head_dim, c.max_seq_len, c.rope_theta)) {
  // Buffers, so the tables follow the module to its device.
  rope_.cos = register_buffer("rope_cos", rope_.cos);
  rope_.sin = register_buffer("rope_sin", rope_.sin);
  auto lin = [&](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  wq = register_module("wq", lin(c.d, nh_ * dh_));
  wk = register_module("wk", lin(c.d, nkv_ * dh_));
  wv = register_module("wv", lin(c.d, nkv_ * dh_));
  wo = register_module("wo", lin(nh_ * dh_, c.d));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& u, const Positions& p) {
  const int64_t B = u.size(0), T = u.size(1);
  auto q = wq(u).view({B, T, nh_, dh_});
  auto k = wk(u).view({B, T, nkv_, dh_});
  auto v = wv(u).view({B, T, nkv_, dh_});
  q = apply_rope(q, p.pos, rope_);
  k = apply_rope(k, p.pos, rope_);
  if (qk_norm_) {
    q = rms_norm_plain(q);
    k = rms_norm_plain(k);
  }
  // SDPA wants [B, heads, T, dh].
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh_));
  auto o = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale, /*enable_gqa=*/nkv_ != nh_);
  return wo(o.transpose(1, 2).reshape({B, T, nh_ * dh_}));
}

}  // namespace model

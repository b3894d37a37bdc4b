// The building blocks every model shares (MODEL.md §0, §3): RMSNorm, RoPE tables, SwiGLU, and the
// GPT attention mixer (§6). Each takes the normed block input u [B,T,d] and the positions, so the
// hybrid's mixers (issue 3) plug into the same block. Norms, RoPE tables and softmax run in fp32.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "model/model_config.h"

namespace model {

// RMSNorm(x; w) = x / sqrt(mean(x²) + eps) ⊙ w, computed in fp32, returned in x's dtype.
// Without a weight (affine=false) w ≡ 1.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, bool affine, double eps = 1e-6);
  torch::Tensor forward(const torch::Tensor& x);  // x [..., dim]
  torch::Tensor weight;                           // [dim], undefined when not affine
 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Weight-free RMSNorm over the last dim (QK-norm, embed_norm).
torch::Tensor rms_norm_plain(const torch::Tensor& x, double eps = 1e-6);

// cos/sin tables of RoPE (rotate-half layout) for positions 0..max_pos-1, built in fp64.
struct RopeTables {
  torch::Tensor cos;  // [max_pos, r/2] fp64
  torch::Tensor sin;  // [max_pos, r/2] fp64
};
RopeTables make_rope_tables(int64_t rotary_dim, int64_t max_pos, double theta);
// Applies RoPE to x [B,T,nh,r] at positions pos [B,T] (int64): [x1 cos − x2 sin ; x2 cos + x1 sin].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables);

// SwiGLU(f): W_down( silu(x W_gateᵀ) ⊙ (x W_upᵀ) ).
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t d, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);  // x [..., d]
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(SwiGLU);

// Where each token sits: positions restart at 0 in every document of a packed row.
struct Positions {
  torch::Tensor pos;         // [B,T] int64
};

// The GPT attention mixer S (MODEL.md §6): GQA, RoPE over the full head dim, optional QK-norm
// after RoPE, causal SDPA with scale dh^-1/2.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& u, const Positions& p);  // u [B,T,d] -> [B,T,d]
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
 private:
  int64_t nh_, nkv_, dh_;
  bool qk_norm_;
  RopeTables rope_;
};
TORCH_MODULE(Attention);

}  // namespace model

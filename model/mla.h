// Multi-head Latent Attention, the hybrid's A mixer (MODEL.md §5): low-rank q (optional), a shared
// kv latent c [rkv] plus one RoPE key k_r [dr] per token, per-head no-RoPE keys and values expanded
// from c. Training expands K/V (model::mla_qkv, V zero-padded to dqk unless cuDNN's dense kernel
// takes it as it is) and calls causal_attention; decoding keeps only c and the RoPE'd k_r and runs
// the absorbed form, never expanding K/V.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include "model/linear.h"
#include "model/layers.h"
#include "model/model_config.h"

namespace model {

struct MlaQkv;  // model/fused_rope.h

// The per-head attention inputs the training path hands to causal_attention.
struct MLAProjections {
  torch::Tensor q;  // [B,nh,T,dqk] = [q_n | RoPE(q_r)]
  torch::Tensor k;  // [B,nh,T,dqk] = [k_n | RoPE(k_r)], k_r shared by all heads
  torch::Tensor v;  // [B,nh,T,dva]
};

// Whether MLA hands packed cuDNN attention V as its K|V projection's own columns (default on; see
// mla_qkv's v_view) or a copy of them (`bench train --mla-values copied`, to compare). Any thread.
void mla_values_in_kv(bool on);
// Whether MLA's first products (q's low-rank one and the kv latent's with the rope key) run as one
// GEMM each way (default on; model::linear_cat_columns) or one a group, the input's gradient summed
// in the second's GEMM (`bench train --mla-first-products per-group`, to compare). Any thread.
void mla_first_products_in_one_gemm(bool on);

class MLAImpl : public torch::nn::Module {
 public:
  // Parameters are drawn by reset_parameters(c.init_std, c.init_std / sqrt(2L)).
  explicit MLAImpl(const ModelConfig& c);

  // u [B,T,d] (normed block input) -> [B,T,d]. Dense or packed (B=1, p.cu_seqlens) batches.
  // Any thread that owns the module; fails (TORCH_CHECK) on a wrong width or a varlen B != 1.
  torch::Tensor forward(const torch::Tensor& u, const Positions& p);
  // Q, K, V of forward() before attention; exposed for tests and fused-kernel callers.
  MLAProjections project(const torch::Tensor& u, const Positions& p);
  // Q, K and V [B,T,nh,dn+dr] (V zero-padded to dn+dr where dva is narrower), through mla_qkv.
  // With pad_v false V stays [B,T,nh,dva] where attention takes it so (cuDNN's kernels;
  // dense_attention_takes_narrow_values, packed_attention_takes_narrow_values), and is padded
  // elsewhere.
  MlaQkv attention_inputs(const torch::Tensor& u, const Positions& p, bool pad_v = true);
  // One decoding step: u [B,1,d] at position cache.pos -> [B,1,d]. Appends c [B,1,rkv] to
  // cache.latent and RoPE'd k_r [B,1,dr] to cache.k_rope, then attends in the absorbed form
  // (q̂_i = W_uk,iᵀ q_n,i against the latents). Fails (TORCH_CHECK) unless u has one token.
  torch::Tensor step(const torch::Tensor& u, MixerCache& cache);
  // Linears N(0,std0), wo N(0,std_out), norm weights 1. Caller's thread; no failure mode.
  void reset_parameters(double std0, double std_out);

  int64_t heads() const { return nh_; }
  int64_t qk_dim() const { return dn_ + dr_; }
  double scale() const;  // the softmax scale, 1/sqrt(dn + dr)

  Linear wq_a{nullptr}, wq_b{nullptr};  // [rq,d], [nh·dqk,rq] when rq > 0
  Linear wq{nullptr};                    // [nh·dqk,d] when rq == 0
  Linear wkv_a{nullptr};                 // [rkv+dr,d]: rows [0,rkv) W^DKV, [rkv,rkv+dr) W^KR
  Linear wkv_b{nullptr};                 // [nh·(dn+dva),rkv]: per head [k rows | v rows]
  Linear wo{nullptr};                    // [d,nh·dva]
  RMSNorm q_norm{nullptr};                          // [rq] when rq > 0
  RMSNorm kv_norm{nullptr};                         // [rkv]

 private:
  torch::Tensor project_q(const torch::Tensor& u);  // u [B,T,d] -> [B,T,nh,dqk]
  // The rest of project_q from q's first product (wq_a(u) when q is compressed, else wq(u)).
  torch::Tensor q_from_first(const torch::Tensor& first, int64_t B, int64_t T);
  // Grows the RoPE tables (in place, so the registered buffers follow) to cover n positions.
  void ensure_rope(int64_t n);

  int64_t nh_, rq_, rkv_, dn_, dr_, dva_;
  double theta_;
  RopeTables rope_;  // [P, dr/2] fp64 buffers rope_cos / rope_sin
};
TORCH_MODULE(MLA);

}  // namespace model

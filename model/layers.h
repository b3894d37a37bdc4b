// The building blocks every model shares (MODEL.md §0, §3): RMSNorm, RoPE tables, SwiGLU, and the
// GPT attention mixer (§6). Each takes the normed block input u [B,T,d] and the positions, so the
// hybrid's mixers (issue 3) plug into the same block. Norms, RoPE tables and softmax run in fp32.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/fused_rmsnorm.h"
#include "model/linear.h"
#include "model/model_config.h"

namespace model {

// A CPU tensor copied to `device` without making the host wait for the GPU: staged through pinned
// memory and copied non-blocking (the caching host allocator keeps the pinned block until the copy
// has run). A pageable copy would drain the device's queue first — a host sync per call. Returns
// `host` itself for a CPU device. Any thread; not inside a CUDA graph capture.
torch::Tensor host_to_device(const torch::Tensor& host, const torch::Device& device);

// A device copy of small int32 tables (kernel plans) that repeat from step to step, made once per
// distinct content and device and then reused: dense batches repeat their plans every step, and a
// step captured as a CUDA graph may not copy from the host at all. Packed batches bring new ones,
// so the cache is emptied when it grows past a bound. Any thread.
torch::Tensor cached_device_ints(const std::vector<int32_t>& values, const torch::Device& device);

// Whether the current CUDA stream is being captured into a graph (false without CUDA): kernels
// launched now run only when the graph is replayed, so their results must not be cached for
// eager use before that.
bool cuda_stream_capturing();

// Turns autocast (CUDA and CPU) off for a scope and restores it after: the parts MODEL.md §0 keeps in fp32
// (the gated-delta-rule core, the MoE router) must not have their matmuls cast down to bf16.
class AutocastOff {
 public:
  AutocastOff();
  ~AutocastOff();
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  bool was_enabled_;
  bool was_enabled_cpu_;
};

// RMSNorm(x; w) = x / sqrt(mean(x²) + eps) ⊙ w, computed in fp32, returned in x's dtype.
// Without a weight (affine=false) w ≡ 1.
// The dtype the matmuls that read x run in: autocast's dtype when autocast is on for x's device
// (and x is not fp64), else x's own.
at::ScalarType matmul_dtype(const torch::Tensor& x);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, bool affine, double eps = 1e-6);
  torch::Tensor forward(const torch::Tensor& x);  // x [..., dim]
  // The pre-norm block's residual add fused into the norm: h = x + b (b undefined: h = x) and
  // y = RMSNorm(h). With for_matmul, y comes in matmul_dtype(x) — what autocast would cast it to
  // before the single matmul that reads it — else in h's dtype.
  AddNormOut add_forward(const torch::Tensor& x, const torch::Tensor& b, bool for_matmul);
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
  // MODEL.md §7: gate/up N(0, std0); down is a residual-output projection, N(0, std_out).
  void reset_parameters(double std0, double std_out);
  Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(SwiGLU);

class GdrPlanSlots;  // model/gdr_plan_slots.h

// Where each token sits. Dense batches: pos(t) = t in every row, cu_seqlens undefined. Packed
// (varlen) batches: B = 1, cu_seqlens marks the documents and positions restart at 0 in each.
struct Positions {
  torch::Tensor pos;         // [B,T] int64
  torch::Tensor cu_seqlens;  // [n_docs+1] int64 on the CPU, or undefined (dense)
  int64_t max_seqlen = 0;    // longest document (varlen only)
  // Built once per batch by packed_positions so the attention layers don't each redo them:
  torch::Tensor cu_seqlens_device;  // [n_docs+1] int32 on the batch's device (flash varlen)
  torch::Tensor doc_ids;            // [B*T] int64 on the batch's device (block-diagonal masks)
  // A CUDA-graph step's packed inputs (trainer/graph_inputs.h): the delta rule's chunk plans at fixed
  // device addresses, for the padded cu_seqlens above. Null elsewhere (each layer plans the batch).
  std::shared_ptr<GdrPlanSlots> gdr_slots;
  bool varlen() const { return cu_seqlens.defined(); }
};
// Positions of a dense [B,T] batch on `device`.
Positions dense_positions(int64_t B, int64_t T, torch::Device device);
// Positions of one packed row of N tokens split by cu_seqlens (int64, cu[0]=0, cu[-1]=N, strictly
// increasing; TORCH_CHECKed).
Positions packed_positions(const torch::Tensor& cu_seqlens, int64_t N, torch::Device device);
// Positions of a packed [B,T] batch: cu_seqlens runs over the flattened B*T tokens and must cut at
// every row boundary (no document piece crosses a row); positions restart in every piece.
Positions packed_positions(const torch::Tensor& cu_seqlens, int64_t B, int64_t T, torch::Device device);
// Document index of every token of a packed row: [N] int64.
torch::Tensor document_ids(const torch::Tensor& cu_seqlens, int64_t N, torch::Device device);

// Causal attention over q [B,Hq,T,Dqk], k [B,Hkv,T,Dqk], v [B,Hkv,T,Dv] with Hq a multiple of
// Hkv (GQA), softmax scale `scale`. Dense: causal SDPA. Varlen: no token attends across a
// document — on CUDA in bf16/fp16 through cuDNN's packed kernel (model/cudnn_attention.h) where it
// takes the shape, else the varlen flash kernel; elsewhere through SDPA with a block-diagonal
// causal mask (the reference). Dv may differ from Dqk; V is zero-padded to Dqk where the backend
// needs equal head dims and the padding is cut off again. Returns [B,Hq,T,Dv]; on cuDNN's kernels
// its memory is [B,T,Hq,Dv].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                               const Positions& p);
// Whether dense causal attention takes a V narrower than q and k as it is, unpadded: where
// LibTorch's SDPA picks cuDNN's kernel for it (on Hopper, bf16/fp16), which skips the padding's
// share of the P·V work and leaves its output in [B,T,H,Dv] memory (no copy to the output
// projection). Elsewhere V is zero-padded to Dqk, as the flash kernel needs it (SDPA would hand an
// unpadded V to the slower memory-efficient kernel instead). Asked of empty tensors of
// MLA's layout (q, k, v each [B,T,H,·] memory seen as [B,H,T,·]) with `opt`'s dtype and device, so a
// caller can decide before it writes V; causal_attention asks again of the tensors it is given.
bool dense_attention_takes_narrow_values(int64_t B, int64_t T, int64_t H, int64_t dqk, int64_t dv,
                                         const torch::TensorOptions& opt, double scale);
// The same for packed rows (p.varlen(), q/k/v of MLA's [B,T,H,·] layout, contiguous, or V's heads
// v_head_stride elements apart in its rows when that is not 0): where cuDNN's packed kernel takes
// this shape (model/cudnn_attention.h), which runs V at its own width. Elsewhere the flash varlen
// kernel needs V padded. May build (and cache) the cuDNN graphs.
bool packed_attention_takes_narrow_values(int64_t B, int64_t T, int64_t H, int64_t dqk, int64_t dv,
                                          const torch::TensorOptions& opt, double scale, const Positions& p,
                                          int64_t v_head_stride = 0);
// Process-wide switch (default on): off pads a narrower V for every backend, as before cuDNN took
// it (`bench train --mla-values padded`, to compare).
void attention_narrow_values(bool on);
// o [B,H,T,D] (an attention output, any strides) -> [B,T,H·dv] contiguous: each head's first dv
// columns, tokens first, for the output projection. One copy forward (as the narrow, transpose
// and reshape it replaces; a view of o when dv == D and o's memory is [B,T,H,D] already, so not
// to be modified in place); backward one zero-padded gradient [B,T,H,D] seen as [B,H,T,D], the
// layout the flash kernels' packed output has, so their backward reads it without a copy. Through
// autograd's narrow, transpose and reshape that was a zero fill, a slice copy and a clone.
torch::Tensor heads_to_tokens(const torch::Tensor& o, int64_t dv);
// causal_attention of tokens-major q, k and v [B,T,H,·] (any strides, unit-stride rows), returned
// as the output projection's input [B,T,H·dv]: each head's first dv columns (V may come
// zero-padded beyond them). Packed rows that cuDNN's kernel takes (with batch rows one token
// stride apart, so that the B·T tokens are rows of one stride) go to it as they are, so that
// each input's gradient comes back laid out in a storage like
// the input's (model/cudnn_attention.cpp's gradient_like): MLA's V, columns of its K|V projection's
// rows, gets its gradient in rows of that width, which MLA's backward fills in. Elsewhere
// causal_attention then heads_to_tokens.
torch::Tensor causal_attention_token_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          double scale, const Positions& p, int64_t dv);
// The varlen reference path of causal_attention (block-diagonal mask), whatever the device.
torch::Tensor causal_attention_masked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      double scale, const Positions& p);

// Decoding state of one mixer layer; each mixer fills the fields it needs. `pos` counts the
// tokens already consumed.
struct MixerCache {
  torch::Tensor conv_q, conv_k, conv_v;  // G: the last W-1 pre-conv inputs [B, W-1, channels]
  torch::Tensor state;                   // G: recurrent state h [B,H,dk,dv], fp32
  torch::Tensor k, v;                    // S: keys/values so far [B, nkv, t, dh]
  torch::Tensor latent, k_rope;          // A: c_kv [B, t, rkv] and RoPE'd k_r [B, t, dr]
  int64_t pos = 0;
};

// The GPT attention mixer S (MODEL.md §6): GQA, RoPE over the full head dim, optional QK-norm
// after RoPE, causal SDPA with scale dh^-1/2.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& u, const Positions& p);  // u [B,T,d] -> [B,T,d]
  // One decoding step: u [B,1,d] at position cache.pos -> [B,1,d]; appends to the cache.
  torch::Tensor step(const torch::Tensor& u, MixerCache& cache);
  // MODEL.md §7: wq/wk/wv N(0, std0), wo N(0, std_out).
  void reset_parameters(double std0, double std_out);
  Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
 private:
  int64_t nh_, nkv_, dh_;
  bool qk_norm_;
  RopeTables rope_;
};
TORCH_MODULE(Attention);

}  // namespace model

// RoPE through the CUDA kernel of kernels/rope.h, as an autograd function: one kernel forward and
// one backward (the inverse rotation), instead of the ~10 fp32 gather/cast/mul/cat kernels of
// apply_rope (model/layers.h), which stays the reference and the path on the CPU. The kernel reads
// q or k straight out of a fused qkv projection (a strided view) and writes a contiguous result.
#pragma once

#include <torch/torch.h>

#include "model/layers.h"

namespace model {

// Whether the kernel takes x [B,T,nh,r] at positions pos [B,T]: a GPU, fp32/bf16/fp16, a
// unit-stride last dim, the tables on x's device, and T within the tables (training batches:
// every position is below T).
bool fused_rope_applies(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables);

// apply_rope's result; through the kernel when fused_rope_applies, else apply_rope itself.
// Positions must be below T (true of dense_positions and packed_positions).
torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables);

// q, k and v from a fused q|k|v projection's output qkv [B, T, (nh + 2 nkv) · dh], with RoPE on q
// and k (as `rope`) and v a view of qkv. Through the kernel (one autograd node) when qkv is
// contiguous and fused_rope_applies: its backward writes the three gradients into one tensor of
// qkv's shape, RoPE's inverse straight into the q and k columns, where rotating dq and dk into
// their own tensors and concatenating the three (split's backward) moves the gradients twice.
// Else split, `rope` on q and k and a view of v (apply_rope on the CPU, the reference).
struct RopedQkv {
  torch::Tensor q, k, v;  // [B, T, nh, dh], [B, T, nkv, dh], [B, T, nkv, dh]
};
RopedQkv rope_qkv(const torch::Tensor& qkv, int64_t nh, int64_t nkv, int64_t dh, const torch::Tensor& pos,
                  const RopeTables& tables);

// rope_qkv with QK-norm: q and k as rope_qk_norm, v a view of qkv. Through one autograd node when
// qkv is contiguous and the kernels take q and k (fused_rope_applies, the head dim the norm kernel
// takes): its backward writes, in one launch, dq and dk through the norm's and RoPE's backward
// straight into the q and k columns of one gradient of qkv's shape and dv into its own, where
// split's backward would concatenate three gradients. Else split, rope_qk_norm on q and k and a view
// of v. The same kernels' arithmetic either way, so the same bits.
RopedQkv rope_norm_qkv(const torch::Tensor& qkv, int64_t nh, int64_t nkv, int64_t dh, const torch::Tensor& pos,
                       const RopeTables& tables, double eps = 1e-6);

// Whether rope_qkv and rope_norm_qkv take their one-node kernel paths where they apply (the
// default), or rotate (and normalise) q and k each and let split's backward concatenate the
// gradients: a process-wide switch for `bench train --rope-qkv split`.
void rope_qkv_fused(bool on);

// MLA's per-head attention inputs from its projections (model/mla.h), V zero-padded to the q/k
// head width dqk = dn + dr where dva < dqk and pad_v (the flash kernels need equal head widths;
// cuDNN's take V as it is, model::dense_attention_takes_narrow_values):
//   Q = [q_n | RoPE(q_r)],  K = [kv_n | RoPE(k_r)] (k_r shared by every head),  V = [kv_v | 0]
// from q [B,T,nh,dn+dr] (q_n | q_r per head), kv [B,T,nh,dn+dva] (kv_n | kv_v per head) and the
// shared rope key k_r [B,T,dr]; strided views are taken (unit-stride last dim). Q, K and V are
// contiguous [B,T,nh,·]. Through one kernel launch each way (kernels/rope.h's parts) when the
// kernel takes them: the backward writes dq and dkv in the projections' layouts and dk_r as the
// heads' sum, where split, cat, expand and pad move every gradient once more. Else exactly that
// reference: `rope`, cat, expand and pad.
// With v_view (not pad_v) V is kv's V columns themselves, a strided view, for an attention that
// takes V so (cuDNN's packed kernel, model::causal_attention_token_rows): no copy forward, and
// where its gradient comes back in rows of kv's width that nothing else holds (that kernel's
// backward lays it out so) the backward writes dkv's other columns into those rows. Likewise dq is
// Q's gradient with its rope columns turned back in place where that gradient is a contiguous
// buffer nothing else holds.
struct MlaQkv {
  torch::Tensor q, k, v;  // [B,T,nh,dn+dr] each (v: [B,T,nh,dva] when dva > dn + dr or !pad_v)
};
MlaQkv mla_qkv(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& k_r, int64_t dn,
               const torch::Tensor& pos, const RopeTables& tables, bool pad_v = true, bool v_view = false);
// How many of mla_qkv's backward gradients (dq, dkv) were taken in place so far (for tests). Any thread.
int64_t mla_gradients_in_place();
// Whether mla_qkv takes its kernel path where it applies (default on): `bench train --mla-qkv split`.
void mla_qkv_fused(bool on);

// RoPE then the weight-free QK-norm of every head (rms_norm_plain(apply_rope(x)), the GPT mixer
// with qk_norm): one kernel forward and one backward when fused_rope_applies and the head dim
// suits the kernel, else exactly that reference. The kernel normalises the fp32 rotation before
// rounding to x's dtype; the reference rounds in between.
torch::Tensor rope_qk_norm(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables,
                           double eps = 1e-6);

}  // namespace model

// Causal attention over packed documents through cuDNN's fused attention kernel, built with cuDNN's
// frontend graph API (header-only, from the nvidia-cudnn-frontend package) against the cuDNN that
// LibTorch loads. Each document piece is one batch entry of a [pieces, heads, S, D] view: its start
// in q, k, v and o is a ragged offset (cu_seqlens × the token stride), its length a padding mask,
// and a top-left causal band keeps every token to its own past. V may be narrower than q and k
// (MLA's 64 under 96), so nothing is padded. On an H200 this took 55% of FlashAttention-2's varlen
// kernel's time (forward + backward) at MLA's widths and 61% at GPT base's (docs/perf.md, stop 50).
//
// Graphs are built once per shape (tokens, pieces, S, heads, widths, strides, dtype, scale, handle)
// and cached; building one takes a fraction of a second, never during a CUDA graph capture (the
// trainer's eager warm-up steps, forward and backward, build them first). The piece count a graph takes is rounded up
// (packed_attention_pieces) and the spare pieces get length 0, so a run meets a handful of shapes,
// and a captured CUDA graph (whose cu_seqlens the trainer pads to a fixed length) meets one. The
// softmax statistics and the backward's fp32 accumulators are token-major, sized by N (times the
// inputs' token strides), not by pieces × S (which many short documents would make far larger).
// Needs cuDNN 9.19 or later (the version checked; older ones keep flash).
//
// Where the frontend's headers were not found at configure time, or cuDNN refuses a shape (fp32,
// an odd head width, an older GPU), nothing runs here: the caller keeps the flash kernel
// (model::causal_attention, model/layers.h). The reference is causal_attention_masked.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace model {

// Whether packed rows take cuDNN's kernel where it applies (default on), or FlashAttention-2's
// varlen kernel: a process-wide switch for `bench train --packed-attention flash`. Any thread.
void packed_attention_cudnn(bool on);
bool packed_attention_cudnn_enabled();
// Whether this build has the cuDNN frontend (DD_HAVE_CUDNN_FRONTEND). Any thread.
bool cudnn_frontend_built();

// The piece count a graph is built for: `pieces` rounded up to a multiple of 8, and above 64 to a
// multiple of 1/8 of the next power of two (fewer than that many empty pieces).
int64_t packed_attention_pieces(int64_t pieces);

// One attention call's geometry. q [N,H,dqk], k [N,Hkv,dqk], v [N,Hkv,dv] are token-major with a
// unit-stride head row; their token and head strides are free (a view into a fused projection).
// S bounds every piece's length. o and dO are contiguous, the gradients strided as their inputs.
struct PackedAttentionShape {
  int64_t tokens = 0;  // N
  int64_t pieces = 0, S = 0, H = 0, Hkv = 0, dqk = 0, dv = 0;
  int64_t q_token_stride = 0, q_head_stride = 0;
  int64_t k_token_stride = 0, k_head_stride = 0;
  int64_t v_token_stride = 0, v_head_stride = 0;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
  c10::Device device = c10::Device(c10::DeviceType::CUDA, 0);
  double scale = 1.0;
  bool backward = false;  // the backward graph is built (and must build) too
};

// Whether cuDNN takes this shape (both graphs when shape.backward): builds and caches them on the
// first ask. False with the switch above off, without the frontend, off the GPU, for fp32, where an
// offset would overflow int32, where cuDNN refuses, and during a CUDA graph capture for a shape not
// built before. Call it on the thread that will run the attention (its cuDNN handle); never throws.
bool cudnn_packed_attention_supported(const PackedAttentionShape& shape);

// Causal attention of q [N,H,dqk], k [N,Hkv,dqk], v [N,Hkv,dv] (layouts as above, bf16/fp16, on
// one GPU) over the pieces cut by cu_seqlens (int32 on the device, [pieces+1], cu[0] = 0,
// non-decreasing up to N; trailing repeats of N are empty pieces), S >= every piece's length.
// Returns o [N,H,dv] (differentiable in q, k and v), or an undefined tensor where
// cudnn_packed_attention_supported says no or a stride or address is not 16-byte aligned.
// q, k and v may also come as [B,T,·,·] (N = B·T tokens, rows one token stride apart across B);
// o is then [B,T,H,dv]. Each gradient comes back in a fresh storage laid out as its input's (the
// same strides and storage offset, in a storage as large, where that is at most four times the
// input's elements), the gradient tensor its storage's only holder: a caller whose input was
// columns of wider rows finds the gradient in the same columns of rows it may fill in.
// Inconsistent shapes, dtypes or devices fail a TORCH_CHECK naming the tensor.
at::Tensor cudnn_packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens, int64_t S, double scale);

// The two halves of cudnn_packed_attention, writing into tensors the caller gives (tests check
// that nothing outside the pieces' rows is read or written). cu_seqlens must already hold
// packed_attention_pieces(n) + 1 entries. o [N,H,dv], dq/dk/dv with q/k/v's sizes and strides, stats
// [N,H] fp32 (the softmax's log-sum-exp per token and head, the backward's input). Both throw
// c10::Error where the graph cannot be built or run.
void cudnn_packed_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& cu_seqlens, int64_t S, double scale, const at::Tensor& o,
                                    const at::Tensor& stats);
void cudnn_packed_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& o, const at::Tensor& dO, const at::Tensor& stats,
                                     const at::Tensor& cu_seqlens, int64_t S, double scale, const at::Tensor& dq,
                                     const at::Tensor& dk, const at::Tensor& dv);

}  // namespace model

// Backward of the chunked gated delta rule's solve (W = Tm R_w, U = Tm R_u, Tm = (I + A)⁻¹) as one
// kernel, one block per (chunk, head), in the notation of kernels/gdr_chunk.h (b = β, e = e^γ):
//   dRw = Tmᵀ dW,   dRu = Tmᵀ dU
//   dTm = dW R_wᵀ + dU R_uᵀ = (dW Kᵀ) diag(b e) + (dU Vᵀ) diag(b)
//   dA_raw = Tmᵀ dTm Tmᵀ
// and, on request, dRu's two uses in the tail: dv = b ⊙ dRu and Σ dRu ⊙ V (dβ's term).
// which model/gdr_chunk_core.cpp otherwise takes as six batched products (the reference, and the
// path for sizes this kernel does not take). R_w and R_u are rebuilt from k, v and the gates. Only
// dA_raw's strictly lower triangle is used (dA = −strict_lower(dA_raw)), and only that is computed:
// Tmᵀ is upper triangular, so the entries of dTm at and above its diagonal add nothing there.
// A chunk of no tokens (length 0: a fixed layout's spare chunk, model/gdr_plan_slots.h) is skipped,
// nothing written for it: only the tail of the same chunk reads these rows, and it skips it too.
#pragma once

#include <cstdint>

#include "kernels/gdr_chunk.h"

namespace kernels {

struct GdrChunkSolveBackwardArgs {
  const void* k = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* v = nullptr;      // [tokens, H, dv], dtype in_v; token t at v + t · v_token_stride
  int64_t v_token_stride = 0;   // elements between tokens of v (0: H · dv, contiguous)
  const float* beta = nullptr;  // [tokens, H]
  const float* g = nullptr;     // [tokens, H]
  DType in_qk = DType::F32, in_v = DType::F32;
  const float* Tm = nullptr;  // [N, H, C, C]
  const void* dW = nullptr;   // [N, H, C, dk], fp32 or bf16 (bf16_grads)
  const void* dU = nullptr;   // [N, H, C, dv], fp32 or bf16 (dU_bf16)
  float* dA_raw = nullptr;    // [N, H, C, C]: the strictly lower triangle is written, nothing else
  void* dRw = nullptr;        // [N, H, C, dk], fp32 or bf16 (bf16_grads)
  float* dRu = nullptr;       // [N, H, C, dv]; not written (may be null) when dv is set
  // When set: instead of dRu, what the backward's tail takes from it (kernels/gdr_chunk_backward_tail.h,
  // GdrChunkBackwardTailArgs::dbeta_v): v's gradient dv = b ⊙ dRu in the token layout
  // ([tokens, H, dv], dtype in_v, contiguous) and Σ_c dRu ⊙ V per chunk row into dbeta_v [N, H, C].
  // dRu itself (134 MB at bench gdr's shape) is then neither written nor read.
  void* dv = nullptr;
  float* dbeta_v = nullptr;
  // Every product in TF32, one mma each, where the fp32 operands are split in two TF32 parts
  // otherwise (16-bit training's mode; about 2⁻¹¹ relative per product); with 16-bit k and v of one
  // type only (kernels/gdr_chunk_stage.cuh), else ignored.
  bool tf32_products = false;
  // dW read and dRw written in bf16, and dU read in bf16 (the fused backward's 16-bit mode,
  // model::gdr_bf16_chunk_grads): half their bytes; dW and dU are widened exactly, dRw rounded once.
  bool bf16_grads = false;
  bool dU_bf16 = false;
  // dW, dU, K and V kept in shared memory as bf16 tiles, as they come, and dTm's products with them
  // (dW Kᵀ, dU Vᵀ: products of bf16 values, exact either way) as bf16 m16n8k16 mma: half the mma
  // of the TF32 form and 69 KiB a block where the fp32 tiles take 102, so three blocks share an SM
  // instead of two. Taken with tf32_products, bf16_grads, dU_bf16 and bf16 k and v; ignored
  // otherwise. Only the order of the fp32 sums changes.
  bool bf16_tiles = false;
};

// Whether a launch takes the bf16 tiles (GdrChunkSolveBackwardArgs::bf16_tiles and what it needs).
inline bool gdr_chunk_solve_backward_bf16_tiles(const GdrChunkSolveBackwardArgs& a) {
  return a.bf16_tiles && a.tf32_products && a.bf16_grads && a.dU_bf16 && a.in_qk == DType::BF16 &&
         a.in_v == DType::BF16;
}

#ifdef DD_HAVE_CUDA
// Whether hybrid base's heads (dk 96, dv 192) on the 16-bit path with dv taken run the instance
// whose copies overlap its products (on, the default), or the general bf16-tile instance (off, to
// measure it). dRw and dv are the same bits either way; dA_raw differs within the products'
// rounding (about 2⁻¹⁶ relative against TF32's 2⁻¹¹).
void gdr_chunk_solve_backward_overlap(bool on);

// Returns the cudaError_t of the launch (0 = success); cudaErrorInvalidValue for sizes
// gdr_chunk_fused_supports refuses, or for dv without dbeta_v, or neither dv nor dRu.
int gdr_chunk_solve_backward(const GdrChunkList& l, const GdrChunkSolveBackwardArgs& a, void* stream);
#endif

}  // namespace kernels

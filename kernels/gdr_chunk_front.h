// The forward's chunk-local front of the chunked gated delta rule as one kernel: everything the
// scan and the output products need, from the token-layout inputs, with no [N, H, ·] fp32
// intermediate in global memory. One block per (chunk, head) computes, in the notation of
// kernels/gdr_chunk.h (γ = cumsum(g), e = e^γ, κ = e^{γ_last − γ}, D[i,j] = e^{γ_i − γ_j} for i ≥ j):
//   Kd = diag(κ) K,  Qg = diag(e) Q,  decay = e^{γ_last}
//   P  = (Q Kᵀ) ⊙ D,  A = strict_lower(diag(β) (K Kᵀ) ⊙ D),  Tm = (I + A)⁻¹
//   W  = Tm diag(β e) K,  U = Tm diag(β) V
// This is what prep, the X Kᵀ product, the masks, the triangular inverse and the two products
// Tm R_w, Tm R_u compute as six launches (model/gdr_chunk_core.cpp), which stay as the reference.
// The backward's recompute takes the same kernel without the inverse, W and U. Products are
// split-TF32 mma.sync (kernels/gdr_chunk_mma.cuh), so the results keep close to fp32 accuracy
// (MODEL.md §0: the core runs in fp32). A chunk of no tokens (length 0: a fixed layout's spare
// chunk, model/gdr_plan_slots.h) gets what a chunk of zero rows gives, without the products: zero
// Kd, Qg, P, W and U, Tm = I, decay 1 (the scans read them for their dummy documents).
#pragma once

#include <cstdint>

#include "kernels/gdr_chunk.h"

namespace kernels {

struct GdrChunkFrontArgs {
  const void* q = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* k = nullptr;      // [tokens, H, dk], dtype in_qk
  const void* v = nullptr;      // [tokens, H, dv], dtype in_v; token t at v + t · v_token_stride
  int64_t v_token_stride = 0;   // elements between tokens of v (0: H · dv, contiguous)
  const float* beta = nullptr;  // [tokens, H]
  const float* g = nullptr;     // [tokens, H]
  DType in_qk = DType::F32, in_v = DType::F32;
  // W, U and Tm null together: only Kd, Qg, P and decay (the backward's recompute).
  // W, U, Kd, Qg and P are fp32, or with bf16_out their values rounded to bf16 (round to nearest
  // even, as a cast: the same arithmetic, rounded only as it is stored), half the bytes written
  // here and read by the scan and the products after it. Tm and decay stay fp32.
  void* W = nullptr;       // [N, H, C, dk]
  void* U = nullptr;       // [N, H, C, dv]
  void* Kd = nullptr;      // [N, H, C, dk]
  void* Qg = nullptr;      // [N, H, C, dk]
  void* P = nullptr;       // [N, H, C, C]
  float* Tm = nullptr;     // [N, H, C, C]
  float* decay = nullptr;  // [N, H]
  bool bf16_out = false;
  // Elements between tokens of q and of k (0: H · dk, contiguous): the layer's q and k are column
  // slices of its short conv's q|k|v rows.
  int64_t qk_token_stride = 0;
  // With q_norm (and k_norm, q_rstd, k_rstd: all four or none), q and k are L2Norm's inputs x
  // (MODEL.md §4) and the front takes the norm itself: it stages y = x · r, r = 1/sqrt(Σ x² +
  // norm_eps) per token and head over dk (fp32 math, y rounded to q's dtype, as kernels/l2_norm.cu's
  // pair kernel computes it), takes every product from y, and writes y to q_norm and k_norm ([tokens, H,
  // dk], contiguous, q's dtype) and r to q_rstd and k_rstd ([tokens, H]): what the backward reads,
  // with no pass of the norm's own before this kernel. Only where gdr_chunk_front_takes_norm says so.
  void* q_norm = nullptr;
  void* k_norm = nullptr;
  float* q_rstd = nullptr;
  float* k_rstd = nullptr;
  float norm_eps = 1e-6f;
};

#ifdef DD_HAVE_CUDA
// Returns the cudaError_t of the launch (0 = success); cudaErrorInvalidValue for sizes
// gdr_chunk_fused_supports refuses.
int gdr_chunk_front_forward(const GdrChunkList& l, const GdrChunkFrontArgs& a, void* stream);
// Whether the launch for l and a (the norm's outputs aside) may take L2Norm (q_norm above): 16-bit q
// and k on the 4-wide instances (the strides multiples of 4, the pointers aligned) at dk 64, 96 or
// 128, the sizes of the L2Norm pair kernel whose arithmetic the front repeats.
bool gdr_chunk_front_takes_norm(const GdrChunkList& l, const GdrChunkFrontArgs& a);
#endif

}  // namespace kernels

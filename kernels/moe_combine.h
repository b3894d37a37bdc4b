// The MoE layer's way back from expert order (model/moe_dispatch.h): each token's k expert rows
// gathered, weighted by the router's γ and summed, in one pass each way. As ATen ops this was a
// gather into a [N·k, d] tensor, a multiply and a sum over k, and three passes of that size again
// in the backward: at moe-1b's shape (N·k = 98k rows of 1024) about 1.5 GB of traffic per layer.
// The same forward with unit weights is the dispatch's backward (the k copies of a token summed).
// Raw pointers, no torch; the reference is the ATen formula in model/moe_dispatch.cpp.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

constexpr int64_t MOE_COMBINE_MAX_K = 16;

// Slots per token the kernels take (otherwise use the reference).
inline bool moe_combine_supports(int64_t k) { return k >= 1 && k <= MOE_COMBINE_MAX_K; }

#ifdef DD_HAVE_CUDA
// y [N, d] = add[t] + Σ_j w[t·k + j] · src[idx[t·k + j]] for src [R, d] (rows contiguous, dtype dt);
// w [N·k] fp32, or null for weights of 1; add [N, d] like y, or null for none (the MoE's shared
// expert, added here rather than in one more pass over y). Sums in fp32 and rounds once. Returns
// the cudaError_t of the launch (0 = success).
int moe_combine_forward(void* y, const void* src, const int64_t* idx, const float* w, const void* add, int64_t N,
                        int64_t k, int64_t d, DType dt, void* stream);

// The backward of the weighted forward, where idx is a permutation of [0, N·k) (every src row
// belongs to exactly one slot, so every dsrc row is written once, without atomics):
// dsrc[idx[t·k + j]] = w[t·k + j] · dy[t], and dw [N·k] fp32 = Σ_c dy[t, c] · src[idx[t·k + j], c].
int moe_combine_backward(void* dsrc, float* dw, const void* dy, const void* src, const int64_t* idx, const float* w,
                         int64_t N, int64_t k, int64_t d, DType dt, void* stream);
#endif

}  // namespace kernels

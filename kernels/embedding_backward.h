// The token embedding's weight gradient added into an existing fp32 gradient, deterministically:
// grad[v] += Σ dy[i] over the positions i holding token v, each token's rows summed in one fixed
// order (the stable sort of the tokens) by one block. ATen's dense embedding backward makes a
// fresh zero-filled [V, C] gradient (sort, per-segment sums, scatter) that autograd then adds to
// the gradient the tied LM head left there: three passes over the [V, C] fp32 matrix (154 MB at
// GPT-2's 50304 × 768) where this touches only the rows of tokens present. Raw pointers, no torch;
// the reference is ATen's embedding backward (model/fused_embedding.cpp).
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
// grad [V, C] fp32 (rows of absent tokens untouched); dy [N, C] fp32, contiguous; sorted [N]
// the tokens in ascending order and order [N] the position each came from (a stable sort), int64.
// Returns the cudaError_t of the launch (0 = success).
int embedding_backward_add(float* grad, const float* dy, const int64_t* sorted, const int64_t* order, int64_t N,
                           int64_t C, void* stream);
#endif

}  // namespace kernels

// Cross-entropy over rows of logits, and its gradient written over the logits in place — the inner
// piece of the chunked linear + cross-entropy (model/linear_cross_entropy.h). Raw pointers, no torch.
//
// For row n with target t (t < 0: ignored, loss 0, gradient 0):
//   lse = log Σ_j exp(z_j);  loss[n] = lse - z_t;  z_j ← (softmax_j - [j = t]) · grad_scale
// The CUDA launcher exists only in CUDA builds (DD_HAVE_CUDA); the reference is always there.
#pragma once

#include <cstdint>

namespace kernels {

// Plain loops with double accumulators: the ground truth for the kernel. logits [N,V] fp32.
void cross_entropy_grad_inplace_ref(float* logits, float* loss, const int64_t* targets, int64_t N, int64_t V,
                                    double grad_scale);

#ifdef DD_HAVE_CUDA
// Device pointers; one block per row, fp32 statistics. logits are bf16 (is_bf16) or fp32, row
// stride `ld` elements. Returns the cudaError_t of the launch (0 = success).
int cross_entropy_grad_inplace(void* logits, bool is_bf16, int64_t ld, float* loss, const int64_t* targets,
                               int64_t N, int64_t V, float grad_scale, void* stream);

// Whether bf16 rows that fit are staged in shared memory (the default) or kept in registers: a
// process-wide switch for `bench train --row-kernels baseline` and the tests.
void cross_entropy_staged_rows(bool on);
#endif

}  // namespace kernels

// The Gated DeltaNet's L2Norm of q and k per head (MODEL.md §4), y = x · r with r = 1/sqrt(Σ x² + eps)
// over a row of D, and its backward dx = r · (dy − y · Σ(y ⊙ dy)). x is read in place from the
// short conv's output, a column slice: row n (one head of one token) sits at
// (n / heads) · ld + (n % heads) · D; any of fp32, bf16, fp16. y and dy are [N, D] in fp32, or in
// x's dtype (16-bit training hands the delta rule 16-bit q and k); the sums are fp32 either way. r
// is fp32 [N], dx is written contiguous [N, D] in x's dtype. One warp per row (half a warp for 16-bit
// rows of 64, 96 or 128). Raw pointers, no
// torch; the reference is model/fused_l2norm.h's ATen formula.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct L2NormRows {
  int64_t N = 0, D = 0;
  int64_t heads = 1, ld = 0;  // rows per token and the token stride of x, in elements
};

#ifdef DD_HAVE_CUDA
// Each returns the cudaError_t of the launch (0 = success); D < 1 or heads < 1 is cudaErrorInvalidValue.
// y_dt other than F32 and x_dt is cudaErrorInvalidValue.
int l2_norm_forward(void* y, DType y_dt, float* rstd, const void* x, DType x_dt, const L2NormRows& rows, float eps,
                    void* stream);
int l2_norm_backward(void* dx, const void* dy, DType y_dt, const void* x, DType x_dt, const float* rstd,
                     const L2NormRows& rows, void* stream);

// Whether 16-bit rows of 64, 96 or 128 take the half-warp pair kernels (the default) or the
// warp-per-row ones: a process-wide switch for `bench train --row-kernels warp-l2` and the tests.
void l2_norm_pair_rows(bool on);
// Launches of the pair kernels so far in this process, either way (for the tests).
int64_t l2_norm_pair_launches();
#endif

}  // namespace kernels

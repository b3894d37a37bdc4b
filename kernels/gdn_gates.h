// The Gated DeltaNet's per-token gates (MODEL.md §4) from the H-wide projections a and b, one
// kernel each way instead of about twenty small ATen launches a layer:
//   beta = sigmoid(b) (× 2 with negative eigenvalues),  g = −exp(A_log) · softplus(a + dt_bias)
// with softplus(x) = x above 20, as torch's. ab is [N, 2H] rows in any of fp32, bf16, fp16 (a its
// first H columns, b the rest, rows ab_ld apart: 0 for 2H, or more where ab is a column slice of a
// wider projection's rows); beta and g are fp32 [N, H]; A_log and dt_bias fp32 [H].
// Backward: dab [N, 2H] in ab's dtype, and the per-head sums over the N rows
//   dA_log[h] = Σ dg ⊙ g,  d_dt_bias[h] = Σ da
// added into sums [2H] (fp32, zeroed by the caller: dA_log first, then d_dt_bias). dbeta or dg may
// be null (that gradient is zero). Math in fp32. Raw pointers, no torch; the reference is
// model/fused_gdn_gates.h's ATen formula.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

// The most heads the backward takes (its per-head sums sit in shared memory); callers with more
// use the reference.
constexpr int64_t kGdnGatesMaxHeads = 256;

#ifdef DD_HAVE_CUDA
// Each returns the cudaError_t of the launch (0 = success); H < 1, 0 < ab_ld < 2H (and, backward,
// H > kGdnGatesMaxHeads) is cudaErrorInvalidValue.
int gdn_gates_forward(float* beta, float* g, const void* ab, DType ab_dt, const float* A_log, const float* dt_bias,
                      int64_t N, int64_t H, bool neg_eig, void* stream, int64_t ab_ld = 0);
int gdn_gates_backward(void* dab, float* sums, const float* dbeta, const float* dg, const void* ab, DType ab_dt,
                       const float* A_log, const float* dt_bias, int64_t N, int64_t H, bool neg_eig, void* stream,
                       int64_t ab_ld = 0);
#endif

}  // namespace kernels

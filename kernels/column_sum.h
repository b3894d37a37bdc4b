// out[c] = Σ_r in[r, c] for a small fp32 matrix of per-block partial sums (an RMSNorm weight's
// gradient: ≤ 1056 rows of C; the gated RMSNorm's: 4096 rows of its D): one launch, no workspace, a
// fixed summation order. ATen's sum(0) over such a matrix took 11 µs and a semaphore memset per
// call, 25 calls per GPT-124M step.
// Raw pointers, no torch; the reference is at::sum(in, 0).
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
// in [R, C] fp32 contiguous, out [C] fp32, each sum multiplied by `scale` (1/N for a mean over N
// items). Returns the cudaError_t of the launch (0 = success).
int column_sum_f32(float* out, const float* in, int64_t R, int64_t C, void* stream, float scale = 1.f);
#endif

}  // namespace kernels

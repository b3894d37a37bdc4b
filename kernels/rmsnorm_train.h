// RMSNorm for training: forward that also returns each row's 1/rms, and the backward for x and w.
// Raw pointers, no torch; rows of x are contiguous (stride C). x, y, dy, dx are fp32 or bf16 (all
// the same dtype, `bf16`); w, rstd and the statistics are fp32.
//   y = x · r · w,   r = 1/sqrt(mean(x²) + eps)
//   dx = r · (g − x̂ · mean(g · x̂)),  g = dy · w,  x̂ = x · r;   dw = Σ_rows dy · x̂
// The reference (model/layers.cpp's ATen RMSNorm under autograd) is what the tests compare against.
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
// Returns the cudaError_t of the launch (0 = success). w may be nullptr (weight-free).
int rmsnorm_train_forward(void* y, float* rstd, const void* x, const float* w, bool bf16, int64_t N, int64_t C,
                          float eps, void* stream);

// Rows of dw's partial sums the backward writes: dw = dw_partial[0:rows].sum(0).
int rmsnorm_backward_partial_rows(int64_t N);

// dw_partial [rmsnorm_backward_partial_rows(N), C] fp32, unused (may be nullptr) when w is nullptr.
int rmsnorm_train_backward(void* dx, float* dw_partial, const void* dy, const void* x, const float* w,
                           const float* rstd, bool bf16, int64_t N, int64_t C, void* stream);
#endif

}  // namespace kernels

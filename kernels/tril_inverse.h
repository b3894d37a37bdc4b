// The inverse of a batch of unit lower-triangular matrices, T = (I + A)⁻¹ with A strictly lower
// (its diagonal and upper triangle are ignored). The chunked gated delta rule needs it for every
// chunk and head (model/gdr.cpp): batched cuBLAS trsm took 1.6 ms of the 6.4 ms forward at
// B=8, T=2048, H=16. Raw fp32 pointers, no torch; the reference is model/tril_solve.h's ATen path.
#pragma once

#include <cstdint>

namespace kernels {

// Sizes the kernel takes (otherwise use the reference).
inline bool unit_lower_inverse_supports(int64_t C) { return C >= 1 && C <= 64; }

#ifdef DD_HAVE_CUDA
// A, T: [R, C, C] contiguous fp32. Returns the cudaError_t of the launch (0 = success).
int unit_lower_inverse(float* T, const float* A, int64_t R, int64_t C, void* stream);
#endif

}  // namespace kernels

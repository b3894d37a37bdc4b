// A check of kernels/wgmma.cuh's products and staged layouts at the smallest size, for tests:
// D [64, 64] fp32 = A [64, 32] · B [32, 64], A row-major bf16, B given as B [32][64] row-major
// (`n_major`, staged N-major) or as Bᵀ [64][32] row-major (staged K-major). One warpgroup, two
// k-steps. Returns the cudaError_t of the launch (0 = success); the GPU must take sm_90a.
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
int wgmma_product_check(const uint16_t* A, const uint16_t* B, float* D, bool n_major, void* stream);
#endif

}  // namespace kernels

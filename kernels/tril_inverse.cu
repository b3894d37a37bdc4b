// Unit lower-triangular inverse by forward substitution, one matrix per block and one column of T
// per thread: column k solves (I + A) x = e_k, x_i = δ_ik − Σ_{j<i} A_ij x_j, with x in registers
// (the loops are unrolled over the compile-time width, so x is indexed statically). Every thread
// walks the same (i, j) sequence, so its reads of A's staged rows are warp-wide broadcasts, four
// at a time; the entries at and above the diagonal are staged as zeros, which lets the four-wide
// reads run past j = i − 1 and makes the input's own diagonal and upper triangle irrelevant.
// C²/2 FMAs per thread; stores of T are coalesced along a row. fp32 throughout.
#include <cuda_runtime.h>

#include "kernels/tril_inverse.h"

namespace kernels {

namespace {

constexpr int kWidth = 64;  // the largest C; rows of the staged copy are this wide

__global__ void __launch_bounds__(kWidth) unit_lower_inverse_kernel(float* T, const float* A, int C) {
  __shared__ __align__(16) float A_s[kWidth * kWidth];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C * C;
  for (int e = threadIdx.x; e < kWidth * kWidth; e += blockDim.x) {
    const int i = e / kWidth, j = e % kWidth;
    A_s[e] = (j < i && i < C) ? A[base + i * C + j] : 0.f;
  }
  __syncthreads();
  const int k = threadIdx.x;
  float x[kWidth];
#pragma unroll
  for (int i = 0; i < kWidth; ++i) x[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kWidth; ++i) {
    if (i < C) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < i; j += 4) {
        const float4 a = *reinterpret_cast<const float4*>(A_s + i * kWidth + j);
        acc += a.x * x[j] + a.y * x[j + 1] + a.z * x[j + 2] + a.w * x[j + 3];
      }
      x[i] = (i == k ? 1.f : 0.f) - acc;
    }
  }
  if (k < C) {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) {
      if (i < C) T[base + i * C + k] = x[i];
    }
  }
}

}  // namespace

int unit_lower_inverse(float* T, const float* A, int64_t R, int64_t C, void* stream) {
  if (!unit_lower_inverse_supports(C) || R < 1 || R > 2147483647LL) return static_cast<int>(cudaErrorInvalidValue);
  unit_lower_inverse_kernel<<<static_cast<unsigned>(R), kWidth, 0, static_cast<cudaStream_t>(stream)>>>(
      T, A, static_cast<int>(C));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

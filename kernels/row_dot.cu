// Per-row dot products (kernels/row_dot.h). One block of 256 threads per row: each thread sums its
// strided share of the row in fp32, then the block adds the 256 partial sums in a fixed tree.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/row_dot.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;

// kVec: the row length is a multiple of 4 and the rows are 16-byte aligned (float4 loads).
template <bool kVec>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(float* out, const float* a, const float* b, int64_t n) {
  const int64_t r = blockIdx.x;
  const float* ar = a + r * n;
  const float* br = b + r * n;
  float acc = 0.f;
  if (kVec) {
    const float4* a4 = reinterpret_cast<const float4*>(ar);
    const float4* b4 = reinterpret_cast<const float4*>(br);
    // Two loads in flight per iteration, so a thread does not wait out each memory round trip.
    int64_t i = threadIdx.x;
    float acc2 = 0.f;
    for (; i + kThreads < n / 4; i += 2 * kThreads) {
      const float4 x = __ldg(a4 + i), y = __ldg(b4 + i);
      const float4 x2 = __ldg(a4 + i + kThreads), y2 = __ldg(b4 + i + kThreads);
      acc += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
      acc2 += x2.x * y2.x + x2.y * y2.y + x2.z * y2.z + x2.w * y2.w;
    }
    if (i < n / 4) {
      const float4 x = __ldg(a4 + i), y = __ldg(b4 + i);
      acc += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
    }
    acc += acc2;
  } else {
    for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += __ldg(ar + i) * __ldg(br + i);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (threadIdx.x == 0) out[r] = s;
  }
}

}  // namespace

int row_dot_fp32(float* out, const float* a, const float* b, int64_t R, int64_t n, void* stream) {
  if (R < 0 || n < 0 || R > 0x7fffffff) return static_cast<int>(cudaErrorInvalidValue);
  if (R == 0) return 0;
  const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
  auto st = static_cast<cudaStream_t>(stream);
  if (vec) {
    row_dot_kernel<true><<<static_cast<unsigned>(R), kThreads, 0, st>>>(out, a, b, n);
  } else {
    row_dot_kernel<false><<<static_cast<unsigned>(R), kThreads, 0, st>>>(out, a, b, n);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

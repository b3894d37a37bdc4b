// Per-row dot products (kernels/row_dot.h). One block of 256 threads per row: each thread sums its
// strided share of the row in fp32, then the block adds the 256 partial sums in a fixed tree.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/row_dot.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

// Four consecutive elements of a as fp32 (index i counts groups of four).
__device__ __forceinline__ float4 load4(const float* a, int64_t i) { return __ldg(reinterpret_cast<const float4*>(a) + i); }
__device__ __forceinline__ float4 load4(const uint16_t* a, int64_t i) {
  const uint2 w = __ldg(reinterpret_cast<const uint2*>(a) + i);
  return make_float4(bf16_bits_to_float(w.x & 0xffffu), bf16_bits_to_float(w.x >> 16), bf16_bits_to_float(w.y & 0xffffu),
                     bf16_bits_to_float(w.y >> 16));
}
__device__ __forceinline__ float load1(const float* a, int64_t i) { return __ldg(a + i); }
__device__ __forceinline__ float load1(const uint16_t* a, int64_t i) { return bf16_bits_to_float(__ldg(a + i)); }

// TA, TB: a's and b's elements, float or bf16 bits (uint16_t). kVec: the row length is a multiple
// of 4 and the rows are aligned for 4-element loads.
template <typename TA, typename TB, bool kVec>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(float* out, const TA* a, const TB* b, int64_t n) {
  const int64_t r = blockIdx.x;
  const TA* ar = a + r * n;
  const TB* br = b + r * n;
  float acc = 0.f;
  if (kVec) {
    // Two loads in flight per iteration, so a thread does not wait out each memory round trip.
    int64_t i = threadIdx.x;
    float acc2 = 0.f;
    for (; i + kThreads < n / 4; i += 2 * kThreads) {
      const float4 x = load4(ar, i), y = load4(br, i);
      const float4 x2 = load4(ar, i + kThreads), y2 = load4(br, i + kThreads);
      acc += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
      acc2 += x2.x * y2.x + x2.y * y2.y + x2.z * y2.z + x2.w * y2.w;
    }
    if (i < n / 4) {
      const float4 x = load4(ar, i), y = load4(br, i);
      acc += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
    }
    acc += acc2;
  } else {
    for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += load1(ar, i) * load1(br, i);
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

namespace {
template <typename TA, typename TB>
int launch(float* out, const TA* a, const TB* b, int64_t R, int64_t n, void* stream) {
  if (R < 0 || n < 0 || R > 0x7fffffff) return static_cast<int>(cudaErrorInvalidValue);
  if (R == 0) return 0;
  const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(a) % (4 * sizeof(TA)) == 0 &&
                   reinterpret_cast<uintptr_t>(b) % (4 * sizeof(TB)) == 0;
  auto st = static_cast<cudaStream_t>(stream);
  if (vec) {
    row_dot_kernel<TA, TB, true><<<static_cast<unsigned>(R), kThreads, 0, st>>>(out, a, b, n);
  } else {
    row_dot_kernel<TA, TB, false><<<static_cast<unsigned>(R), kThreads, 0, st>>>(out, a, b, n);
  }
  return static_cast<int>(cudaGetLastError());
}
}  // namespace

int row_dot_fp32(float* out, const float* a, const float* b, int64_t R, int64_t n, void* stream) {
  return launch(out, a, b, R, n, stream);
}

int row_dot_bf16_fp32(float* out, const uint16_t* a, const float* b, int64_t R, int64_t n, void* stream) {
  return launch(out, a, b, R, n, stream);
}

int row_dot_bf16(float* out, const uint16_t* a, const uint16_t* b, int64_t R, int64_t n, void* stream) {
  return launch(out, a, b, R, n, stream);
}

}  // namespace kernels

// A block owns 32 columns; its 32 warps-worth of row groups each sum every 32nd row (eight loads in
// flight per thread), then one warp adds the 32 group sums in order. The partial matrices are a
// few MB, so the launch is bound by load latency, not bandwidth: the unrolled loads keep several
// rows in flight per thread (the gated RMSNorm's 4096 partial rows of 192: ATen's sum(0) took
// 14 µs a call).
#include <cuda_runtime.h>

#include "kernels/column_sum.h"

namespace kernels {

namespace {

constexpr int kCols = 32, kGroups = 32;

__global__ void __launch_bounds__(kCols * kGroups) column_sum_kernel(float* out, const float* in, int64_t R, int64_t C,
                                                                             float scale) {
  __shared__ float part[kGroups][kCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  const int g = threadIdx.y;
  constexpr int kUnroll = 8;
  float a[kUnroll] = {};
  if (col < C) {
    int64_t r = g;
    for (; r + (kUnroll - 1) * kGroups < R; r += kUnroll * kGroups) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) a[u] += in[(r + u * kGroups) * C + col];
    }
    for (; r < R; r += kGroups) a[0] += in[r * C + col];
  }
  part[g][threadIdx.x] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  __syncthreads();
  if (g == 0 && col < C) {
    float s = 0.f;
    for (int k = 0; k < kGroups; ++k) s += part[k][threadIdx.x];
    out[col] = s * scale;
  }
}

}  // namespace

int column_sum_f32(float* out, const float* in, int64_t R, int64_t C, void* stream, float scale) {
  if (C == 0) return 0;
  const unsigned grid = static_cast<unsigned>((C + kCols - 1) / kCols);
  column_sum_kernel<<<grid, dim3(kCols, kGroups), 0, static_cast<cudaStream_t>(stream)>>>(out, in, R, C, scale);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

// RMSNorm forward kernel: one block per row, a block-wide sum of squares in fp32, then the scale.
// Kept deliberately plain; the fused residual-add and backward variants come with the GPU-speed issue.
#include <cuda_runtime.h>

#include "kernels/rmsnorm.h"

namespace kernels {

// ---- CUDA kernels

__global__ void rmsnorm_forward_kernel(float* out, const float* x, const float* w, int64_t C, float eps) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  // Warp reduce, then across warps through shared memory.
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = (blockDim.x + 31) / 32;
    ss = lane < n_warps ? warp_sums[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) warp_sums[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(warp_sums[0] / static_cast<float>(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[row * C + c] = xr[c] * inv * (w ? w[c] : 1.f);
}

// ---- kernel launchers

int rmsnorm_forward(float* out, const float* x, const float* w, int64_t N, int64_t C, float eps, void* stream) {
  if (N == 0) return 0;
  const int threads = C >= 1024 ? 1024 : ((static_cast<int>(C) + 31) / 32) * 32;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(N), threads, 0, static_cast<cudaStream_t>(stream)>>>(out, x, w, C, eps);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

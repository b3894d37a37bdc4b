// RMSNorm forward/backward for training. One block handles a row at a time (forward: one row per
// block; backward: a grid-stride loop over rows so each block keeps its own dw partial sums in
// registers/shared memory and writes them once).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/rmsnorm_train.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBackwardBlocks = 264;  // 2 per SM on an H100

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = lane < n_warps ? scratch[lane] : 0.f;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <typename T>
__global__ void forward_kernel(T* y, float* rstd, const T* x, const float* w, int64_t C, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = load(xr, c);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* yr = y + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store(yr, c, load(xr, c) * r * (w ? w[c] : 1.f));
}

// Each block owns rows blockIdx.x, blockIdx.x + gridDim.x, ...; thread t accumulates dw for
// columns t, t + blockDim.x, ... in dw_partial[blockIdx.x] (written by this block only).
template <typename T>
__global__ void backward_kernel(T* dx, float* dw_partial, const T* dy, const T* x, const float* w, const float* rstd,
                                int64_t N, int64_t C) {
  __shared__ float scratch[32];
  float* dw_row = w ? dw_partial + static_cast<int64_t>(blockIdx.x) * C : nullptr;
  if (dw_row)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_row[c] = 0.f;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    const float r = rstd[row];
    float dot = 0.f;  // Σ g · x̂
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xh = load(xr, c) * r, g = load(dyr, c) * (w ? w[c] : 1.f);
      dot += g * xh;
      if (dw_row) dw_row[c] += load(dyr, c) * xh;
    }
    const float mean_dot = block_sum(dot, scratch) / static_cast<float>(C);
    T* dxr = dx + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xh = load(xr, c) * r, g = load(dyr, c) * (w ? w[c] : 1.f);
      store(dxr, c, r * (g - xh * mean_dot));
    }
  }
}

}  // namespace

int rmsnorm_train_forward(void* y, float* rstd, const void* x, const float* w, bool bf16, int64_t N, int64_t C,
                          float eps, void* stream) {
  if (N == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  if (bf16) {
    forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, st>>>(
        static_cast<__nv_bfloat16*>(y), rstd, static_cast<const __nv_bfloat16*>(x), w, C, eps);
  } else {
    forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, st>>>(static_cast<float*>(y), rstd,
                                                                  static_cast<const float*>(x), w, C, eps);
  }
  return static_cast<int>(cudaGetLastError());
}

int rmsnorm_backward_partial_rows(int64_t N) {
  return static_cast<int>(N < kMaxBackwardBlocks ? (N > 0 ? N : 1) : kMaxBackwardBlocks);
}

int rmsnorm_train_backward(void* dx, float* dw_partial, const void* dy, const void* x, const float* w,
                           const float* rstd, bool bf16, int64_t N, int64_t C, void* stream) {
  if (N == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(rmsnorm_backward_partial_rows(N));
  if (bf16) {
    backward_kernel<<<blocks, kThreads, 0, st>>>(static_cast<__nv_bfloat16*>(dx), dw_partial,
                                                 static_cast<const __nv_bfloat16*>(dy),
                                                 static_cast<const __nv_bfloat16*>(x), w, rstd, N, C);
  } else {
    backward_kernel<<<blocks, kThreads, 0, st>>>(static_cast<float*>(dx), dw_partial, static_cast<const float*>(dy),
                                                 static_cast<const float*>(x), w, rstd, N, C);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

// Cross-entropy + its gradient in place: one block per row. Pass 1 keeps an online (max, Σexp)
// pair per thread and merges them across the block; pass 2 overwrites the row with the gradient.
// The row is read twice and written once, in its own dtype; statistics stay fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cross_entropy.h"

namespace kernels {

namespace {

__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// Merges two (max, sum of exp(x - max)) pairs.
__device__ inline void merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

template <typename T>
__global__ void ce_grad_kernel(T* logits, int64_t ld, float* loss, const int64_t* targets, int64_t V,
                               float grad_scale) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * ld;
  const int64_t t = targets[row];
  if (t < 0) {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store(z + j, 0.f);
    if (threadIdx.x == 0) loss[row] = 0.f;
    return;
  }
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = load(z + j);
    if (x > m) {
      s = (m == -INFINITY ? 0.f : s * __expf(m - x)) + 1.f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
    merge(m, s, m2, s2);
  }
  __shared__ float wm[32], ws[32];
  __shared__ float lse_shared, zt_shared;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    wm[warp] = m;
    ws[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = (blockDim.x + 31) / 32;
    m = lane < n_warps ? wm[lane] : -INFINITY;
    s = lane < n_warps ? ws[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      lse_shared = m + logf(s);
      zt_shared = load(z + t);
    }
  }
  __syncthreads();
  const float lse = lse_shared;
  if (threadIdx.x == 0) loss[row] = lse - zt_shared;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = __expf(load(z + j) - lse);
    store(z + j, (p - (j == t ? 1.f : 0.f)) * grad_scale);
  }
}

}  // namespace

int cross_entropy_grad_inplace(void* logits, bool is_bf16, int64_t ld, float* loss, const int64_t* targets,
                               int64_t N, int64_t V, float grad_scale, void* stream) {
  if (N == 0) return 0;
  const int threads = 512;
  auto st = static_cast<cudaStream_t>(stream);
  if (is_bf16) {
    ce_grad_kernel<<<static_cast<unsigned>(N), threads, 0, st>>>(static_cast<__nv_bfloat16*>(logits), ld, loss,
                                                                 targets, V, grad_scale);
  } else {
    ce_grad_kernel<<<static_cast<unsigned>(N), threads, 0, st>>>(static_cast<float*>(logits), ld, loss, targets, V,
                                                                 grad_scale);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

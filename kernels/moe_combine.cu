// MoE weighted combine, forward and backward (kernels/moe_combine.h). One block per token: its
// threads walk the row in V-element vectors (16 bytes when the rows allow it), reading the token's k
// source rows; sums and dot products in fp32. The backward reduces its k dot products over the
// block once, after the row walk.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/moe_combine.h"

namespace kernels {

namespace {

constexpr int kThreads = 128;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    moe_combine_forward_kernel(T* y, const T* src, const int64_t* idx, const float* w, const T* add, int k,
                               int64_t d) {
  const int64_t t = blockIdx.x;
  __shared__ int64_t row_s[MOE_COMBINE_MAX_K];
  __shared__ float w_s[MOE_COMBINE_MAX_K];
  if (threadIdx.x < k) {
    row_s[threadIdx.x] = idx[t * k + threadIdx.x];
    w_s[threadIdx.x] = w ? w[t * k + threadIdx.x] : 1.f;
  }
  __syncthreads();
  for (int64_t c = int64_t{threadIdx.x} * V; c < d; c += int64_t{kThreads} * V) {
    float acc[V] = {};
    if (add) {
      Vec<T, V> a;
      a.load(add + t * d + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = a.get(i);
    }
    for (int j = 0; j < k; ++j) {
      Vec<T, V> x;
      x.load(src + row_s[j] * d + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += w_s[j] * x.get(i);
    }
    Vec<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.set(i, acc[i]);
    out.store(y + t * d + c);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) moe_combine_backward_kernel(T* dsrc, float* dw, const T* dy, const T* src,
                                                                        const int64_t* idx, const float* w, int k,
                                                                        int64_t d) {
  const int64_t t = blockIdx.x;
  __shared__ int64_t row_s[MOE_COMBINE_MAX_K];
  __shared__ float w_s[MOE_COMBINE_MAX_K];
  __shared__ float part_s[kThreads / 32][MOE_COMBINE_MAX_K];
  if (threadIdx.x < k) {
    row_s[threadIdx.x] = idx[t * k + threadIdx.x];
    w_s[threadIdx.x] = w[t * k + threadIdx.x];
  }
  __syncthreads();
  float dot[MOE_COMBINE_MAX_K] = {};
  for (int64_t c = int64_t{threadIdx.x} * V; c < d; c += int64_t{kThreads} * V) {
    Vec<T, V> g;
    g.load(dy + t * d + c);
#pragma unroll
    for (int j = 0; j < MOE_COMBINE_MAX_K; ++j) {
      if (j >= k) break;
      Vec<T, V> x, out;
      x.load(src + row_s[j] * d + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        dot[j] += g.get(i) * x.get(i);
        out.set(i, w_s[j] * g.get(i));
      }
      out.store(dsrc + row_s[j] * d + c);
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < MOE_COMBINE_MAX_K; ++j) {
    if (j >= k) break;
    const float s = warp_sum(dot[j]);
    if (lane == 0) part_s[warp][j] = s;
  }
  __syncthreads();
  if (threadIdx.x < k) {
    float s = 0.f;
    for (int i = 0; i < kThreads / 32; ++i) s += part_s[i][threadIdx.x];
    dw[t * k + threadIdx.x] = s;
  }
}

}  // namespace

int moe_combine_forward(void* y, const void* src, const int64_t* idx, const float* w, const void* add, int64_t N,
                        int64_t k, int64_t d, DType dt, void* stream) {
  if (!moe_combine_supports(k) || N < 1 || d < 1) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_width(dt, d, {y, src, add}, [&](auto tag, auto width) {
    using T = decltype(tag);
    moe_combine_forward_kernel<T, decltype(width)::value><<<static_cast<unsigned>(N), kThreads, 0, st>>>(
        static_cast<T*>(y), static_cast<const T*>(src), idx, w, static_cast<const T*>(add), static_cast<int>(k), d);
  });
  return static_cast<int>(cudaGetLastError());
}

int moe_combine_backward(void* dsrc, float* dw, const void* dy, const void* src, const int64_t* idx, const float* w,
                         int64_t N, int64_t k, int64_t d, DType dt, void* stream) {
  if (!moe_combine_supports(k) || N < 1 || d < 1 || w == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_width(dt, d, {dsrc, dy, src}, [&](auto tag, auto width) {
    using T = decltype(tag);
    moe_combine_backward_kernel<T, decltype(width)::value><<<static_cast<unsigned>(N), kThreads, 0, st>>>(
        static_cast<T*>(dsrc), dw, static_cast<const T*>(dy), static_cast<const T*>(src), idx, w,
        static_cast<int>(k), d);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

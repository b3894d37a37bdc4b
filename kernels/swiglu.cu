// SwiGLU: a flat grid-stride loop over the N·F outputs (the op is pure bandwidth; 64-bit index
// math because N·F passes 2^31 at large batch × width).
#include "kernels/elem.cuh"
#include "kernels/swiglu.h"

namespace kernels {

namespace {

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

template <typename T>
__global__ void swiglu_forward_kernel(T* h, const T* gu, int64_t N, int64_t F, int64_t ld) {
  const int64_t total = N * F;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / F, f = i % F;
    const float g = to_f32(gu[n * ld + f]), u = to_f32(gu[n * ld + F + f]);
    h[i] = from_f32<T>(g * sigmoid(g) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgu, const T* dh, const T* gu, int64_t N, int64_t F, int64_t ld) {
  const int64_t total = N * F;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / F, f = i % F;
    const float g = to_f32(gu[n * ld + f]), u = to_f32(gu[n * ld + F + f]);
    const float d = to_f32(dh[i]);
    const float s = sigmoid(g);
    dgu[n * 2 * F + f] = from_f32<T>(d * u * s * (1.f + g * (1.f - s)));
    dgu[n * 2 * F + F + f] = from_f32<T>(d * g * s);
  }
}

unsigned grid_for(int64_t total, int threads) {
  const int64_t blocks = (total + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 132 * 32 ? blocks : 132 * 32);
}

}  // namespace

int swiglu_forward(void* h, const void* gu, DType dt, int64_t N, int64_t F, int64_t ld, void* stream) {
  if (N * F == 0) return 0;
  constexpr int kThreads = 256;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<T><<<grid_for(N * F, kThreads), kThreads, 0, st>>>(static_cast<T*>(h),
                                                                             static_cast<const T*>(gu), N, F, ld);
  });
  return static_cast<int>(cudaGetLastError());
}

int swiglu_backward(void* dgu, const void* dh, const void* gu, DType dt, int64_t N, int64_t F, int64_t ld,
                    void* stream) {
  if (N * F == 0) return 0;
  constexpr int kThreads = 256;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<grid_for(N * F, kThreads), kThreads, 0, st>>>(
        static_cast<T*>(dgu), static_cast<const T*>(dh), static_cast<const T*>(gu), N, F, ld);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

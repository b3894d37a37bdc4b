// One thread per (token, head) element, grid-strided. The backward sums its per-head terms in
// shared memory (H ≤ kGdnGatesMaxHeads slots a block) and adds each block's sums into the output
// with one fp32 atomic per slot, so a layer's gates cost two launches and no ATen reductions.
#include <cuda_runtime.h>

#include "kernels/elem.cuh"
#include "kernels/gdn_gates.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
// torch's softplus with beta 1 and threshold 20.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }

template <typename T>
__global__ void __launch_bounds__(kThreads) gates_forward_kernel(float* beta, float* g, const T* ab,
                                                                 const float* A_log, const float* dt_bias, int64_t N,
                                                                 int64_t H, int64_t ld, float beta_scale) {
  const int64_t total = N * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t n = e / H, h = e % H;
    const float a = to_f32(ab[n * ld + h]), b = to_f32(ab[n * ld + H + h]);
    beta[e] = beta_scale * sigmoid_f(b);
    g[e] = -expf(A_log[h]) * softplus_f(a + dt_bias[h]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) gates_backward_kernel(T* dab, float* sums, const float* dbeta,
                                                                  const float* dg, const T* ab, const float* A_log,
                                                                  const float* dt_bias, int64_t N, int64_t H,
                                                                  int64_t ld, float beta_scale) {
  __shared__ float s_dA[kGdnGatesMaxHeads], s_ddt[kGdnGatesMaxHeads];
  for (int i = threadIdx.x; i < H; i += kThreads) s_dA[i] = s_ddt[i] = 0.f;
  __syncthreads();
  const int64_t total = N * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t n = e / H, h = e % H;
    const float a = to_f32(ab[n * ld + h]), b = to_f32(ab[n * ld + H + h]);
    const float sb = sigmoid_f(b);
    const float db = dbeta != nullptr ? dbeta[e] * beta_scale * sb * (1.f - sb) : 0.f;
    float da = 0.f;
    if (dg != nullptr) {
      const float x = a + dt_bias[h], A = expf(A_log[h]);
      // d softplus(x)/dx = sigmoid(x), exactly 1 above the threshold (as torch's backward).
      da = -A * dg[e] * (x > 20.f ? 1.f : sigmoid_f(x));
      atomicAdd(&s_dA[h], dg[e] * (-A * softplus_f(x)));  // ∂g/∂A_log = g
      atomicAdd(&s_ddt[h], da);
    }
    dab[n * 2 * H + h] = from_f32<T>(da);
    dab[n * 2 * H + H + h] = from_f32<T>(db);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < H; i += kThreads) {
    atomicAdd(&sums[i], s_dA[i]);
    atomicAdd(&sums[H + i], s_ddt[i]);
  }
}

unsigned blocks_for(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1024 ? (b > 0 ? b : 1) : 1024);
}

}  // namespace

int gdn_gates_forward(float* beta, float* g, const void* ab, DType ab_dt, const float* A_log, const float* dt_bias,
                      int64_t N, int64_t H, bool neg_eig, void* stream, int64_t ab_ld) {
  if (H < 1 || (ab_ld != 0 && ab_ld < 2 * H)) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0) return 0;
  dispatch_dtype(ab_dt, [&](auto tag) {
    using T = decltype(tag);
    gates_forward_kernel<<<blocks_for(N * H), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        beta, g, static_cast<const T*>(ab), A_log, dt_bias, N, H, ab_ld != 0 ? ab_ld : 2 * H, neg_eig ? 2.f : 1.f);
  });
  return static_cast<int>(cudaGetLastError());
}

int gdn_gates_backward(void* dab, float* sums, const float* dbeta, const float* dg, const void* ab, DType ab_dt,
                       const float* A_log, const float* dt_bias, int64_t N, int64_t H, bool neg_eig, void* stream,
                       int64_t ab_ld) {
  if (H < 1 || H > kGdnGatesMaxHeads || (ab_ld != 0 && ab_ld < 2 * H)) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0) return 0;
  dispatch_dtype(ab_dt, [&](auto tag) {
    using T = decltype(tag);
    gates_backward_kernel<<<blocks_for(N * H), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<T*>(dab), sums, dbeta, dg, static_cast<const T*>(ab), A_log, dt_bias, N, H,
        ab_ld != 0 ? ab_ld : 2 * H, neg_eig ? 2.f : 1.f);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

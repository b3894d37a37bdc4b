// SwiGLU: a flat grid-stride loop over the outputs, V consecutive ones per thread through 16-byte
// vector loads and stores when the rows allow it (the op is pure bandwidth; 64-bit index math
// because N·F passes 2^31 at large batch × width).
#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/swiglu.h"
#include "kernels/swiglu_math.cuh"

namespace kernels {

namespace {

// w: a weight per row, or null for none; w_index: null, or the entry of w each row reads.
template <typename T, int V>
__global__ void swiglu_forward_kernel(T* h, const T* gu, const float* w, const int64_t* w_index, int64_t N, int64_t F,
                                      int64_t ld) {
  const int64_t per_row = F / V, total = N * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, f = (i % per_row) * V;
    const float wn = w == nullptr ? 1.f : w[w_index != nullptr ? w_index[n] : n];
    Vec<T, V> g, u, o;
    g.load(gu + n * ld + f);
    u.load(gu + n * ld + F + f);
#pragma unroll
    for (int k = 0; k < V; ++k) o.set(k, wn * swiglu_value(g.get(k), u.get(k)));
    o.store(h + n * F + f);
  }
}

template <typename T, int V>
__global__ void swiglu_backward_kernel(T* dgu, const T* dh, const T* gu, int64_t N, int64_t F, int64_t ld) {
  const int64_t per_row = F / V, total = N * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, f = (i % per_row) * V;
    Vec<T, V> g, u, d, dg, du;
    g.load(gu + n * ld + f);
    u.load(gu + n * ld + F + f);
    d.load(dh + n * F + f);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float dgk, duk;
      swiglu_grads(g.get(k), u.get(k), d.get(k), dgk, duk);
      dg.set(k, dgk);
      du.set(k, duk);
    }
    dg.store(dgu + n * 2 * F + f);
    du.store(dgu + n * 2 * F + F + f);
  }
}

constexpr int kRowWarps = 8;  // the weighted backward: one warp a row

template <typename T, int V>
__global__ void __launch_bounds__(kRowWarps * 32)
    swiglu_weighted_backward_kernel(T* dgu, float* dw, const T* dh, const T* gu, const float* w,
                                    const int64_t* w_index, int64_t N, int64_t F, int64_t ld) {
  const int64_t n = int64_t{blockIdx.x} * kRowWarps + threadIdx.x / 32;
  if (n >= N) return;
  const int lane = threadIdx.x % 32;
  const int64_t wi = w_index != nullptr ? w_index[n] : n;
  const float wn = w[wi];
  float dot = 0.f;
  for (int64_t f = int64_t{lane} * V; f < F; f += 32 * V) {
    Vec<T, V> g, u, d, dg, du;
    g.load(gu + n * ld + f);
    u.load(gu + n * ld + F + f);
    d.load(dh + n * F + f);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      dot += d.get(k) * swiglu_value(g.get(k), u.get(k));
      float dgk, duk;
      swiglu_grads(g.get(k), u.get(k), wn * d.get(k), dgk, duk);
      dg.set(k, dgk);
      du.set(k, duk);
    }
    dg.store(dgu + n * 2 * F + f);
    du.store(dgu + n * 2 * F + F + f);
  }
  dot = warp_sum(dot);
  if (lane == 0) dw[wi] = dot;
}

unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 132 * 32 ? blocks : 132 * 32);
}

constexpr int kThreads = 256;

// Calls f(T{}, std::integral_constant<int, V>{}) with 16-byte vectors when F, ld and the pointers
// allow them, else V = 1.
template <typename F_>
void dispatch_vec(DType dt, int64_t F, int64_t ld, const void* a, const void* b, const void* c, F_&& f) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (F % V == 0 && ld % V == 0 && aligned_to(16, a, b, c)) f(tag, std::integral_constant<int, V>{});
    else f(tag, std::integral_constant<int, 1>{});
  });
}

}  // namespace

int swiglu_weighted_forward(void* h, const void* gu, const float* w, const int64_t* w_index, DType dt, int64_t N,
                            int64_t F, int64_t ld, void* stream) {
  if (N * F == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_vec(dt, F, ld, h, gu, nullptr, [&](auto tag, auto vec) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value;
    swiglu_forward_kernel<T, V><<<grid_for(N * F / V, kThreads), kThreads, 0, st>>>(
        static_cast<T*>(h), static_cast<const T*>(gu), w, w_index, N, F, ld);
  });
  return static_cast<int>(cudaGetLastError());
}

int swiglu_forward(void* h, const void* gu, DType dt, int64_t N, int64_t F, int64_t ld, void* stream) {
  return swiglu_weighted_forward(h, gu, nullptr, nullptr, dt, N, F, ld, stream);
}

int swiglu_weighted_backward(void* dgu, float* dw, const void* dh, const void* gu, const float* w,
                             const int64_t* w_index, DType dt, int64_t N, int64_t F, int64_t ld, void* stream) {
  if (N * F == 0) return 0;
  if (w == nullptr || dw == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_vec(dt, F, ld, dgu, dh, gu, [&](auto tag, auto vec) {
    using T = decltype(tag);
    swiglu_weighted_backward_kernel<T, decltype(vec)::value>
        <<<static_cast<unsigned>((N + kRowWarps - 1) / kRowWarps), kRowWarps * 32, 0, st>>>(
            static_cast<T*>(dgu), dw, static_cast<const T*>(dh), static_cast<const T*>(gu), w, w_index, N, F, ld);
  });
  return static_cast<int>(cudaGetLastError());
}

int swiglu_backward(void* dgu, const void* dh, const void* gu, DType dt, int64_t N, int64_t F, int64_t ld,
                    void* stream) {
  if (N * F == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_vec(dt, F, ld, dgu, dh, gu, [&](auto tag, auto vec) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value;
    swiglu_backward_kernel<T, V><<<grid_for(N * F / V, kThreads), kThreads, 0, st>>>(
        static_cast<T*>(dgu), static_cast<const T*>(dh), static_cast<const T*>(gu), N, F, ld);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

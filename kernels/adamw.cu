// Blocks walk chunks of kChunk elements; a block finds its tensor by a binary search over the
// launch's cumulative chunk counts, which sit in the kernel's parameter space (__grid_constant__,
// so indexing them does not copy the table to local memory). Chunk starts are multiples of kChunk,
// so a tensor whose arrays are 16-byte aligned (and whose shadow, if laid out in runs, has runs
// and a run stride of multiples of 4) takes 4-element vectors throughout; the rest (unaligned
// arrays, a tensor's last < 4 elements) go element by element.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/elem.cuh"
#include "kernels/multi_tensor_chunks.cuh"

namespace kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;

struct AdamWLaunch {
  static constexpr int kMax = kAdamWTensorsPerLaunch;
  AdamWTensor t[kMax];
  int chunk_end[kMax];  // cumulative chunk counts
  int count;
};

// Tensors whose gradients come from pieces: g[i] describes t[i]'s.
struct AdamWPiecesLaunch {
  static constexpr int kMax = kAdamWPiecesPerLaunch;
  AdamWTensor t[kMax];
  AdamWGradPieces g[kMax];
  int chunk_end[kMax];
  int count;
};

struct AdamWScalars {
  float beta1, beta2, eps;
};

__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, float lr_wd, float beta1,
                                              float beta2, float eps, float step_size, float bc2_sqrt) {
  p -= lr_wd * p;
  m = beta1 * m + (1.f - beta1) * g;
  v = beta2 * v + (1.f - beta2) * g * g;
  const float denom = sqrtf(v) / bc2_sqrt + eps;
  p -= step_size * m / denom;
}

// p's 4 (or 1) updated values into the shadow copy at element j, if the tensor has one.
template <int V>
__device__ __forceinline__ void store_shadow(const AdamWTensor& t, int64_t j, const float* p) {
  if (t.shadow == nullptr) return;
  if (t.shadow_block > 0) j = j / t.shadow_block * t.shadow_stride + j % t.shadow_block;
  if (t.shadow_dt == DType::BF16) store_run<V>(static_cast<__nv_bfloat16*>(t.shadow), j, p);
  else store_run<V>(static_cast<__half*>(t.shadow), j, p);
}

// V gradient values of element j .. j + V − 1 of a weight read from its pieces, summed in fp32 in
// piece order (the caller guarantees the V elements lie in one expert's block).
template <int V, typename T>
__device__ __forceinline__ void piece_sum(const AdamWGradPieces& g, int64_t j, float* out) {
  const int64_t e = j / g.block, at = j % g.block;
  const int64_t q0 = g.first != nullptr ? g.first[e] : e, qn = g.count != nullptr ? g.count[e] : 1;
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = 0.f;
  const T* src = static_cast<const T*>(g.src);
  for (int64_t q = q0; q < q0 + qn; ++q) {
    float part[V];
    load_run<V>(src, q * g.piece_stride + at, part);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] += part[i];
  }
}

// The gradient of elements j .. j + V − 1 of launch entry k, divided by the clip divisor.
template <int V>
__device__ __forceinline__ void grad_at(const AdamWLaunch& launch, int k, int64_t j, float divisor, float* out) {
  load_run<V>(launch.t[k].g, j, out);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] /= divisor;
}
template <int V>
__device__ __forceinline__ void grad_at(const AdamWPiecesLaunch& launch, int k, int64_t j, float divisor, float* out) {
  const AdamWGradPieces& g = launch.g[k];
  if (g.dt == DType::BF16) piece_sum<V, __nv_bfloat16>(g, j, out);
  else piece_sum<V, __half>(g, j, out);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] /= divisor;
}

// Whether entry k's gradient reads allow 4-element vectors from every multiple-of-4 element.
__device__ __forceinline__ bool grad_vectorizable(const AdamWLaunch& launch, int k) {
  return reinterpret_cast<uintptr_t>(launch.t[k].g) % 16 == 0;
}
__device__ __forceinline__ bool grad_vectorizable(const AdamWPiecesLaunch& launch, int k) {
  const AdamWGradPieces& g = launch.g[k];
  return reinterpret_cast<uintptr_t>(g.src) % 8 == 0 && g.block % 4 == 0 && g.piece_stride % 4 == 0;
}

template <typename Launch>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ Launch launch, const float* lr_ptr, const float* step_ptr,
                 const float* divisor_ptr, AdamWScalars s) {
  const BlockChunk c = chunk_of_block(launch.chunk_end, launch.count, kChunk);
  const int k = c.tensor;
  const AdamWTensor& t = launch.t[k];
  const int64_t first = c.first;
  const int64_t last = std::min(t.n, first + kChunk);
  const float lr = *lr_ptr, step = *step_ptr;
  const float divisor = divisor_ptr ? *divisor_ptr : 1.f;
  // Bias corrections in double, rounded once (as ATen's fused kernel forms them).
  const double bc1 = 1.0 - pow(static_cast<double>(s.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - pow(static_cast<double>(s.beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(sqrt(bc2));
  const float lr_wd = lr * t.weight_decay;
  const bool vec = (reinterpret_cast<uintptr_t>(t.p) | reinterpret_cast<uintptr_t>(t.m) |
                    reinterpret_cast<uintptr_t>(t.v)) % 16 == 0 &&
                   grad_vectorizable(launch, k) && reinterpret_cast<uintptr_t>(t.shadow) % 8 == 0 &&
                   t.shadow_block % 4 == 0 && t.shadow_stride % 4 == 0;
  int64_t i = first;
  if (vec) {
    const int64_t vec_end = first + (last - first) / 4 * 4;
    for (int64_t j = first + 4 * threadIdx.x; j < vec_end; j += 4 * kThreads) {
      float4 p = *reinterpret_cast<const float4*>(t.p + j);
      float g[4];
      grad_at<4>(launch, k, j, divisor, g);
      float4 m = *reinterpret_cast<const float4*>(t.m + j);
      float4 v = *reinterpret_cast<const float4*>(t.v + j);
      adamw_element(p.x, g[0], m.x, v.x, lr_wd, s.beta1, s.beta2, s.eps, step_size, bc2_sqrt);
      adamw_element(p.y, g[1], m.y, v.y, lr_wd, s.beta1, s.beta2, s.eps, step_size, bc2_sqrt);
      adamw_element(p.z, g[2], m.z, v.z, lr_wd, s.beta1, s.beta2, s.eps, step_size, bc2_sqrt);
      adamw_element(p.w, g[3], m.w, v.w, lr_wd, s.beta1, s.beta2, s.eps, step_size, bc2_sqrt);
      *reinterpret_cast<float4*>(t.p + j) = p;
      *reinterpret_cast<float4*>(t.m + j) = m;
      *reinterpret_cast<float4*>(t.v + j) = v;
      const float p4[4] = {p.x, p.y, p.z, p.w};
      store_shadow<4>(t, j, p4);
    }
    i = vec_end;
  }
  for (int64_t j = i + threadIdx.x; j < last; j += kThreads) {
    float p = t.p[j], m = t.m[j], v = t.v[j], g;
    grad_at<1>(launch, k, j, divisor, &g);
    adamw_element(p, g, m, v, lr_wd, s.beta1, s.beta2, s.eps, step_size, bc2_sqrt);
    t.p[j] = p;
    t.m[j] = m;
    t.v[j] = v;
    store_shadow<1>(t, j, &p);
  }
}

void set_grad(AdamWLaunch&, int, const AdamWGradPieces*, int) {}
void set_grad(AdamWPiecesLaunch& launch, int k, const AdamWGradPieces* grads, int i) { launch.g[k] = grads[i]; }

// Launches of up to Launch::kMax tensors each.
template <typename Launch>
int launch_all(const AdamWTensor* tensors, const AdamWGradPieces* grads, int count, const float* lr, const float* step,
               const float* grad_divisor, AdamWScalars s, cudaStream_t st) {
  for (int base = 0; base < count;) {
    Launch launch{};
    int chunks = 0;
    while (base < count && launch.count < Launch::kMax) {
      const int i = base++;
      const AdamWTensor& t = tensors[i];
      if (t.n == 0) continue;
      chunks += static_cast<int>((t.n + kChunk - 1) / kChunk);
      launch.t[launch.count] = t;
      set_grad(launch, launch.count, grads, i);
      launch.chunk_end[launch.count] = chunks;
      ++launch.count;
    }
    if (chunks == 0) continue;
    adamw_kernel<Launch><<<static_cast<unsigned>(chunks), kThreads, 0, st>>>(launch, lr, step, grad_divisor, s);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

}  // namespace

int adamw_update(const AdamWTensor* tensors, int count, const float* lr, const float* step, const float* grad_divisor,
                 float beta1, float beta2, float eps, void* stream) {
  return launch_all<AdamWLaunch>(tensors, nullptr, count, lr, step, grad_divisor, AdamWScalars{beta1, beta2, eps},
                                 static_cast<cudaStream_t>(stream));
}

int adamw_update_from_pieces(const AdamWTensor* tensors, const AdamWGradPieces* grads, int count, const float* lr,
                             const float* step, const float* grad_divisor, float beta1, float beta2, float eps,
                             void* stream) {
  for (int i = 0; i < count; ++i) {
    const AdamWGradPieces& g = grads[i];
    if ((g.dt != DType::BF16 && g.dt != DType::F16) || g.src == nullptr || g.block <= 0 || g.piece_stride < g.block ||
        (g.first == nullptr) != (g.count == nullptr) || (tensors[i].n > 0 && tensors[i].n % g.block != 0))
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return launch_all<AdamWPiecesLaunch>(tensors, grads, count, lr, step, grad_divisor, AdamWScalars{beta1, beta2, eps},
                                       static_cast<cudaStream_t>(stream));
}

}  // namespace kernels

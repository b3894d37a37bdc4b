// Blocks walk chunks of kChunk elements and find their tensor by a binary search over the launch's
// cumulative chunk counts in the kernel's parameter space (kernels/multi_tensor_chunks.cuh). Chunk starts
// are multiples of kChunk, so a tensor whose arrays are 16-byte aligned (8 for 16-bit ones) takes
// 4-element vectors throughout, its last < 4 elements one by one; others go one by one.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/elem.cuh"
#include "kernels/multi_tensor_chunks.cuh"
#include "kernels/muon_update.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;

template <typename Tensor>
struct Launch {
  Tensor t[kMuonTensorsPerLaunch];
  int chunk_end[kMuonTensorsPerLaunch];  // cumulative chunk counts
  int count;
};

// The tensor and element range of this block's chunk.
template <typename Tensor>
__device__ __forceinline__ int tensor_of_block(const Launch<Tensor>& launch, int64_t& first, int64_t& last) {
  const BlockChunk c = chunk_of_block(launch.chunk_end, launch.count, kChunk);
  first = c.first;
  last = std::min(launch.t[c.tensor].n, first + kChunk);
  return c.tensor;
}

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <typename X>
__global__ void __launch_bounds__(kThreads)
    momentum_kernel(const __grid_constant__ Launch<MuonMomentumTensor> launch, float mu, bool nesterov) {
  int64_t first, last;
  const MuonMomentumTensor& t = launch.t[tensor_of_block(launch, first, last)];
  X* x = static_cast<X*>(t.x);
  auto step = [&](float* m, const float* g, float* out, int V) {
    for (int i = 0; i < V; ++i) {
      m[i] = __fadd_rn(__fmul_rn(mu, m[i]), g[i]);  // not fused: ATen's mul_ then add_
      out[i] = nesterov ? g[i] + mu * m[i] : m[i];
    }
  };
  int64_t j0 = first;
  if (aligned(t.m, 16) && aligned(t.g, 16) && aligned(x, 4 * sizeof(X))) {
    const int64_t vec_end = first + (last - first) / 4 * 4;
    for (int64_t j = first + 4 * threadIdx.x; j < vec_end; j += 4 * kThreads) {
      float m[4], g[4], out[4];
      load_run<4>(t.m, j, m);
      load_run<4>(t.g, j, g);
      step(m, g, out, 4);
      store_run<4>(t.m, j, m);
      store_run<4>(x, j, out);
    }
    j0 = vec_end;
  }
  for (int64_t j = j0 + threadIdx.x; j < last; j += kThreads) {
    float m = t.m[j], g = t.g[j], out;
    step(&m, &g, &out, 1);
    t.m[j] = m;
    x[j] = from_f32<X>(out);
  }
}

template <typename U>
__global__ void __launch_bounds__(kThreads)
    apply_kernel(const __grid_constant__ Launch<MuonApplyTensor> launch, const float* lr_ptr, float weight_decay) {
  int64_t first, last;
  const MuonApplyTensor& t = launch.t[tensor_of_block(launch, first, last)];
  const U* u = static_cast<const U*>(t.u);
  const float lr = *lr_ptr;
  const float keep = 1.f - lr * weight_decay, step = -lr * t.scale;
  auto shadow_store = [&](int64_t j, const float* w, auto V) {
    if (t.shadow == nullptr) return;
    if (t.shadow_dt == DType::BF16) store_run<decltype(V)::value>(static_cast<__nv_bfloat16*>(t.shadow), j, w);
    else store_run<decltype(V)::value>(static_cast<__half*>(t.shadow), j, w);
  };
  int64_t j0 = first;
  if (aligned(t.w, 16) && aligned(u, 4 * sizeof(U)) && aligned(t.shadow, 8)) {
    const int64_t vec_end = first + (last - first) / 4 * 4;
    for (int64_t j = first + 4 * threadIdx.x; j < vec_end; j += 4 * kThreads) {
      float w[4], d[4];
      load_run<4>(t.w, j, w);
      load_run<4>(u, j, d);
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = w[i] * keep + step * d[i];
      store_run<4>(t.w, j, w);
      shadow_store(j, w, std::integral_constant<int, 4>{});
    }
    j0 = vec_end;
  }
  for (int64_t j = j0 + threadIdx.x; j < last; j += kThreads) {
    float w = t.w[j] * keep + step * to_f32(u[j]);
    t.w[j] = w;
    shadow_store(j, &w, std::integral_constant<int, 1>{});
  }
}

// Launches of up to kMuonTensorsPerLaunch tensors each.
template <typename Tensor, typename Fire>
int launch_all(const Tensor* tensors, int count, Fire&& fire) {
  for (int base = 0; base < count;) {
    Launch<Tensor> launch{};
    int chunks = 0;
    while (base < count && launch.count < kMuonTensorsPerLaunch) {
      const Tensor& t = tensors[base++];
      if (t.n == 0) continue;
      chunks += static_cast<int>((t.n + kChunk - 1) / kChunk);
      launch.t[launch.count] = t;
      launch.chunk_end[launch.count] = chunks;
      ++launch.count;
    }
    if (chunks == 0) continue;
    fire(launch, static_cast<unsigned>(chunks));
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  return 0;
}

}  // namespace

int muon_momentum(const MuonMomentumTensor* tensors, int count, float momentum, bool nesterov, DType x_dt,
                  void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  int rc = 0;
  dispatch_dtype(x_dt, [&](auto tag) {
    using X = decltype(tag);
    rc = launch_all(tensors, count, [&](const Launch<MuonMomentumTensor>& launch, unsigned chunks) {
      momentum_kernel<X><<<chunks, kThreads, 0, st>>>(launch, momentum, nesterov);
    });
  });
  return rc;
}

int muon_apply(const MuonApplyTensor* tensors, int count, const float* lr, float weight_decay, DType u_dt,
               void* stream) {
  for (int i = 0; i < count; ++i)
    if (tensors[i].shadow != nullptr && tensors[i].shadow_dt == DType::F32) return static_cast<int>(cudaErrorInvalidValue);
  const auto st = static_cast<cudaStream_t>(stream);
  int rc = 0;
  dispatch_dtype(u_dt, [&](auto tag) {
    using U = decltype(tag);
    rc = launch_all(tensors, count, [&](const Launch<MuonApplyTensor>& launch, unsigned chunks) {
      apply_kernel<U><<<chunks, kThreads, 0, st>>>(launch, lr, weight_decay);
    });
  });
  return rc;
}

}  // namespace kernels

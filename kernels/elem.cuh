// Device helpers shared by the training kernels: fp32 loads and stores of fp32/bf16/fp16
// elements, block-wide sums, and the dispatch from a runtime DType to a template parameter.
// Every kernel computes in fp32 whatever it reads or writes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels/dtype.h"

namespace kernels {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half(v); }

// The unsigned type of `bytes` bytes that one access moves (4, 8 or 16; void for other sizes).
template <int bytes>
using RawAccess = std::conditional_t<bytes == 16, uint4,
                                     std::conditional_t<bytes == 8, uint2, std::conditional_t<bytes == 4, uint32_t, void>>>;

// V consecutive elements moved as one aligned vector load/store (8 or 16 bytes): the caller
// guarantees the address is aligned to V * sizeof(T). Values are handed over as fp32. The bits
// move as one unsigned vector: a plain struct copy of 16-bit elements, whose type has its own
// assignment, was compiled as one 2-byte store per element (ncu, the delta rule's front: four
// STG.U16 for each four bf16 values of Kd and Qg, half of its global store sectors wasted).
template <typename T, int V>
struct alignas(V * sizeof(T)) Vec {
  T v[V];
  using Raw = RawAccess<static_cast<int>(V * sizeof(T))>;
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (std::is_void<Raw>::value) {
      *this = *reinterpret_cast<const Vec*>(p);
    } else {
      const Raw bits = *reinterpret_cast<const Raw*>(p);
      memcpy(this, &bits, sizeof(Raw));
    }
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (std::is_void<Raw>::value) {
      *reinterpret_cast<Vec*>(p) = *this;
    } else {
      Raw bits;
      memcpy(&bits, this, sizeof(Raw));
      *reinterpret_cast<Raw*>(p) = bits;
    }
  }
  __device__ __forceinline__ float get(int i) const { return to_f32(v[i]); }
  __device__ __forceinline__ void set(int i, float x) { v[i] = from_f32<T>(x); }
};

// The kVec values at row[c] .. row[c + kVec − 1] as fp32, one vector load when kVec > 1 (the caller
// guarantees row + c is aligned to kVec elements), and the store of kVec fp32 values there.
template <int kVec, typename T>
__device__ __forceinline__ void load_run(const T* row, int64_t c, float* out) {
  if constexpr (kVec == 1) {
    out[0] = to_f32(row[c]);
  } else {
    Vec<T, kVec> v;
    v.load(row + c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = v.get(e);
  }
}

template <int kVec, typename T>
__device__ __forceinline__ void store_run(T* row, int64_t c, const float* in) {
  if constexpr (kVec == 1) {
    row[c] = from_f32<T>(in[0]);
  } else {
    Vec<T, kVec> v;
#pragma unroll
    for (int e = 0; e < kVec; ++e) v.set(e, in[e]);
    v.store(row + c);
  }
}

// Whether every pointer is aligned to `bytes`.
inline bool aligned_to(int bytes, const void* a, const void* b = nullptr, const void* c = nullptr) {
  auto ok = [bytes](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return ok(a) && ok(b) && ok(c);
}

// Sum over the warp; every lane gets the result (all 32 lanes take part).
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over each half of the warp (shuffles at offsets 8 to 1); every lane gets its half's sum (all
// 32 lanes take part). The delta rule's front repeats the L2Norm pair kernel's sums with it, bit for
// bit (kernels/gdr_chunk_front.cu).
__device__ __forceinline__ float half_warp_sum(float v) {
  for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats; blockDim.x is a
// multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
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

// Max over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = lane < n_warps ? scratch[lane] : -INFINITY;
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Calls f(T{}) with T the CUDA element type of `dt`.
template <typename F>
inline void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    case DType::F16: f(__half{}); break;
  }
}

// Calls launch(T{}, width) with the element type of dt and the widest vector (16 bytes) that rows of
// d elements at every pointer in `rows` allow, else width 1.
template <typename Launch>
inline void dispatch_width(DType dt, int64_t d, std::initializer_list<const void*> rows, Launch&& launch) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    bool vec = d % V == 0;
    for (const void* p : rows) vec = vec && aligned_to(16, p);
    if (vec) launch(tag, std::integral_constant<int, V>{});
    else launch(tag, std::integral_constant<int, 1>{});
  });
}

}  // namespace kernels

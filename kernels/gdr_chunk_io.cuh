// Row I/O shared by the chunk kernels of the gated delta rule (gdr_chunk.cu, gdr_chunk_front.cu):
// fp32 loads and stores of VW consecutive elements of a token-layout or chunk-layout row, and the
// host-side choice of 4-element vectors and the dispatch over the two input dtypes.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/gdr_chunk.h"

namespace kernels {
namespace gdr_chunk_io {

// VW consecutive elements of a row: loaded as fp32 (zeros where !valid) and stored from fp32, as
// one 16-byte access for VW = 4 (fp32) or 8-byte (bf16/fp16) when the host found them aligned.
template <int VW, typename T>
__device__ __forceinline__ void load_n(float* out, const T* p, bool valid) {
  if (!valid) {
#pragma unroll
    for (int j = 0; j < VW; ++j) out[j] = 0.f;
  } else if constexpr (VW == 4) {
    Vec<T, 4> x;
    x.load(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = x.get(j);
  } else {
#pragma unroll
    for (int j = 0; j < VW; ++j) out[j] = to_f32(p[j]);
  }
}

template <int VW, typename T>
__device__ __forceinline__ void store_n(T* p, const float* in) {
  if constexpr (VW == 4) {
    Vec<T, 4> x;
#pragma unroll
    for (int j = 0; j < 4; ++j) x.set(j, in[j]);
    x.store(p);
  } else {
#pragma unroll
    for (int j = 0; j < VW; ++j) p[j] = from_f32<T>(in[j]);
  }
}

// Two consecutive elements of a row, the first at an even element offset, stored as T: one 4-byte
// store for a 16-bit T, one 8-byte store for fp32 (two 2-byte stores cost the backward's tail and
// the solve's backward their token-layout writes twice over).
template <typename T>
__device__ __forceinline__ void store2(T* p, float x, float y);
template <>
__device__ __forceinline__ void store2<float>(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
template <>
__device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
template <>
__device__ __forceinline__ void store2<__half>(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}

// A chunk-layout output written in fp32, or rounded to bf16 when `bf16` is set (the same values in
// half the bytes, for consumers that read bf16). The flag is the same for the whole launch, so the
// branch costs nothing but the test.
struct OutRows {
  void* base = nullptr;
  bool bf16 = false;

  // VW consecutive values at element offset `at`, as store_n stores them (one vector when VW = 4).
  template <int VW>
  __device__ __forceinline__ void store(int64_t at, const float* x) const {
    if (bf16) store_n<VW>(static_cast<__nv_bfloat16*>(base) + at, x);
    else store_n<VW>(static_cast<float*>(base) + at, x);
  }
  // Two consecutive values at `at` (even).
  __device__ __forceinline__ void store2(int64_t at, float x, float y) const {
    if (bf16) *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + at) = __floats2bfloat162_rn(x, y);
    else *reinterpret_cast<float2*>(static_cast<float*>(base) + at) = make_float2(x, y);
  }
  // Four zeros at `at` (a multiple of 4).
  __device__ __forceinline__ void zero4(int64_t at) const {
    if (bf16) *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + at) = make_uint2(0u, 0u);
    else *reinterpret_cast<float4*>(static_cast<float*>(base) + at) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
};

inline int elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Whether rows can move as 4-element vectors: dk, dv and v's token stride multiples of 4 and every
// pointer aligned.
inline bool vectorizable(const GdrChunkList& l, DType qk, DType v, std::initializer_list<const void*> f32,
                         std::initializer_list<const void*> qk_ptrs, std::initializer_list<const void*> v_ptrs,
                         int64_t v_token_stride) {
  if (l.dk % 4 != 0 || l.dv % 4 != 0 || v_token_stride % 4 != 0) return false;
  for (const void* p : f32)
    if (!aligned_to(16, p)) return false;
  for (const void* p : qk_ptrs)
    if (!aligned_to(4 * elem_bytes(qk), p)) return false;
  for (const void* p : v_ptrs)
    if (!aligned_to(4 * elem_bytes(v), p)) return false;
  return true;
}

// Calls launch(q|k element tag, v element tag, row width) for the two dtypes and 4-element rows
// when `vec`, else 1: the dispatch both token-layout kernels share.
template <class Launch>
void dispatch_two_dtypes(DType qk, DType v, bool vec, Launch&& launch) {
  dispatch_dtype(qk, [&](auto qk_tag) {
    dispatch_dtype(v, [&](auto v_tag) {
      if (vec) {
        launch(qk_tag, v_tag, std::integral_constant<int, 4>{});
      } else {
        launch(qk_tag, v_tag, std::integral_constant<int, 1>{});
      }
    });
  });
}

}  // namespace gdr_chunk_io
}  // namespace kernels

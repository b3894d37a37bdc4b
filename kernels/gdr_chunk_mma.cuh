// Split-TF32 tile products for the chunk kernels of the gated delta rule that keep a chunk's tiles
// in shared memory (gdr_chunk_front.cu, gdr_chunk_solve_backward.cu): fragment loads from padded
// shared rows in either orientation, the products of a 16-row strip with a compile-time number of
// 8-column tiles, and raw loads that let a batch of global reads be in flight together.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/tf32_mma.cuh"

namespace kernels {
namespace gdr_chunk_mma {

// An fp32 value as fragment parts. kExact: the value came from bf16 or fp16, so it is already a
// TF32 value and its remainder is zero: no split, and the products with that remainder are skipped.
template <bool kExact>
__device__ __forceinline__ void to_parts(float x, uint32_t& big, uint32_t& small) {
  if constexpr (kExact) {
    big = __float_as_uint(x);
    small = 0;
  } else {
    split_tf32(x, big, small);
  }
}

// A fragment of a row-major [m][k] tile: rows m0 + g, m0 + g + 8, columns k0 + t, k0 + t + 4, each
// element times col_scale[column] when col_scale is given.
template <bool kExact = false>
__device__ __forceinline__ FragA frag_a(const float* s, int pitch, int m0, int k0, int g, int t,
                                        const float* col_scale = nullptr) {
  float x[4] = {s[(m0 + g) * pitch + k0 + t], s[(m0 + g + 8) * pitch + k0 + t], s[(m0 + g) * pitch + k0 + t + 4],
                s[(m0 + g + 8) * pitch + k0 + t + 4]};
  if (col_scale != nullptr) {
    const float c0 = col_scale[k0 + t], c1 = col_scale[k0 + t + 4];
    x[0] *= c0;
    x[1] *= c0;
    x[2] *= c1;
    x[3] *= c1;
  }
  FragA f;
#pragma unroll
  for (int i = 0; i < 4; ++i) to_parts<kExact>(x[i], f.big[i], f.small[i]);
  return f;
}

// A fragment of A = Xᵀ, X a row-major [k][m] tile: A[m][k] = X[k][m].
template <bool kExact = false>
__device__ __forceinline__ FragA frag_at(const float* s, int pitch, int m0, int k0, int g, int t) {
  FragA f;
  to_parts<kExact>(s[(k0 + t) * pitch + m0 + g], f.big[0], f.small[0]);
  to_parts<kExact>(s[(k0 + t) * pitch + m0 + g + 8], f.big[1], f.small[1]);
  to_parts<kExact>(s[(k0 + t + 4) * pitch + m0 + g], f.big[2], f.small[2]);
  to_parts<kExact>(s[(k0 + t + 4) * pitch + m0 + g + 8], f.big[3], f.small[3]);
  return f;
}

// B fragment (rows k0 + t, k0 + t + 4; column n0 + g) of B = Xᵀ, X a row-major [n][k] tile.
template <bool kExact = false>
__device__ __forceinline__ FragB frag_b_nk(const float* s, int pitch, int k0, int n0, int g, int t) {
  FragB f;
  to_parts<kExact>(s[(n0 + g) * pitch + k0 + t], f.big[0], f.small[0]);
  to_parts<kExact>(s[(n0 + g) * pitch + k0 + t + 4], f.big[1], f.small[1]);
  return f;
}

// B fragment of a row-major [k][n] tile.
template <bool kExact = false>
__device__ __forceinline__ FragB frag_b_kn(const float* s, int pitch, int k0, int n0, int g, int t) {
  FragB f;
  to_parts<kExact>(s[(k0 + t) * pitch + n0 + g], f.big[0], f.small[0]);
  to_parts<kExact>(s[(k0 + t + 4) * pitch + n0 + g], f.big[1], f.small[1]);
  return f;
}

// The products of two fragments that are not known to be zero: mma3's three when both are split,
// two when one operand is exact, one when both are.
template <bool kAExact, bool kBExact>
__device__ __forceinline__ void mma_parts(float (&d_big)[4], float (&d_cross)[4], const FragA& a, const FragB& b) {
  mma_tf32(d_big, a.big, b.big);
  if constexpr (!kBExact) mma_tf32(d_cross, a.big, b.small);
  if constexpr (!kAExact) mma_tf32(d_cross, a.small, b.big);
}

// acc[n] += Σ_{k0 in [k_begin, k_end), step 8} a(k0) · b(k0, n) for the kTiles column tiles of one
// 16-row strip: a(k0) gives the strip's A fragment, b(k0, n) tile n's B fragment. The tile count is
// a compile-time constant and every tile is computed: a branch per tile would put each tile's
// loads, splits and products in a block of its own, one after another with no overlap (measured
// 2× slower). Callers point b at valid memory for tiles they do not store. kAExact, kBExact: the
// operand's values are TF32 already (from bf16 or fp16 inputs), see mma_parts.
template <int kTiles, bool kAExact = false, bool kBExact = false, class LoadA, class LoadB>
__device__ __forceinline__ void strip_accumulate(float (&acc)[kTiles][4], int k_begin, int k_end, LoadA a_at,
                                                 LoadB b_at) {
  float cross[kTiles][4];
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cross[n][i] = 0.f;
  }
  for (int k0 = k_begin; k0 < k_end; k0 += 8) {
    const FragA a = a_at(k0);
#pragma unroll
    for (int n = 0; n < kTiles; ++n) mma_parts<kAExact, kBExact>(acc[n], cross[n], a, b_at(k0, n));
  }
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] += cross[n][i];
  }
}

// strip_accumulate into zeros.
template <int kTiles, bool kAExact = false, bool kBExact = false, class LoadA, class LoadB>
__device__ __forceinline__ void strip_product(float (&acc)[kTiles][4], int k_begin, int k_end, LoadA a_at,
                                              LoadB b_at) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
  }
  strip_accumulate<kTiles, kAExact, kBExact>(acc, k_begin, k_end, a_at, b_at);
}

// Calls f(std::integral_constant<int, n>) for n in 1..5 (a tile count known only at run time).
template <class F>
__device__ __forceinline__ void with_tile_count(int n, F f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    default: break;
  }
}

// A VW-element piece as stored (not yet converted), zeros where !valid: a batch of these is
// loaded before any is used, so the loads are in flight together.
template <int VW, typename T>
__device__ __forceinline__ Vec<T, VW> load_raw(const T* p, bool valid) {
  Vec<T, VW> x;
  if (valid) {
    x.load(p);
  } else {
#pragma unroll
    for (int j = 0; j < VW; ++j) x.set(j, 0.f);
  }
  return x;
}

// Writes a strip's kTiles accumulator tiles to a row-major [·][pitch] array at (m0, c0), scaled.
template <int kTiles>
__device__ __forceinline__ void store_strip(float* dst, int64_t pitch, int m0, int c0, const float (&acc)[kTiles][4],
                                            float scale, int g, int t) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    const int c = c0 + 8 * n + 2 * t;
    *reinterpret_cast<float2*>(dst + (m0 + g) * pitch + c) = make_float2(scale * acc[n][0], scale * acc[n][1]);
    *reinterpret_cast<float2*>(dst + (m0 + g + 8) * pitch + c) = make_float2(scale * acc[n][2], scale * acc[n][3]);
  }
}

}  // namespace gdr_chunk_mma
}  // namespace kernels

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
// kRound: the value is rounded to TF32 and its remainder dropped (one part, as kExact; the chunk
// kernels' TF32 mode, about 2⁻¹¹ relative per product where the split keeps about 2⁻²¹).
template <bool kExact, bool kRound = false>
__device__ __forceinline__ void to_parts(float x, uint32_t& big, uint32_t& small) {
  if constexpr (kExact) {
    big = __float_as_uint(x);
    small = 0;
  } else if constexpr (kRound) {
    big = round_tf32(x);
    small = 0;
  } else {
    split_tf32(x, big, small);
  }
}

// The fragment loads read shared rows of fp32 or of 16-bit values (bf16, fp16), widened as read.

// A fragment of a row-major [m][k] tile: rows m0 + g, m0 + g + 8, columns k0 + t, k0 + t + 4, each
// element times col_scale[column] when col_scale is given.
template <bool kExact = false, bool kRound = false, typename S>
__device__ __forceinline__ FragA frag_a(const S* s, int pitch, int m0, int k0, int g, int t,
                                        const float* col_scale = nullptr) {
  float x[4] = {to_f32(s[(m0 + g) * pitch + k0 + t]), to_f32(s[(m0 + g + 8) * pitch + k0 + t]),
                to_f32(s[(m0 + g) * pitch + k0 + t + 4]), to_f32(s[(m0 + g + 8) * pitch + k0 + t + 4])};
  if (col_scale != nullptr) {
    const float c0 = col_scale[k0 + t], c1 = col_scale[k0 + t + 4];
    x[0] *= c0;
    x[1] *= c0;
    x[2] *= c1;
    x[3] *= c1;
  }
  FragA f;
#pragma unroll
  for (int i = 0; i < 4; ++i) to_parts<kExact, kRound>(x[i], f.big[i], f.small[i]);
  return f;
}

// A fragment of A = Xᵀ, X a row-major [k][m] tile: A[m][k] = X[k][m].
template <bool kExact = false, bool kRound = false, typename S>
__device__ __forceinline__ FragA frag_at(const S* s, int pitch, int m0, int k0, int g, int t) {
  FragA f;
  to_parts<kExact, kRound>(to_f32(s[(k0 + t) * pitch + m0 + g]), f.big[0], f.small[0]);
  to_parts<kExact, kRound>(to_f32(s[(k0 + t) * pitch + m0 + g + 8]), f.big[1], f.small[1]);
  to_parts<kExact, kRound>(to_f32(s[(k0 + t + 4) * pitch + m0 + g]), f.big[2], f.small[2]);
  to_parts<kExact, kRound>(to_f32(s[(k0 + t + 4) * pitch + m0 + g + 8]), f.big[3], f.small[3]);
  return f;
}

// B fragment (rows k0 + t, k0 + t + 4; column n0 + g) of B = Xᵀ, X a row-major [n][k] tile.
template <bool kExact = false, bool kRound = false, typename S>
__device__ __forceinline__ FragB frag_b_nk(const S* s, int pitch, int k0, int n0, int g, int t) {
  FragB f;
  to_parts<kExact, kRound>(to_f32(s[(n0 + g) * pitch + k0 + t]), f.big[0], f.small[0]);
  to_parts<kExact, kRound>(to_f32(s[(n0 + g) * pitch + k0 + t + 4]), f.big[1], f.small[1]);
  return f;
}

// B fragment of a row-major [k][n] tile.
template <bool kExact = false, bool kRound = false, typename S>
__device__ __forceinline__ FragB frag_b_kn(const S* s, int pitch, int k0, int n0, int g, int t) {
  FragB f;
  to_parts<kExact, kRound>(to_f32(s[(k0 + t) * pitch + n0 + g]), f.big[0], f.small[0]);
  to_parts<kExact, kRound>(to_f32(s[(k0 + t + 4) * pitch + n0 + g]), f.big[1], f.small[1]);
  return f;
}

// The products of two fragments that are not known to be zero: mma3's three when both are split,
// two when one operand is one part (exact or rounded, to_parts), one when both are.
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
// operand is one part (its values TF32 already, from bf16 or fp16 inputs, or rounded to TF32), see
// mma_parts.
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

// Products of two 16-bit operands (bf16 or fp16, both of type S) kept as 16-bit shared rows: one
// m16n8k16 mma per 16 × 8 tile and k-step of 16, its fragments read as pairs of consecutive
// values (one 32-bit load each). The products of 16-bit values are exact and summed in fp32, as
// TF32's products of the same values are: half the mma and half the loads. Rows padded to
// a pitch of 8 mod 16 elements put a fragment's 32 loads in 32 banks.
struct Frag16A {
  uint32_t r[4];
};
struct Frag16B {
  uint32_t r[2];
};

template <typename S>
__device__ __forceinline__ uint32_t pair_at(const S* p) {
  static_assert(sizeof(S) == 2, "16-bit shared rows");
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment of a row-major [m][k] tile: rows m0 + g, m0 + g + 8; columns k0 + 2t, + 1 and
// k0 + 2t + 8, + 9.
template <typename S>
__device__ __forceinline__ Frag16A frag16_a(const S* s, int pitch, int m0, int k0, int g, int t) {
  const S* r0 = s + (m0 + g) * pitch + k0 + 2 * t;
  const S* r1 = r0 + 8 * pitch;
  return {{pair_at(r0), pair_at(r1), pair_at(r0 + 8), pair_at(r1 + 8)}};
}

// A B fragment (rows k0 + 2t, + 1 and k0 + 2t + 8, + 9; column n0 + g) of B = Xᵀ, X a row-major
// [n][k] tile.
template <typename S>
__device__ __forceinline__ Frag16B frag16_b_nk(const S* s, int pitch, int k0, int n0, int g, int t) {
  const S* r = s + (n0 + g) * pitch + k0 + 2 * t;
  return {{pair_at(r), pair_at(r + 8)}};
}

// d += a b for one 16 × 8 × 16 tile; d's layout is the m16n8k8 TF32 mma's.
template <typename S>
__device__ __forceinline__ void mma16(float (&d)[4], const Frag16A& a, const Frag16B& b) {
  if constexpr (std::is_same<S, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  } else {
    static_assert(std::is_same<S, __half>::value, "bf16 or fp16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
}

// The bf16 parts of two fp32 values as m16n8k16 operand pairs (x in the low half): hi = the pair
// rounded to bf16, lo = what is left, rounded (x − hi is exact in fp32; hi + lo leaves out about
// 2⁻¹⁸ of each value). Two mma, hi's and lo's, with an exact bf16 operand then give an fp32
// operand's products to about 2⁻¹⁸ (TF32 rounding keeps 2⁻¹¹, its split 2⁻²¹).
__device__ __forceinline__ void split_bf16_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// acc[n] = Σ_{k0 in [0, k_end), step 16} a(k0) · b(k0, n) for the kTiles column tiles of one
// 16-row strip of 16-bit operands of type S (strip_product's counterpart).
template <int kTiles, typename S, class LoadA, class LoadB>
__device__ __forceinline__ void strip16_product(float (&acc)[kTiles][4], int k_end, LoadA a_at, LoadB b_at) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
  }
  for (int k0 = 0; k0 < k_end; k0 += 16) {
    const Frag16A a = a_at(k0);
#pragma unroll
    for (int n = 0; n < kTiles; ++n) mma16<S>(acc[n], a, b_at(k0, n));
  }
}

// acc = X Kᵀ for the 16-row strip of X from row m0 and kTiles 8-column tiles of Kᵀ from column n0,
// X and K staged as rows [·][pitch] of type S over dk columns (a multiple of 16): one 16-bit mma per
// k-step of 16 for bf16 or fp16 rows (exact products), split-TF32 products for fp32 rows. The fused
// front's G and the backward tail's masks take it.
template <int kTiles, typename S>
__device__ __forceinline__ void strip_times_kt(float (&acc)[kTiles][4], const S* X_s, const S* K_s, int pitch, int dk,
                                               int m0, int n0, int g, int t) {
  if constexpr (sizeof(S) == 2) {
    strip16_product<kTiles, S>(
        acc, dk, [&](int k0) { return frag16_a(X_s, pitch, m0, k0, g, t); },
        [&](int k0, int nt) { return frag16_b_nk(K_s, pitch, k0, n0 + 8 * nt, g, t); });
  } else {
    strip_product<kTiles>(
        acc, 0, dk, [&](int k0) { return frag_a(X_s, pitch, m0, k0, g, t); },
        [&](int k0, int nt) { return frag_b_nk(K_s, pitch, k0, n0 + 8 * nt, g, t); });
  }
}

// The five 8-column tiles one warp takes of the 20 at or left of the diagonal 16 × 16 blocks of a
// C × C (C = 64) product, four warps to a matrix (the fused front's G): warps 2p and 2p + 1 of the
// four share the strips p and 3 − p (2p + 2 and 8 − 2p tiles), the even one strip p's tiles and
// then strip 3 − p's first 3 − 2p, the odd one strip 3 − p's last five. Tile i lies in 16-row strip
// strip(i), at 8-column tile n(i). One warp's five tiles in one pass, with both strips' A fragments
// loaded and one chosen per tile, where a pass per strip took an instance per tile count (five,
// each unrolled): the front's machine code 9.2k -> 7.3k instructions and its launch 2% shorter. The
// tail's masks the same way (8.3k -> 4.4k) spilled more (96 bytes against 52) and ran 2% longer, so
// they keep a pass per strip (docs/perf.md, stop 85).
struct LowerTriangleTiles {
  int strip0, strip1;  // tiles i < split lie in strip0, the others in strip1
  int split;
  int n_first;  // the odd warp's first tile (strip0 = strip1)
  bool even;
  __device__ __forceinline__ explicit LowerTriangleTiles(int warp_of_four) {
    const int p = warp_of_four / 2;
    even = warp_of_four % 2 == 0;
    strip0 = even ? p : 3 - p;
    strip1 = 3 - p;
    split = even ? 2 * p + 2 : 5;
    n_first = 3 - 2 * p;
  }
  __device__ __forceinline__ int strip(int i) const { return i < split ? strip0 : strip1; }
  __device__ __forceinline__ int n(int i) const { return even ? (i < split ? i : i - split) : n_first + i; }
};

// acc[i] = X Kᵀ on tile i of `tiles` (rows of strip(i), columns of tile n(i)), X and K staged as
// rows [·][pitch] of type S over dk columns: 16-bit mma on 16-bit rows, split TF32 on fp32 rows, the
// products of each tile in the order strip_times_kt takes them, so the same sums. Every tile is
// computed; a tile's A fragment is chosen register by register (a chosen struct goes through
// local memory).
template <typename S>
__device__ __forceinline__ void lower_tiles_times_kt(float (&acc)[5][4], const S* X_s, const S* K_s, int pitch, int dk,
                                                     const LowerTriangleTiles& tiles, int g, int t) {
#pragma unroll
  for (int i = 0; i < 5; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  }
  const int m0 = 16 * tiles.strip0, m1 = 16 * tiles.strip1;
  if constexpr (sizeof(S) == 2) {
    for (int k0 = 0; k0 < dk; k0 += 16) {
      const Frag16A a0 = frag16_a(X_s, pitch, m0, k0, g, t), a1 = frag16_a(X_s, pitch, m1, k0, g, t);
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        Frag16A a;
#pragma unroll
        for (int e = 0; e < 4; ++e) a.r[e] = i < tiles.split ? a0.r[e] : a1.r[e];
        mma16<S>(acc[i], a, frag16_b_nk(K_s, pitch, k0, 8 * tiles.n(i), g, t));
      }
    }
  } else {
    float cross[5][4] = {};
    for (int k0 = 0; k0 < dk; k0 += 8) {
      const FragA a0 = frag_a(X_s, pitch, m0, k0, g, t), a1 = frag_a(X_s, pitch, m1, k0, g, t);
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        FragA a;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          a.big[e] = i < tiles.split ? a0.big[e] : a1.big[e];
          a.small[e] = i < tiles.split ? a0.small[e] : a1.small[e];
        }
        mma_parts<false, false>(acc[i], cross[i], a, frag_b_nk(K_s, pitch, k0, 8 * tiles.n(i), g, t));
      }
    }
#pragma unroll
    for (int i = 0; i < 5; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] += cross[i][e];
    }
  }
}

// Calls f(std::integral_constant<int, n>) for n in 1..kMax (a tile count known only at run time;
// kMax at most 5). Callers whose counts stop below 5 say so: fewer instances, less code.
template <int kMax = 5, class F>
__device__ __forceinline__ void with_tile_count(int n, F f) {
  static_assert(kMax >= 1 && kMax <= 5, "1 to 5 tiles");
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: if constexpr (kMax >= 2) f(std::integral_constant<int, 2>{}); break;
    case 3: if constexpr (kMax >= 3) f(std::integral_constant<int, 3>{}); break;
    case 4: if constexpr (kMax >= 4) f(std::integral_constant<int, 4>{}); break;
    case 5: if constexpr (kMax >= 5) f(std::integral_constant<int, 5>{}); break;
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

// Sum over the 4 lanes of a fragment row group (lanes 4g .. 4g + 3): a row's part of a tile.
__device__ __forceinline__ float sum_over_t(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// Sum over the 8 row groups of a fragment column (lanes t, t + 4, ..., t + 28).
__device__ __forceinline__ float sum_over_g(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

}  // namespace gdr_chunk_mma
}  // namespace kernels

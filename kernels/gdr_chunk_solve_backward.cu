// Backward of the chunked gated delta rule's solve (kernels/gdr_chunk_solve_backward.h): one block
// of 8 warps per (chunk, head), about 102 KiB of shared memory with fp32 tiles (two blocks an SM),
// 69 KiB with bf16 tiles (three; see below).
//
//   gates   γ = cumsum(g) as a warp scan, b, b e;
//   stage   Tm and dW by cp.async, K converted to fp32 (and dW, where it comes in bf16; the same for
//           dU and V below), or K and dW kept bf16 with bf16 tiles;
//   dW      warps 0–3: dTm = (dW Kᵀ) diag(b e) on the 20 tiles of the lower block triangle, five
//           per warp (as the fused front's G), only the strictly lower entries kept;
//           warps 4–7 meanwhile: dRw = Tmᵀ dW, strips p and 3 − p per warp (Tmᵀ is upper
//           triangular, so strip mt takes the k-steps from its diagonal block on);
//   V panels for each panel of up to 128 columns of dU and V: the same two jobs, dTm += (dU Vᵀ)
//           diag(b) into the same tiles (the same warp, in panel order: deterministic) and dRu;
//           or, with GdrChunkSolveBackwardArgs::dv set, what the backward's tail would take from
//           dRu: dv = b dRu in the token layout and Σ dRu ⊙ V per row, from the V panel staged
//           for dTm (each row's sum in two parts, each part one warp's, added in a fixed order);
//   X       X = dTm Tmᵀ on the lower block triangle (the rows dA needs), 8 warps;
//   dA      dA_raw = Tmᵀ X on the lower block triangle, written with zeros at and above the
//           diagonal.
// Products are split-TF32 mma.sync (kernels/gdr_chunk_mma.cuh), except dTm's, Tmᵀ dW's and Tmᵀ
// dU's with bf16 tiles (below); K and V read from bf16 or fp16 are TF32 values already, so the
// products with their zero remainders are skipped. In the TF32 mode (kTf32,
// GdrChunkSolveBackwardArgs::tf32_products) every fp32 operand is rounded to TF32 instead of
// split: one mma per product.
// With bf16 tiles (kBf16Tiles, GdrChunkSolveBackwardArgs::bf16_tiles: the 16-bit path's bf16 dW,
// dU, k and v) dW, dU, K and V stay bf16 in shared memory: dTm's products are bf16 m16n8k16 mma
// (exact products, as the TF32 ones of the same values), Tmᵀ dW and Tmᵀ dU are bf16 mma too with
// Tmᵀ in two bf16 parts (tm_t_times_bf16), and X takes the two tiles' room once they are done.
// 69 KiB a block: three an SM.
// At hybrid base's heads (dk 96, dv 192) on the 16-bit path, an instance of its own overlaps its
// copies with its products (gdr_chunk_solve_backward_overlap_kernel, below; docs/perf.md stop 81).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/gdr_chunk_io.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_chunk_stage.cuh"
#include "kernels/gdr_chunk_solve_backward.h"
#include "kernels/ldmatrix.cuh"
#include "kernels/smem_opt_in.cuh"

namespace kernels {

namespace {

using namespace gdr_chunk_io;
using namespace gdr_chunk_mma;
using namespace gdr_chunk_stage;

constexpr int kC = 64;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kPanel = 128;         // columns of dU and V per panel (and dk ≤ 128)
constexpr int kTPitch = kC + 4;     // rows of Tm and dTm (read as [m][k] and [n][k])
constexpr int kGPitch = kPanel + 8;  // rows of dW, dU (read as [m][k] and [k][n]); X (as [k][n])
constexpr int kBPitch = kPanel + 4;  // rows of K, V (read as [n][k])

constexpr int kSmemFloats = 2 * kC * kTPitch + kC * kGPitch + kC * kBPitch + 4 * kC;

// With bf16 tiles: dW or dU, and K or V, as bf16 rows of k16Pitch (8 mod 16 elements: a 16-bit
// fragment's 32-bit loads in 32 banks), two of them in the room of kC · k16Pitch floats; X's fp32
// rows (8 mod 32 floats: frag_b_kn's loads in 32 banks) over both once they are done.
constexpr int k16Pitch = kPanel + 8;
constexpr int kX16Pitch = kC + 8;
constexpr int kSmemFloats16 = 2 * kC * kTPitch + kC * k16Pitch + 4 * kC;
static_assert(kX16Pitch <= k16Pitch, "X fits the two bf16 tiles' room");

// Copies rows × width floats (width a multiple of 4) from global memory (row stride ld) into shared
// rows of `pitch` by 16-byte cp.async.
__device__ __forceinline__ void stage_f32(float* dst, int pitch, const float* src, int64_t ld, int rows, int width) {
  const int n4 = width / 4;
  for (int p = threadIdx.x; p < rows * n4; p += kThreads) {
    const int r = p / n4, c = 4 * (p % n4);
    cp_async16_zfill(dst + r * pitch + c, src + r * ld + c, true);
  }
}

// acc[n] = Tmᵀ G for the 16-row strip m0 of Tmᵀ (Tm fp32 rows of kTPitch, k from k_begin to C) and
// four 8-column tiles of G (bf16 rows [k][n] of g_pitch, tile n at column col(n)): bf16 m16n8k16
// mma with Tmᵀ in two bf16 parts (split_bf16_pair), G exact, two tiles' G fragments an ldmatrix.
// The TF32 products this replaces rounded Tm to TF32 (2⁻¹¹; the parts keep 2⁻¹⁸) with the same
// count of mma, and loaded each bf16 value of G by itself.
template <class Col>
__device__ __forceinline__ void tm_t_times_bf16(float (&acc)[4][4], const float* T_s, int m0, int k_begin,
                                                const __nv_bfloat16* G_s, int g_pitch, Col col, int lane) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
  }
  const int g = lane / 4, t = lane % 4, m = lane / 8;
  for (int k0 = k_begin; k0 < kC; k0 += 16) {
    // Tmᵀ's fragment: rows m0 + g (+ 8) of Tmᵀ are columns of Tm, its k pairs rows k0 + 2t, + 1
    // (and + 8, + 9).
    const float* c0 = T_s + (k0 + 2 * t) * kTPitch + m0 + g;
    gdr_chunk_mma::Frag16A hi, lo;
    gdr_chunk_mma::split_bf16_pair(c0[0], c0[kTPitch], hi.r[0], lo.r[0]);
    gdr_chunk_mma::split_bf16_pair(c0[8], c0[kTPitch + 8], hi.r[1], lo.r[1]);
    gdr_chunk_mma::split_bf16_pair(c0[8 * kTPitch], c0[9 * kTPitch], hi.r[2], lo.r[2]);
    gdr_chunk_mma::split_bf16_pair(c0[8 * kTPitch + 8], c0[9 * kTPitch + 8], hi.r[3], lo.r[3]);
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      // Matrices (k0, tile 2 pair), (k0 + 8, tile 2 pair), (k0, tile 2 pair + 1), (k0 + 8, ...).
      uint32_t b[4];
      ldmatrix_x4_trans_b16(b, G_s + (k0 + lane % 8 + 8 * (m % 2)) * g_pitch + col(2 * pair + m / 2));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const gdr_chunk_mma::Frag16B bf{{b[2 * h], b[2 * h + 1]}};
        gdr_chunk_mma::mma16<__nv_bfloat16>(acc[2 * pair + h], hi, bf);
        gdr_chunk_mma::mma16<__nv_bfloat16>(acc[2 * pair + h], lo, bf);
      }
    }
  }
}

// kMinBlocks: blocks an SM: 2 with fp32 tiles (102 KiB); 3 with bf16 tiles (69 KiB), at 80 registers
// a thread, where the compiler spills about 120 bytes a thread (two blocks at 128 registers
// measured 1.46 ms a step on hybrid base, three 1.40: docs/perf.md, stop 48).
// kDK, kDV: the head sizes known at compile time (with_head_sizes), 0: l.dk and l.dv.
template <typename T, typename TV, int VW, bool kTf32, bool kBf16Tiles = false, int kMinBlocks = 2, int kDK = 0,
          int kDV = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gdr_chunk_solve_backward_kernel(GdrChunkList l, GdrChunkSolveBackwardArgs a) {
  static_assert(!kBf16Tiles || (kTf32 && std::is_same<T, __nv_bfloat16>::value && std::is_same<TV, __nv_bfloat16>::value),
                "bf16 tiles: bf16 k and v, TF32 products");
  constexpr bool kKExact = !std::is_same<T, float>::value, kVExact = !std::is_same<TV, float>::value;
  // The tiles of dW or dU (G) and of K or V (B): fp32, or bf16 as they come (kBf16Tiles).
  using Tile = typename std::conditional<kBf16Tiles, __nv_bfloat16, float>::type;
  constexpr int kGP = kBf16Tiles ? k16Pitch : kGPitch, kBP = kBf16Tiles ? k16Pitch : kBPitch;
  constexpr int kXP = kBf16Tiles ? kX16Pitch : kGPitch;
  extern __shared__ __align__(16) float smem[];
  const int dk = kDK > 0 ? kDK : static_cast<int>(l.dk), dv = kDV > 0 ? kDV : static_cast<int>(l.dv);
  float* T_s = smem;                   // Tm [C][kTPitch]
  float* dTm_s = T_s + kC * kTPitch;   // dTm [C][kTPitch]
  Tile* G_s = reinterpret_cast<Tile*>(dTm_s + kC * kTPitch);  // dW, then dU panels [C][kGP]
  Tile* B_s = G_s + kC * kGP;                                  // K, then V panels [C][kBP]
  float* X_s = reinterpret_cast<float*>(G_s);                  // X [C][kXP], after the panels
  float* b_s = reinterpret_cast<float*>(B_s + kC * kBP);
  float* be_s = b_s + kC;
  float* ru_v_s = be_s + kC;  // [2][C]: Σ dRu ⊙ V per row, the parts of warps 4–5 and 6–7

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t r = blockIdx.x, n = r / l.H, h = r % l.H;
  const int64_t start = l.chunk_start[n];
  const int len = l.chunk_len[n];
  // A fixed layout's spare chunk (no tokens; model/gdr_plan_slots.h): its dA_raw, dRw, dRu and
  // dbeta_v rows are read only by the tail of the same chunk, which skips it too.
  if (len == 0) return;

  // Tm and dW by cp.async while the gates and K are read (a bf16 dW is read with K: widened, or
  // kept bf16 with bf16 tiles).
  stage_f32(T_s, kTPitch, a.Tm + r * kC * kC, kC, kC, kC);
  if constexpr (!kBf16Tiles) {
    if (!a.bf16_grads) stage_f32(G_s, kGPitch, static_cast<const float*>(a.dW) + r * kC * dk, dk, kC, dk);
  }
  cp_async_commit();

  // Gates.
  __shared__ float gam_s[kC];
  stage_gates(a.g, a.beta, start, len, l.H, h, gam_s, b_s);
  if (tid < kC) be_s[tid] = b_s[tid] * expf(gam_s[tid]);
  if (tid < 2 * kC) ru_v_s[tid] = 0.f;

  // K, or a panel of V, into B_s (fp32, or bf16 as it comes).
  auto load_rows = [&](const auto* src, int64_t token_stride, int64_t col0, int width) {
    stage_rows<VW>(src, token_stride, col0, width, start, len, tid, kThreads, B_s, kBP);
  };
  const T* k = static_cast<const T*>(a.k);
  load_rows(k, l.H * dk, h * dk, dk);
  if (a.bf16_grads) {
    stage_rows<4>(static_cast<const __nv_bfloat16*>(a.dW) + r * kC * dk, dk, 0, dk, 0, kC, tid, kThreads, G_s, kGP);
  }
  cp_async_wait<0>();
  __syncthreads();

  // Warps 0–3: dTm's 20 lower tiles, five per warp: warps 2p and 2p + 1 share strips p and 3 − p
  // (2p + 2 and 8 − 2p tiles), the first five of the pair's tiles or the last five. `first` writes
  // the tiles, later calls add to them; entries at and above the diagonal stay zero.
  auto dTm_part = [&](auto b_exact, int width, const float* scale, bool first) {
    const int p = warp / 2, tiles_a = 2 * p + 2;
    auto segment = [&](int mt, int n_first, int n_tiles) {
      with_tile_count(n_tiles, [&](auto count) {
        constexpr int kN = decltype(count)::value;
        const int m0 = 16 * mt;
        float acc[kN][4];
        if constexpr (kBf16Tiles) {
          strip16_product<kN, __nv_bfloat16>(
              acc, width, [&](int k0) { return frag16_a(G_s, kGP, m0, k0, g, t); },
              [&](int k0, int nt) { return frag16_b_nk(B_s, kBP, k0, 8 * (n_first + nt), g, t); });
        } else {
          constexpr bool kBExact = decltype(b_exact)::value;
          strip_product<kN, kTf32, kBExact>(
              acc, 0, width, [&](int k0) { return frag_a<false, kTf32>(G_s, kGP, m0, k0, g, t); },
              [&](int k0, int nt) { return frag_b_nk<kBExact>(B_s, kBP, k0, 8 * (n_first + nt), g, t); });
        }
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int i = m0 + g + 8 * hr, j = 8 * (n_first + nt) + 2 * t;
            float2* dst = reinterpret_cast<float2*>(dTm_s + i * kTPitch + j);
            const float2 old = first ? make_float2(0.f, 0.f) : *dst;
            *dst = make_float2(j < i ? old.x + scale[j] * acc[nt][2 * hr] : 0.f,
                               j + 1 < i ? old.y + scale[j + 1] * acc[nt][2 * hr + 1] : 0.f);
          }
        }
      });
    };
    if (warp % 2 == 0) {
      segment(p, 0, tiles_a);
      segment(3 - p, 0, 5 - tiles_a);
    } else {
      segment(3 - p, 5 - tiles_a, 5);
    }
  };

  // Warps 4–7: Tmᵀ G_s for `width` columns, each result pair (i, c), (i, c + 1) to store(i, c, x, y)
  // (called by the whole warp). Strip mt takes the k-steps from 16 mt on; warp 4 + w' takes strips
  // w' % 2 and 3 − w' % 2 (10 k-steps of 8, or 5 of 16 with bf16 tiles, together) on every second
  // 8-column tile from w' / 2.
  auto tm_t_product = [&](int width, auto store) {
    const int w4 = warp - 4, p = w4 % 2, tile0 = w4 / 2, n_all = (width / 8 - tile0 + 1) / 2;
    for (int strip = 0; strip < 2; ++strip) {
      const int mt = strip == 0 ? p : 3 - p;
      for (int pass = 0; pass * 4 < n_all; ++pass) {
        const int n_tiles = n_all - 4 * pass < 4 ? n_all - 4 * pass : 4;
        auto col = [&](int nt) { return 8 * (tile0 + 2 * (4 * pass + (nt < n_tiles ? nt : n_tiles - 1))); };
        float acc[4][4];
        if constexpr (kBf16Tiles) {
          tm_t_times_bf16(acc, T_s, 16 * mt, 16 * mt, G_s, kGP, col, lane);
        } else {
          strip_product<4, kTf32, kTf32>(
              acc, 16 * mt, kC, [&](int k0) { return frag_at<false, kTf32>(T_s, kTPitch, 16 * mt, k0, g, t); },
              [&](int k0, int nt) { return frag_b_kn<kBf16Tiles, kTf32>(G_s, kGP, k0, col(nt), g, t); });
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          if (nt >= n_tiles) continue;
          const int c = col(nt) + 2 * t;
          store(16 * mt + g, c, acc[nt][0], acc[nt][1]);
          store(16 * mt + g + 8, c, acc[nt][2], acc[nt][3]);
        }
      }
    }
  };

  // Rows of the chunk layout [C][ld] from dst.
  auto store_rows = [&](float* dst, int64_t ld) {
    return [=](int i, int c, float x, float y) { *reinterpret_cast<float2*>(dst + i * ld + c) = make_float2(x, y); };
  };
  if (warp < 4) {
    dTm_part(std::integral_constant<bool, kKExact>{}, dk, be_s, true);
  } else if (a.bf16_grads) {
    __nv_bfloat16* dRw = static_cast<__nv_bfloat16*>(a.dRw) + r * kC * dk;
    tm_t_product(dk, [=](int i, int c, float x, float y) { store2(dRw + i * dk + c, x, y); });
  } else {
    tm_t_product(dk, store_rows(static_cast<float*>(a.dRw) + r * kC * dk, dk));
  }

  const TV* v = static_cast<const TV*>(a.v);
  const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * dv;
  for (int p0 = 0; p0 < dv; p0 += kPanel) {
    const int pw = dv - p0 < kPanel ? dv - p0 : kPanel;
    __syncthreads();  // every warp is done with what G_s and B_s held
    if constexpr (!kBf16Tiles) {
      if (!a.dU_bf16) stage_f32(G_s, kGPitch, static_cast<const float*>(a.dU) + r * kC * dv + p0, dv, kC, pw);
    }
    cp_async_commit();
    load_rows(v, v_stride, h * dv + p0, pw);
    if (a.dU_bf16) {
      stage_rows<4>(static_cast<const __nv_bfloat16*>(a.dU) + r * kC * dv, dv, p0, pw, 0, kC, tid, kThreads, G_s, kGP);
    }
    cp_async_wait<0>();
    __syncthreads();
    if (warp < 4) {
      dTm_part(std::integral_constant<bool, kVExact>{}, pw, b_s, false);
    } else if (a.dv == nullptr) {
      tm_t_product(pw, store_rows(a.dRu + r * kC * dv + p0, dv));
    } else {
      // dv = b dRu for the chunk's rows, and this warp's part of Σ dRu ⊙ V (V is B_s's panel).
      TV* dv_out = static_cast<TV*>(a.dv) + h * dv + p0;
      float* part = ru_v_s + ((warp - 4) / 2) * kC;
      tm_t_product(pw, [&](int i, int c, float x, float y) {
        const float s = sum_over_t(x * to_f32(B_s[i * kBP + c]) + y * to_f32(B_s[i * kBP + c + 1]));
        if (t == 0) part[i] += s;
        if (i < len) store2(dv_out + (start + i) * l.H * dv + c, b_s[i] * x, b_s[i] * y);
      });
    }
  }
  __syncthreads();
  if (a.dv != nullptr && tid < kC) a.dbeta_v[r * kC + tid] = ru_v_s[tid] + ru_v_s[kC + tid];

  // X = dTm Tmᵀ on the lower block triangle: strip mt has 2 mt + 2 tiles, warp w takes half of
  // strip w % 4's; dTm's strip mt is zero from column 16 (mt + 1) on.
  auto lower_half_strip = [&](auto produce) {
    const int mt = warp % 4, n_first = (warp / 4) * (mt + 1);
    with_tile_count(mt + 1, [&](auto count) { produce(mt, n_first, count); });
  };
  lower_half_strip([&](int mt, int n_first, auto count) {
    constexpr int kN = decltype(count)::value;
    float acc[kN][4];
    strip_product<kN, kTf32, kTf32>(
        acc, 0, 16 * (mt + 1), [&](int k0) { return frag_a<false, kTf32>(dTm_s, kTPitch, 16 * mt, k0, g, t); },
        [&](int k0, int nt) { return frag_b_nk<false, kTf32>(T_s, kTPitch, k0, 8 * (n_first + nt), g, t); });
    store_strip<kN>(X_s, kXP, 16 * mt, 8 * n_first, acc, 1.f, g, t);
  });
  __syncthreads();

  // dA_raw = Tmᵀ X on the lower block triangle (X's rows from 16 mt on), zeros at and above the
  // diagonal.
  lower_half_strip([&](int mt, int n_first, auto count) {
    constexpr int kN = decltype(count)::value;
    float acc[kN][4];
    strip_product<kN, kTf32, kTf32>(
        acc, 16 * mt, kC, [&](int k0) { return frag_at<false, kTf32>(T_s, kTPitch, 16 * mt, k0, g, t); },
        [&](int k0, int nt) { return frag_b_kn<false, kTf32>(X_s, kXP, k0, 8 * (n_first + nt), g, t); });
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = 16 * mt + g + 8 * hr, j = 8 * (n_first + nt) + 2 * t;
        *reinterpret_cast<float2*>(a.dA_raw + (r * kC + i) * kC + j) =
            make_float2(j < i ? acc[nt][2 * hr] : 0.f, j + 1 < i ? acc[nt][2 * hr + 1] : 0.f);
      }
    }
  });
}

// The solve's backward with its copies overlapped (gdr_chunk_solve_backward_overlap): hybrid base's
// heads (dk 96, dv 192) on the 16-bit path with dv taken, bf16 everything that comes in bf16.
// Every copy is cp.async straight into shared memory, and while the products on one operand run
// the next is in flight: dU and V come in three panels of 64 columns, panel 0 while the products
// on dW and K run, panel p + 1 while those on panel p run. Warps 0–3 keep their five dTm tiles in
// registers across dW and the panels (dTm = b ⊙ (e ⊙ dW Kᵀ + Σ dU Vᵀ) by columns, e = exp γ), so
// no fp32 dTm tile takes room while the panels stream. Tm is split once into its two bf16 parts
// (the parts tm_t_times_bf16 splits at every read, so Tmᵀ dW and Tmᵀ dU are the same bits), and
// X = dTm Tmᵀ and dA = Tmᵀ X take dTm and X in bf16 parts too (three bf16 mma a tile, about 2⁻¹⁶
// where TF32's one mma kept 2⁻¹¹). 63 KiB a block, three an SM:
//   Tm's parts bf16 [C][72] × 2;
//   room A: dW and K bf16 [C][104] each, then panel 1, then dTm fp32 [C][kTPitch] for X;
//   room B: Tm fp32 [C][kTPitch] until it is split, then panels 0 and 2 (dU, V [C][72] each),
//           then X's parts;
//   the gates' b and e and the row sums Σ dRu ⊙ V.
namespace overlap {
constexpr int kDk = 96, kDv = 192, kPw = 64, kPanels = kDv / kPw;
constexpr int kWP = kDk + 8, kPP = kPw + 8, kTP16 = kC + 8;  // rows 8 mod 16 elements: ldmatrix in 32 banks
constexpr int kPartBytes = kC * kTP16 * 2, kWBytes = kC * kWP * 2;
constexpr int kRoomA = 2 * kWBytes, kRoomB = 2 * kC * kPP * 2;
constexpr int kSmemBytes = 2 * kPartBytes + kRoomA + kRoomB + 4 * kC * 4;
static_assert(kRoomB <= kRoomA, "a panel fits room A");
static_assert(kC * kTPitch * 4 <= kRoomB && 2 * kPartBytes <= kRoomB, "Tm's fp32 rows and X's parts fit room B");
static_assert(kSmemBytes == 64512, "63 KiB a block");
}  // namespace overlap

// tm_t_times_bf16 on Tm's parts in shared memory (Th, Tl rows [k][m] of overlap::kTP16), kN
// tiles (even): two ldmatrix a k-step for Tmᵀ's fragments.
template <int kN, class Col>
__device__ __forceinline__ void tm_parts_t_times(float (&acc)[kN][4], const __nv_bfloat16* Th, const __nv_bfloat16* Tl,
                                                 int m0, const __nv_bfloat16* G, int gp, Col col, int lane) {
  static_assert(kN % 2 == 0, "tiles in pairs");
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
  }
  const int m = lane / 8;
  for (int k0 = m0; k0 < kC; k0 += 16) {  // Tmᵀ is upper triangular: strip m0 from its diagonal block
    gdr_chunk_mma::Frag16A hi, lo;
    ldsm_a_of_transposed(hi.r, Th, overlap::kTP16, m0, k0, lane);
    ldsm_a_of_transposed(lo.r, Tl, overlap::kTP16, m0, k0, lane);
#pragma unroll
    for (int pair = 0; pair < kN / 2; ++pair) {
      uint32_t b[4];
      ldmatrix_x4_trans_b16(b, G + (k0 + lane % 8 + 8 * (m % 2)) * gp + col(2 * pair + m / 2));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const gdr_chunk_mma::Frag16B bf{{b[2 * h], b[2 * h + 1]}};
        gdr_chunk_mma::mma16<__nv_bfloat16>(acc[2 * pair + h], hi, bf);
        gdr_chunk_mma::mma16<__nv_bfloat16>(acc[2 * pair + h], lo, bf);
      }
    }
  }
}

// acc[n] += (Ah + Al)(Bh + Bl) without Al Bl: three bf16 mma a tile.
template <int kN>
__device__ __forceinline__ void mma_parts3(float (&acc)[kN][4], const gdr_chunk_mma::Frag16A& ah,
                                           const gdr_chunk_mma::Frag16A& al, const uint32_t (&bh)[kN][2],
                                           const uint32_t (&bl)[kN][2]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const gdr_chunk_mma::Frag16B h{{bh[n][0], bh[n][1]}}, l{{bl[n][0], bl[n][1]}};
    gdr_chunk_mma::mma16<__nv_bfloat16>(acc[n], ah, h);
    gdr_chunk_mma::mma16<__nv_bfloat16>(acc[n], ah, l);
    gdr_chunk_mma::mma16<__nv_bfloat16>(acc[n], al, h);
  }
}

// B fragments of kN tiles from n0 by pairs (a last odd tile's pair reads one tile past, unused):
// kOfTransposed, B = Xᵀ of a row-major [n][k] X; else a row-major [k][n] B.
template <int kN, bool kOfTransposed>
__device__ __forceinline__ void b_frags(uint32_t (&b)[kN][2], const __nv_bfloat16* s, int pitch, int k0, int n0,
                                        int lane) {
#pragma unroll
  for (int np = 0; np < (kN + 1) / 2; ++np) {
    uint32_t x[4];
    if constexpr (kOfTransposed) {
      ldsm_b_pair_of_transposed(x, s, pitch, k0, n0 + 16 * np, lane);
    } else {
      ldsm_b_pair(x, s, pitch, k0, n0 + 16 * np, lane);
    }
    b[2 * np][0] = x[0];
    b[2 * np][1] = x[1];
    if (2 * np + 1 < kN) {
      b[2 * np + 1][0] = x[2];
      b[2 * np + 1][1] = x[3];
    }
  }
}

// A barrier of the whole block that its threads may reach from different instructions
// (barrier.sync without .aligned; __syncthreads is the aligned form, one instruction for all).
__device__ __forceinline__ void block_barrier_unaligned() { asm volatile("barrier.sync 0;" ::: "memory"); }

__global__ void __launch_bounds__(kThreads, 3)
    gdr_chunk_solve_backward_overlap_kernel(GdrChunkList l, GdrChunkSolveBackwardArgs a) {
  using namespace overlap;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(16) unsigned char smem_b[];
  bf16* Th = reinterpret_cast<bf16*>(smem_b);
  bf16* Tl = Th + kC * kTP16;
  unsigned char* room_a = smem_b + 2 * kPartBytes;
  unsigned char* room_b = room_a + kRoomA;
  bf16* W_s = reinterpret_cast<bf16*>(room_a);  // dW [C][kWP]
  bf16* K_s = W_s + kC * kWP;                   // K [C][kWP]
  float* b_s = reinterpret_cast<float*>(room_b + kRoomB);
  float* e_s = b_s + kC;      // exp γ
  float* ru_v_s = e_s + kC;   // [2][C]: Σ dRu ⊙ V per row, the parts of warps 4–5 and 6–7

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t r = blockIdx.x, n = r / l.H, h = r % l.H;
  const int64_t start = l.chunk_start[n];
  const int len = l.chunk_len[n];
  if (len == 0) return;  // a fixed layout's spare chunk, as the other instances

  // Tm (fp32, into room B), dW and K (into room A) by cp.async while the gates are read; K's rows
  // past the chunk's length are zeros.
  float* Tm_f = reinterpret_cast<float*>(room_b);
  stage_f32(Tm_f, kTPitch, a.Tm + r * kC * kC, kC, kC, kC);
  {
    constexpr int kPieces = kDk / 8, kPerTile = kC * kPieces;
    const bf16* dW = static_cast<const bf16*>(a.dW) + r * kC * kDk;
    const bf16* k = static_cast<const bf16*>(a.k);
    for (int e = tid; e < 2 * kPerTile; e += kThreads) {
      const int which = e / kPerTile, i = (e % kPerTile) / kPieces, c = 8 * (e % kPieces);
      if (which == 0) {
        cp_async16(W_s + i * kWP + c, dW + i * kDk + c);
      } else {
        const bool ok = i < len;
        const bf16* src = ok ? k + (start + i) * l.H * kDk + h * kDk + c : k;
        cp_async16_zfill(reinterpret_cast<float*>(K_s + i * kWP + c), reinterpret_cast<const float*>(src), ok);
      }
    }
  }
  cp_async_commit();
  __shared__ float gam_s[kC];
  stage_gates(a.g, a.beta, start, len, l.H, h, gam_s, b_s);
  if (tid < kC) e_s[tid] = expf(gam_s[tid]);
  if (tid < 2 * kC) ru_v_s[tid] = 0.f;
  cp_async_wait<0>();
  __syncthreads();
  // Tm's two bf16 parts (split_bf16_pair's), which every product with Tm reads from here on.
  for (int e = tid; e < kC * kC / 2; e += kThreads) {
    const int i = e / (kC / 2), j = 2 * (e % (kC / 2));
    const float2 x = *reinterpret_cast<const float2*>(Tm_f + i * kTPitch + j);
    uint32_t hi, lo;
    split_bf16_pair(x.x, x.y, hi, lo);
    *reinterpret_cast<uint32_t*>(Th + i * kTP16 + j) = hi;
    *reinterpret_cast<uint32_t*>(Tl + i * kTP16 + j) = lo;
  }
  __syncthreads();  // room B is free for panel 0

  // Panel p's dU and V columns into dst by cp.async: dU's chunk rows, V's token rows (zeros past
  // the chunk's length), one commit group.
  const bf16* dU = static_cast<const bf16*>(a.dU) + r * kC * kDv;
  const bf16* v = static_cast<const bf16*>(a.v);
  const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * kDv;
  auto issue_panel = [&](int p, unsigned char* room) {
    constexpr int kPieces = kPw / 8, kPerTile = kC * kPieces;
    bf16* dst = reinterpret_cast<bf16*>(room);
    for (int e = tid; e < 2 * kPerTile; e += kThreads) {
      const int which = e / kPerTile, i = (e % kPerTile) / kPieces, c = 8 * (e % kPieces);
      bf16* d = dst + which * kC * kPP + i * kPP + c;
      if (which == 0) {
        cp_async16(d, dU + i * kDv + kPw * p + c);
      } else {
        const bool ok = i < len;
        const bf16* src = ok ? v + (start + i) * v_stride + h * kDv + kPw * p + c : v;
        cp_async16_zfill(reinterpret_cast<float*>(d), reinterpret_cast<const float*>(src), ok);
      }
    }
    cp_async_commit();
  };
  issue_panel(0, room_b);

  // Warps 0–3: dTm's 20 lower tiles, five a warp, in registers (the general instance's split:
  // warps 2p and 2p + 1 share strips p and 3 − p, the first five of the pair's tiles or the last
  // five). Tile i is strip0's for i < split, strip1's after; tile_n(i) its 8-column tile.
  const int pair = (warp % 4) / 2;
  const bool even = warp % 2 == 0;
  const int strip0 = even ? pair : 3 - pair, strip1 = 3 - pair, split = even ? 2 * pair + 2 : 5;
  auto tile_n = [&](int i) { return even ? (i < split ? i : i - split) : 3 - 2 * pair + i; };
  float dtm[5][4] = {};
  // dtm += G Bᵀ over width columns: G rows [i][k], B rows [j][k].
  auto dtm_add = [&](const bf16* G, int gp, const bf16* B, int bp, int width) {
    for (int k0 = 0; k0 < width; k0 += 16) {
      gdr_chunk_mma::Frag16A a0, a1;
      ldsm_a(a0.r, G, gp, 16 * strip0, k0, lane);
      ldsm_a(a1.r, G, gp, 16 * strip1, k0, lane);
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        const gdr_chunk_mma::Frag16B b = gdr_chunk_mma::frag16_b_nk(B, bp, k0, 8 * tile_n(i), g, t);
        gdr_chunk_mma::Frag16A af;  // chosen register by register: a chosen struct goes through local memory
#pragma unroll
        for (int q = 0; q < 4; ++q) af.r[q] = i < split ? a0.r[q] : a1.r[q];
        gdr_chunk_mma::mma16<bf16>(dtm[i], af, b);
      }
    }
  };

  // Warps 4–7: Tmᵀ G for width columns (as the other instances: strips w' % 2 and 3 − w' % 2, every
  // second tile from w' / 2), in passes of two tiles (four would hold more registers than three
  // blocks an SM leave: they spilled).
  auto tm_t_product = [&](const bf16* G, int gp, int width, auto store) {
    const int w4 = warp - 4, p = w4 % 2, tile0 = w4 / 2, n_all = (width / 8 - tile0 + 1) / 2;
    for (int strip = 0; strip < 2; ++strip) {
      const int mt = strip == 0 ? p : 3 - p;
      for (int done = 0; done < n_all; done += 2) {
        auto pass = [&](auto tiles) {
          constexpr int kN = decltype(tiles)::value;
          auto col = [&](int nt) { return 8 * (tile0 + 2 * (done + nt)); };
          float acc[kN][4];
          tm_parts_t_times<kN>(acc, Th, Tl, 16 * mt, G, gp, col, lane);
#pragma unroll
          for (int nt = 0; nt < kN; ++nt) {
            const int c = col(nt) + 2 * t;
            store(16 * mt + g, c, acc[nt][0], acc[nt][1]);
            store(16 * mt + g + 8, c, acc[nt][2], acc[nt][3]);
          }
        };
        pass(std::integral_constant<int, 2>{});
      }
    }
  };

  // Warps 0–3 and 4–7 run the panels in two loops of their own (so that dTm's registers are not
  // held through the Tmᵀ products' code), meeting at a barrier of the whole block each panel:
  // barrier.sync's unaligned form, as the two loops reach it from different instructions.
  auto next_panel = [&](int p) {
    cp_async_wait<0>();
    block_barrier_unaligned();  // panel p has landed; every warp is done with the other room (dW, K at p = 0)
    if (p + 1 < kPanels) issue_panel(p + 1, p % 2 == 0 ? room_a : room_b);
    return reinterpret_cast<const bf16*>(p % 2 == 0 ? room_b : room_a);
  };
  float* dTm_s = reinterpret_cast<float*>(room_a);  // after the panels
  if (warp < 4) {
    dtm_add(W_s, kWP, K_s, kWP, kDk);
#pragma unroll
    for (int i = 0; i < 5; ++i) {  // dW Kᵀ's columns take e; b comes last, for all of dTm
      const int j = 8 * tile_n(i) + 2 * t;
      const float e0 = e_s[j], e1 = e_s[j + 1];
      dtm[i][0] *= e0;
      dtm[i][1] *= e1;
      dtm[i][2] *= e0;
      dtm[i][3] *= e1;
    }
#pragma unroll 1
    for (int p = 0; p < kPanels; ++p) {
      const bf16* dU_p = next_panel(p);
      dtm_add(dU_p, kPP, dU_p + kC * kPP, kPP, kPw);
    }
    block_barrier_unaligned();  // every warp is done with both rooms
    // dTm into room A, b's columns applied, only the strictly lower entries kept.
#pragma unroll
    for (int i = 0; i < 5; ++i) {
      const int mt = i < split ? strip0 : strip1, j = 8 * tile_n(i) + 2 * t;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = 16 * mt + g + 8 * hr;
        *reinterpret_cast<float2*>(dTm_s + row * kTPitch + j) =
            make_float2(j < row ? b_s[j] * dtm[i][2 * hr] : 0.f, j + 1 < row ? b_s[j + 1] * dtm[i][2 * hr + 1] : 0.f);
      }
    }
  } else {
    bf16* dRw = static_cast<bf16*>(a.dRw) + r * kC * kDk;
    tm_t_product(W_s, kWP, kDk, [=](int i, int c, float x, float y) { store2(dRw + i * kDk + c, x, y); });
    bf16* dv_base = static_cast<bf16*>(a.dv) + h * kDv;
    float* part = ru_v_s + ((warp - 4) / 2) * kC;
#pragma unroll 1
    for (int p = 0; p < kPanels; ++p) {
      const bf16* dU_p = next_panel(p);
      const bf16* V_p = dU_p + kC * kPP;
      // dv = b dRu for the chunk's rows, and this warp's part of Σ dRu ⊙ V.
      bf16* dv_out = dv_base + kPw * p;
      tm_t_product(dU_p, kPP, kPw, [&](int i, int c, float x, float y) {
        const float s = sum_over_t(x * to_f32(V_p[i * kPP + c]) + y * to_f32(V_p[i * kPP + c + 1]));
        if (t == 0) part[i] += s;
        if (i < len) store2(dv_out + (start + i) * l.H * kDv + c, b_s[i] * x, b_s[i] * y);
      });
    }
    block_barrier_unaligned();
  }
  __syncthreads();  // dTm is written
  if (tid < kC) a.dbeta_v[r * kC + tid] = ru_v_s[tid] + ru_v_s[kC + tid];

  // X = dTm Tmᵀ and dA_raw = Tmᵀ X on the lower block triangle, as the other instances, on bf16 parts.
  bf16* Xh = reinterpret_cast<bf16*>(room_b);  // X's parts [C][kTP16]
  bf16* Xl = Xh + kC * kTP16;
  auto lower_half_strip = [&](auto produce) {
    const int mt = warp % 4, n_first = (warp / 4) * (mt + 1);
    with_tile_count(mt + 1, [&](auto count) { produce(mt, n_first, count); });
  };
  lower_half_strip([&](int mt, int n_first, auto count) {
    constexpr int kN = decltype(count)::value;
    float acc[kN][4] = {};
    for (int k0 = 0; k0 < 16 * (mt + 1); k0 += 16) {
      const float* r0 = dTm_s + (16 * mt + g) * kTPitch + k0 + 2 * t;
      const float2 x[4] = {*reinterpret_cast<const float2*>(r0), *reinterpret_cast<const float2*>(r0 + 8 * kTPitch),
                           *reinterpret_cast<const float2*>(r0 + 8),
                           *reinterpret_cast<const float2*>(r0 + 8 * kTPitch + 8)};
      gdr_chunk_mma::Frag16A ah, al;
#pragma unroll
      for (int q = 0; q < 4; ++q) split_bf16_pair(x[q].x, x[q].y, ah.r[q], al.r[q]);
      uint32_t bh[kN][2], bl[kN][2];  // Tmᵀ's: Xᵀ of the row-major [n][k] Tm
      b_frags<kN, true>(bh, Th, kTP16, k0, 8 * n_first, lane);
      b_frags<kN, true>(bl, Tl, kTP16, k0, 8 * n_first, lane);
      mma_parts3<kN>(acc, ah, al, bh, bl);
    }
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int at = (16 * mt + g + 8 * hr) * kTP16 + 8 * (n_first + nt) + 2 * t;
        uint32_t hi, lo;
        split_bf16_pair(acc[nt][2 * hr], acc[nt][2 * hr + 1], hi, lo);
        *reinterpret_cast<uint32_t*>(Xh + at) = hi;
        *reinterpret_cast<uint32_t*>(Xl + at) = lo;
      }
    }
  });
  __syncthreads();
  lower_half_strip([&](int mt, int n_first, auto count) {
    constexpr int kN = decltype(count)::value;
    float acc[kN][4] = {};
    for (int k0 = 16 * mt; k0 < kC; k0 += 16) {
      gdr_chunk_mma::Frag16A ah, al;  // Tmᵀ's
      ldsm_a_of_transposed(ah.r, Th, kTP16, 16 * mt, k0, lane);
      ldsm_a_of_transposed(al.r, Tl, kTP16, 16 * mt, k0, lane);
      uint32_t bh[kN][2], bl[kN][2];  // X's, row-major [k][n]
      b_frags<kN, false>(bh, Xh, kTP16, k0, 8 * n_first, lane);
      b_frags<kN, false>(bl, Xl, kTP16, k0, 8 * n_first, lane);
      mma_parts3<kN>(acc, ah, al, bh, bl);
    }
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = 16 * mt + g + 8 * hr, j = 8 * (n_first + nt) + 2 * t;
        *reinterpret_cast<float2*>(a.dA_raw + (r * kC + i) * kC + j) =
            make_float2(j < i ? acc[nt][2 * hr] : 0.f, j + 1 < i ? acc[nt][2 * hr + 1] : 0.f);
      }
    }
  });
}

std::atomic<bool> g_overlap{true};

}  // namespace

void gdr_chunk_solve_backward_overlap(bool on) { g_overlap = on; }

int gdr_chunk_solve_backward(const GdrChunkList& l, const GdrChunkSolveBackwardArgs& a, void* stream) {
  // cp.async moves Tm, dW and dU in 16-byte pieces.
  if (!aligned_to(16, a.Tm, a.dW, a.dU)) return static_cast<int>(cudaErrorInvalidValue);  // also bf16 dW's 8-byte rows
  if (a.dv != nullptr ? a.dbeta_v == nullptr : a.dRu == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const bool vec = vectorizable(l, a.in_qk, a.in_v, {a.bf16_grads ? nullptr : a.dRw, a.dRu}, {a.k}, {a.v},
                                a.v_token_stride);
  // launch_fused takes the TF32 instance for 16-bit k and v of one type under tf32_products, so
  // with bf16 tiles (which need both) it launches the bf16-tile kernel, with its smaller room.
  const bool tiles16 = gdr_chunk_solve_backward_bf16_tiles(a);
  // The overlapped instance: hybrid base's heads with dv taken, its copies 16-byte cp.async (Tm,
  // dW and dU are checked above; k and v here, v's rows a multiple of 8 elements apart).
  const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * l.dv;
  if (g_overlap.load() && tiles16 && vec && gdr_fixed_head_sizes() && l.dk == overlap::kDk && l.dv == overlap::kDv &&
      a.dv != nullptr && v_stride % 8 == 0 && aligned_to(16, a.k, a.v) && gdr_chunk_fused_supports(l.C, l.dk, l.dv) &&
      l.N * l.H >= 1 && l.N * l.H <= 2147483647LL) {
    const int err = allow_dynamic_smem(reinterpret_cast<const void*>(&gdr_chunk_solve_backward_overlap_kernel),
                                       overlap::kSmemBytes);
    if (err != 0) return err;
    gdr_count_fixed_head_size_launch(GdrSizedKernel::kSolveBackward);
    gdr_chunk_solve_backward_overlap_kernel<<<static_cast<unsigned>(l.N * l.H), kThreads, overlap::kSmemBytes,
                                              static_cast<cudaStream_t>(stream)>>>(l, a);
    return static_cast<int>(cudaGetLastError());
  }
  return launch_fused(
      l, a.in_qk, a.in_v, vec, kThreads, sizeof(float) * static_cast<size_t>(tiles16 ? kSmemFloats16 : kSmemFloats),
      stream,
      [tiles16, &l](auto qk, auto v, auto w, auto tf32) {
        using QK = decltype(qk);
        using V = decltype(v);
        constexpr int kW = decltype(w)::value;
        constexpr bool kT = decltype(tf32)::value;
        if constexpr (kT && std::is_same<QK, __nv_bfloat16>::value && std::is_same<V, __nv_bfloat16>::value) {
          if constexpr (kW == 4) {
            if (tiles16) {
              return with_head_sizes(GdrSizedKernel::kSolveBackward, l.dk, l.dv, [](auto dk, auto dv) {
                return gdr_chunk_solve_backward_kernel<QK, V, kW, true, true, 3, decltype(dk)::value,
                                                       decltype(dv)::value>;
              });
            }
          }
          if (tiles16) return gdr_chunk_solve_backward_kernel<QK, V, kW, true, true, 3>;
        }
        return gdr_chunk_solve_backward_kernel<QK, V, kW, kT, false>;
      },
      a, a.tf32_products);
}

}  // namespace kernels

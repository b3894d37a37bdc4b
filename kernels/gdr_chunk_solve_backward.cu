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
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gdr_chunk_io.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_chunk_stage.cuh"
#include "kernels/gdr_chunk_solve_backward.h"
#include "kernels/ldmatrix.cuh"

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

}  // namespace

int gdr_chunk_solve_backward(const GdrChunkList& l, const GdrChunkSolveBackwardArgs& a, void* stream) {
  // cp.async moves Tm, dW and dU in 16-byte pieces.
  if (!aligned_to(16, a.Tm, a.dW, a.dU)) return static_cast<int>(cudaErrorInvalidValue);  // also bf16 dW's 8-byte rows
  if (a.dv != nullptr ? a.dbeta_v == nullptr : a.dRu == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const bool vec = vectorizable(l, a.in_qk, a.in_v, {a.bf16_grads ? nullptr : a.dRw, a.dRu}, {a.k}, {a.v},
                                a.v_token_stride);
  // launch_fused takes the TF32 instance for 16-bit k and v of one type under tf32_products, so
  // with bf16 tiles (which need both) it launches the bf16-tile kernel, with its smaller room.
  const bool tiles16 = gdr_chunk_solve_backward_bf16_tiles(a);
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

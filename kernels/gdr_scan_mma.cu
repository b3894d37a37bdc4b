// The chunk-state scan of the gated delta rule on tensor cores (kernels/gdr_scan.h, variants
// kTensorCores32 to kTensorCores128). Same loop and layouts as the SIMT kernel in gdr_scan.cu;
// what differs is how the two products of a step are taken (for a block's `cols` columns):
//   y = A + sign_p · P S                 [C, cols] = [C, dk] · [dk, cols]
//   S = decay · S + sign_q · Qᵀ y + E    [dk, cols] += [dk, C] · [C, cols]
// Both are mma.sync m16n8k8 TF32 products with the operands split into a TF32 part and a TF32
// remainder (big·big + big·small + small·big), so the result keeps close to fp32 accuracy while
// the SIMT kernel's shared-memory loads per multiply-add (its limit) drop about fourfold. With
// GdrScanArgs::tf32x3 off the operands are rounded to TF32 and each product is one mma: a third
// of the tensor-core work on the step's critical path (docs/perf.md, stop 26).
//
// One block of 8 warps owns one (document, head) and 32 columns of the state (or 16, 24, 32 warps
// and 64, 96, 128 columns; gdr_scan_mma_width picks the width). The state lives in two places:
// each warp holds its part of S as mma accumulators in registers (phase 2 updates them there),
// and a copy in shared memory [dk][cols + 8] is phase 1's B operand and the source of the
// coalesced out_state writes. Per step:
//   phase 0  write the state this step starts from (out_state); load the values of A, E and decay
//            each thread needs later into registers;
//   phase 1  each warp takes 16 × 16 tiles of y (units w, w + warps, ... of the (row tile, column
//            pair) units), writes y to out_y and sign_q · y to shared memory already split in its
//            two TF32 parts: 8 warps read every y element in phase 2, and would each split it;
//   phase 2  warp w updates state rows 16 (w % 8).., 16 (w % 8 + 8).. of its 32 columns and copies
//            them to shared memory.
// The forward in TF32 mode may write out_state and y rounded to bf16 (GdrScanArgs::out_state_bf16),
// and in TF32 mode either direction may read P and Q (and the forward A) in bf16
// (GdrScanArgs::P_bf16): staged as bf16 in rows padded by 16 bytes, each fragment element a 16-bit
// load widened by a shift, which is exact (bf16 values are TF32 values).
// P and Q come in by cp.async, P as soon as phase 1 of the step before has read it, Q after
// phase 2 before. Each staged tile has its own pad so the eight rows and four columns of a
// fragment load fall in 32 different banks; P's fragments come in one ldmatrix each (four 8 × 4
// fp32 blocks are four 8 × 8 b16 matrices, and ldmatrix hands them out in the TF32 A layout).
// The backward's fused form (GdrScanArgs::dO, kFused) adds two products a step that do not depend
// on the state: in phase 1 each warp takes its y tiles' dVn = s Pmᵀ dO (the A term; Pm is zero above
// its diagonal, so only k ≥ the tile's first row) and then its phase-2 state tiles' E = s Qgᵀ dO,
// folded into the state registers as decay · S + E right away (phase 1 reads the state from shared
// memory only). Qg, Pm and dO come with P in the group staged after phase 1 of the step before.
// The fused form writes out_state (the state gradient dh_next) rounded to bf16, y (dU) in fp32 or,
// with out_y_bf16, rounded to bf16 too (the fused backward's 16-bit mode, model::gdr_bf16_chunk_grads).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/gdr_scan.h"
#include "kernels/gdr_scan_stage.cuh"
#include "kernels/ldmatrix.cuh"
#include "kernels/smem_opt_in.cuh"
#include "kernels/tf32_mma.cuh"

namespace kernels {

namespace {

// A block of kWarps (8, 16, 24 or 32) warps owns 4 · kWarps state columns: 8 warps along the
// state's rows in phase 2 times kWarps / 8 groups of 32 columns. Shared rows of S and y are
// kCols + 8 long, so a fragment's eight columns and four rows fall in 32 different banks.
__host__ __device__ constexpr int cols_of(int warps) { return 4 * warps; }
__host__ __device__ constexpr int pitch_of(int warps) { return cols_of(warps) + 8; }

// B fragment of a row-major [k][n] tile in shared memory (row length pitch): rows k0 + t,
// k0 + t + 4, column n0 + g, for lane = 4g + t.
template <bool kSplit>
__device__ __forceinline__ FragB load_b(const float* tile, int pitch, int k0, int n0, int g, int t) {
  FragB f;
  to_tf32<kSplit>(tile[(k0 + t) * pitch + n0 + g], f.big[0], f.small[0]);
  to_tf32<kSplit>(tile[(k0 + t + 4) * pitch + n0 + g], f.big[1], f.small[1]);
  return f;
}

// A bf16 value (raw bits) as a TF32 operand: widened exactly (bf16's 8 significant bits fit TF32's 11).
__device__ __forceinline__ uint32_t widen_bf16(uint16_t x) { return static_cast<uint32_t>(x) << 16; }

// The A fragment of a transposed bf16 tile Mᵀ, widened: for p = M_s + (k0 + t) · pitch + m0 + g
// (M stored [k][m] in rows of `pitch`), elements (m0 + g, k0 + t), (m0 + g + 8, k0 + t),
// (m0 + g, k0 + t + 4) and (m0 + g + 8, k0 + t + 4) of Mᵀ.
__device__ __forceinline__ FragA transposed_bf16_frag(const uint16_t* p, int pitch) {
  FragA fa;
  fa.big[0] = widen_bf16(p[0]);
  fa.big[1] = widen_bf16(p[8]);
  fa.big[2] = widen_bf16(p[4 * pitch]);
  fa.big[3] = widen_bf16(p[4 * pitch + 8]);
  return fa;
}

// Stores of the per-step outputs in fp32, or rounded to bf16 (GdrScanArgs::out_state_bf16).
__device__ __forceinline__ void store4(float* dst, float4 v) { *reinterpret_cast<float4*>(dst) = v; }
__device__ __forceinline__ void store4(uint16_t* dst, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 w;
  w.x = *reinterpret_cast<const uint32_t*>(&lo);
  w.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = w;
}
__device__ __forceinline__ void store2(float* dst, float2 v) { *reinterpret_cast<float2*>(dst) = v; }
__device__ __forceinline__ void store2(uint16_t* dst, float2 v) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v.x, v.y);
}

// kUnits: phase-1 units per warp ((C/16) · (kCols/16) ≤ kWarps · kUnits). kRowTiles: 16-row state
// tiles per warp in phase 2 (dk/16 ≤ 8 · kRowTiles).
// kHasE: E is read (the backward). kSplit: split-TF32 products (GdrScanArgs::tf32x3), else one
// TF32 product each; y's small parts in shared memory are then neither written nor read.
// kBf16Out: out_state and y are written as bf16 (out_state_bf16, out_y_bf16); in the fused form
// (whose out_state is bf16 either way) y.
// kBf16In: P and Q are bf16 (P_bf16, Q_bf16; TF32 products only), and A too when kBf16Out (the
// forward form of GdrScanArgs::P_bf16).
// kFused: the backward's fused form (GdrScanArgs::dO): A and E from dO, Pm and Qg.
template <int kWarps, int kUnits, int kRowTiles, bool kHasE, bool kSplit, bool kBf16Out = false, bool kBf16In = false,
          bool kFused = false>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 8 && kRowTiles == 1 ? 2 : 1)
    gdr_scan_mma_kernel(GdrScanArgs a) {
  static_assert(!kBf16In || !kSplit, "bf16 inputs come with TF32 products only");
  static_assert(!kFused || (kBf16In && !kHasE), "the fused form: bf16 P and Q, no E");
  using TIn = typename std::conditional<kBf16In, uint16_t, float>::type;
  constexpr bool kBf16A = kBf16In && kBf16Out;
  auto in_p = [&] {
    if constexpr (kBf16In) return a.P_bf16;
    else return a.P;
  };
  auto in_q = [&] {
    if constexpr (kBf16In) return a.Q_bf16;
    else return a.Q;
  };
  // The output pointers, read from the kernel's parameters where they are used.
  auto out_state = [&] {  // the fused form writes the state in bf16 and y in fp32
    if constexpr (kBf16Out || kFused) return a.out_state_bf16;
    else return a.out_state;
  };
  auto out_y = [&] {
    if constexpr (kBf16Out) return a.out_y_bf16;
    else return a.out_y;
  };
  constexpr int kCols = cols_of(kWarps), kColPitch = pitch_of(kWarps), kPairs = kCols / 16;
  extern __shared__ __align__(16) float smem[];
  const int dk = static_cast<int>(a.dk), C = static_cast<int>(a.C);
  const int64_t dv = a.dv;
  // Rows padded by 16 bytes put a fragment's loads in different banks (P's ldmatrix in fp32 takes
  // 4 floats of pad).
  const int pitch_p = kBf16In ? dk + 8 : dk + 4, pitch_q = dk + 8;
  float* S_s = smem;                                                 // [dk][kColPitch]
  uint32_t* yb_s = reinterpret_cast<uint32_t*>(S_s + dk * kColPitch);  // [C][kColPitch]: sign_q · y, big
  uint32_t* ys_s = yb_s + C * kColPitch;  // [C][kColPitch]: sign_q · y, small (none in the fused form)
  TIn* P_s = reinterpret_cast<TIn*>(kFused ? ys_s : ys_s + C * kColPitch);  // [C][pitch_p]
  TIn* Q_s = P_s + C * pitch_p;                                             // [C][dk + 8]
  // The fused form's: Qg [C][dk + 8] and Pm [C][C + 8] bf16, dO [C][kColPitch] fp32.
  const int pitch_m = C + 8;
  TIn* Qg_s = Q_s + C * pitch_q;
  TIn* Pm_s = Qg_s + C * pitch_q;
  float* dO_s = reinterpret_cast<float*>(Pm_s + C * pitch_m);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  // Phase 2: this warp's state rows are 16 (row_warp + 8 rt) .., its columns col0 .. col0 + 31.
  const int row_warp = warp % 8, col0 = 32 * (warp / 8);
  const int64_t doc_head = blockIdx.x;
  const int64_t s = doc_head / a.H, head = doc_head % a.H;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const int64_t cols = dv - j0 < kCols ? dv - j0 : kCols;  // valid columns of this block (a multiple of 4)
  const int n_units = (C / 16) * kPairs;

  // Coalesced copies between the shared state [dk][kColPitch] and a global [dk, dv] state.
  auto state_from_global = [&](const float* src) {
    for (int p = threadIdx.x; p < dk * (kCols / 4); p += 32 * kWarps) {
      const int i = p / (kCols / 4), c = 4 * (p % (kCols / 4));
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (src != nullptr && c < cols) v = *reinterpret_cast<const float4*>(src + i * dv + j0 + c);
      *reinterpret_cast<float4*>(S_s + i * kColPitch + c) = v;
    }
  };
  auto state_to_global = [&](auto* dst) {
    for (int p = threadIdx.x; p < dk * (kCols / 4); p += 32 * kWarps) {
      const int i = p / (kCols / 4), c = 4 * (p % (kCols / 4));
      if (c < cols) store4(dst + i * dv + j0 + c, *reinterpret_cast<const float4*>(S_s + i * kColPitch + c));
    }
  };

  state_from_global(a.init != nullptr ? a.init + doc_head * dk * dv : nullptr);
  __syncthreads();

  // This warp's state as accumulators: tile rt covers rows 16 (row_warp + 8 rt) .. + 15 and four
  // 8-column tiles from col0; element e of a tile is row (e < 2 ? g : g + 8), column 2t + e % 2.
  float S_r[kRowTiles][4][4];
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
    const int m0 = 16 * (row_warp + 8 * rt);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S_r[rt][nt][e] =
            m0 < dk ? S_s[(m0 + g + (e < 2 ? 0 : 8)) * kColPitch + col0 + 8 * nt + 2 * t + e % 2] : 0.f;
      }
    }
  }

  const int n = a.n_chunks[s];
  auto row_of_step = [&](int step) {
    const int m = a.reverse ? n - 1 - step : step;
    return (static_cast<int64_t>(a.step_off[m]) + s) * a.H + head;
  };
  // dO's rows of chunk row r (through the row map, zeros for −1) and this block's columns.
  auto stage_do = [&](int64_t r) {
    for (int p = threadIdx.x; p < C * (kCols / 4); p += 32 * kWarps) {
      const int i = p / (kCols / 4), c = 4 * (p % (kCols / 4));
      const int64_t src_row = a.dO_rows != nullptr ? a.dO_rows[r * C + i] : r * C + i;
      const bool valid = src_row >= 0 && c < cols;
      cp_async16_zfill(dO_s + i * kColPitch + c, valid ? a.dO + src_row * dv + j0 + c : a.dO, valid);
    }
  };
  auto stage_p = [&](int64_t r) {
    stage_rows(P_s, pitch_p, in_p() + r * C * dk, dk, C, dk);
    if constexpr (kFused) {
      stage_rows(Qg_s, pitch_q, a.Qg_bf16 + r * C * dk, dk, C, dk);
      stage_rows(Pm_s, pitch_m, a.Pm_bf16 + r * C * C, C, C, C);
      stage_do(r);
    }
  };
  auto stage_q = [&](int64_t r) { stage_rows(Q_s, pitch_q, in_q() + r * C * dk, dk, C, dk); };
  // The chunk rows of this step and the next: the next one's offset is read from global memory as
  // a step starts and first used after phase 1 (staging P), so its latency hides behind phases 0
  // and 1 instead of stalling every thread before each staging.
  int64_t r_next = n > 0 ? row_of_step(0) : 0;
  if (n > 0) {
    stage_p(r_next);
    cp_async_commit();
    stage_q(r_next);
    cp_async_commit();
  }

  for (int step = 0; step < n; ++step) {
    const int64_t r = r_next;
    r_next = step + 1 < n ? row_of_step(step + 1) : r;

    // Phase 0: the state this step starts from; E (in blocks of up to 16 warps) and decay start
    // loading for phase 2. The 24- and 32-warp blocks have too few registers to carry E through
    // phase 1, so they load it as phase 2 starts.
    state_to_global(out_state() + r * dk * dv);
    float E_r[kRowTiles][4][4];
    auto load_e = [&] {
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) {
        const int m0 = 16 * (row_warp + 8 * rt);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int c = col0 + 8 * nt + 2 * t;
            float2 e = make_float2(0.f, 0.f);
            if (kHasE && m0 < dk && c < cols) {
              e = *reinterpret_cast<const float2*>(a.E + (r * dk + m0 + g + 8 * h) * dv + j0 + c);
            }
            E_r[rt][nt][2 * h] = e.x;
            E_r[rt][nt][2 * h + 1] = e.y;
          }
        }
      }
    };
    constexpr bool kEarlyE = kWarps <= 16 && !kFused;  // the fused form computes E in phase 1
    if (kEarlyE) load_e();
    const float dec = __ldg(a.decay + r);
    // A's values at this thread's y positions (unit u, column tile h, row half): [u][h][half]. bf16
    // pairs stay raw until used after phase 1's products, so the loads are in flight through them
    // (a conversion right after each load waited for it).
    typename std::conditional<kBf16A, uint32_t, float2>::type A_r[kUnits][2][2];
#pragma unroll
    for (int u = 0; u < kUnits && !kFused; ++u) {
      const int unit = warp + kWarps * u;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = 16 * (unit / kPairs) + g + 8 * half, c = 16 * (unit % kPairs) + 8 * h + 2 * t;
          const bool valid = unit < n_units && c < cols;
          const int64_t at = (r * C + row) * dv + j0 + c;
          if constexpr (kBf16A) {
            A_r[u][h][half] = valid ? *reinterpret_cast<const uint32_t*>(a.A_bf16 + at) : 0u;
          } else {
            A_r[u][h][half] = valid ? *reinterpret_cast<const float2*>(a.A + at) : make_float2(0.f, 0.f);
          }
        }
      }
    }

    // Phase 1: y = A + sign_p · P S.
    cp_async_wait<1>();  // P (Q may still be in flight)
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int unit = warp + kWarps * u;
      if (unit < n_units) {
        const int m0 = 16 * (unit / kPairs), n0 = 16 * (unit % kPairs);
        float big[2][4] = {}, cross[2][4] = {};
        if constexpr (kFused) {
          // The A term s Pmᵀ dO first, into `big`, which the products below then add to (y = A + P S:
          // the fused form's sign_p is +1). Pmᵀ's rows m0.. are zero before column m0.
          for (int k0 = m0; k0 < C; k0 += 8) {
            const FragA fa = transposed_bf16_frag(Pm_s + (k0 + t) * pitch_m + m0 + g, pitch_m);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const FragB fb = load_b<false>(dO_s, kColPitch, k0, n0 + 8 * h, g, t);
              mma_tf32(big[h], fa.big, fb.big);
            }
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 4; ++e) big[h][e] *= a.out_scale;
          }
        }
        // The A fragment of the k-step at k0: rows m0 + g, m0 + g + 8 at columns k0 + t, k0 + t + 4.
        auto a_frag = [&](int k0) {
          FragA fa;
          if constexpr (kBf16In) {
            const uint16_t* p = P_s + (m0 + g) * pitch_p + k0 + t;  // widened: exact TF32 values
            fa.big[0] = widen_bf16(p[0]);
            fa.big[1] = widen_bf16(p[8 * pitch_p]);
            fa.big[2] = widen_bf16(p[4]);
            fa.big[3] = widen_bf16(p[8 * pitch_p + 4]);
          } else {
            // Lane l addresses row (l % 8) + 8 (l / 8 % 2) at column k0 + 4 (l / 16) of the tile.
            const float* p = P_s + (m0 + lane % 8 + 8 * (lane / 8 % 2)) * pitch_p + k0 + 4 * (lane / 16);
            uint32_t raw[4];
            ldmatrix_x4_b16(raw, p);  // read as fp32: four 8 × 4 blocks, lane 4g + t gets (g, t) of each
#pragma unroll
            for (int e = 0; e < 4; ++e) to_tf32<kSplit>(__uint_as_float(raw[e]), fa.big[e], fa.small[e]);
          }
          return fa;
        };
        // Two k-steps per iteration (dk is a multiple of 16). With one product per k-step, the odd
        // steps accumulate into `cross` (unused then): two dependency chains of dk / 16 products
        // per tile instead of one of dk / 8.
        for (int k0 = 0; k0 < dk; k0 += 16) {
#pragma unroll
          for (int kk = 0; kk < 16; kk += 8) {
            const FragA fa = a_frag(k0 + kk);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const FragB fb = load_b<kSplit>(S_s, kColPitch, k0 + kk, n0 + 8 * h, g, t);
              if constexpr (kSplit) {
                mma_products<true>(big[h], cross[h], fa, fb);
              } else {
                mma_tf32(kk == 0 ? big[h] : cross[h], fa.big, fb.big);
              }
            }
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = n0 + 8 * h + 2 * t;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = m0 + g + 8 * half;
            float2 av;
            if constexpr (kFused) {
              av = make_float2(0.f, 0.f);  // already in big
            } else if constexpr (kBf16A) {
              const uint32_t bits = A_r[u][h][half];
              av = make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
            } else {
              av = A_r[u][h][half];
            }
            float2 y;
            y.x = av.x + a.sign_p * (big[h][2 * half] + cross[h][2 * half]);
            y.y = av.y + a.sign_p * (big[h][2 * half + 1] + cross[h][2 * half + 1]);
            uint2 yb, ys;
            to_tf32<kSplit>(a.sign_q * y.x, yb.x, ys.x);
            to_tf32<kSplit>(a.sign_q * y.y, yb.y, ys.y);
            *reinterpret_cast<uint2*>(yb_s + row * kColPitch + c) = yb;
            if (kSplit) *reinterpret_cast<uint2*>(ys_s + row * kColPitch + c) = ys;
            if (c < cols) store2(out_y() + (r * C + row) * dv + j0 + c, y);
          }
        }
      }
    }
    if constexpr (kFused) {
      // E = s Qgᵀ dO for this warp's phase-2 state tiles, and the state's decay with it.
      float e_acc[kRowTiles][4][4] = {};
      for (int k0 = 0; k0 < C; k0 += 8) {
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt) {
          const int m0 = 16 * (row_warp + 8 * rt);
          if (m0 < dk) {
            const FragA fa = transposed_bf16_frag(Qg_s + (k0 + t) * pitch_q + m0 + g, pitch_q);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              const FragB fb = load_b<false>(dO_s, kColPitch, k0, col0 + 8 * nt, g, t);
              mma_tf32(e_acc[rt][nt], fa.big, fb.big);
            }
          }
        }
      }
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) S_r[rt][nt][e] = dec * S_r[rt][nt][e] + a.out_scale * e_acc[rt][nt][e];
        }
      }
    }
    __syncthreads();  // y is complete; P (and the fused form's Qg, Pm and dO) is read
    if (step + 1 < n) stage_p(r_next);
    cp_async_commit();
    cp_async_wait<1>();  // Q of this step
    __syncthreads();

    // Phase 2: S = decay · S + E + Qᵀ (sign_q · y) for this warp's rows.
    if (!kEarlyE && !kFused) load_e();
    float cross_s[kRowTiles][4][4];
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (!kFused) S_r[rt][nt][e] = dec * S_r[rt][nt][e] + E_r[rt][nt][e];  // the fused form: in phase 1
          cross_s[rt][nt][e] = 0.f;
        }
      }
    }
    for (int k0 = 0; k0 < C; k0 += 8) {
      FragB fb[4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int at0 = (k0 + t) * kColPitch + col0 + 8 * nt + g, at1 = at0 + 4 * kColPitch;
        fb[nt].big[0] = yb_s[at0];
        fb[nt].big[1] = yb_s[at1];
        if (kSplit) {
          fb[nt].small[0] = ys_s[at0];
          fb[nt].small[1] = ys_s[at1];
        }
      }
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) {
        const int m0 = 16 * (row_warp + 8 * rt);
        if (m0 < dk) {
          // Qᵀ as the A operand: element (row i, column c) is Q[c][i].
          const TIn* q = Q_s + (k0 + t) * pitch_q + m0 + g;
          FragA fa;
          if constexpr (kBf16In) {
            fa = transposed_bf16_frag(q, pitch_q);
          } else {
            to_tf32<kSplit>(q[0], fa.big[0], fa.small[0]);
            to_tf32<kSplit>(q[8], fa.big[1], fa.small[1]);
            to_tf32<kSplit>(q[4 * pitch_q], fa.big[2], fa.small[2]);
            to_tf32<kSplit>(q[4 * pitch_q + 8], fa.big[3], fa.small[3]);
          }
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_products<kSplit>(S_r[rt][nt], cross_s[rt][nt], fa, fb[nt]);
        }
      }
    }
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt) {
      const int m0 = 16 * (row_warp + 8 * rt);
      if (m0 < dk) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            S_r[rt][nt][2 * half] += cross_s[rt][nt][2 * half];
            S_r[rt][nt][2 * half + 1] += cross_s[rt][nt][2 * half + 1];
            *reinterpret_cast<float2*>(S_s + (m0 + g + 8 * half) * kColPitch + col0 + 8 * nt + 2 * t) =
                make_float2(S_r[rt][nt][2 * half], S_r[rt][nt][2 * half + 1]);
          }
        }
      }
    }
    __syncthreads();  // the state is final; Q and y are read
    if (step + 1 < n) stage_q(r_next);
    cp_async_commit();
  }
  cp_async_wait<0>();
  state_to_global(a.final_state + doc_head * dk * dv);
}

using ScanKernel = void (*)(GdrScanArgs);

// The kernel for these template sizes, allowed the shared memory it needs on the current device.
template <int kWarps, int kUnits, int kRowTiles, bool kHasE, bool kSplit, bool kBf16Out = false, bool kBf16In = false,
          bool kFused = false>
ScanKernel opted_in_kernel() {
  ScanKernel f = gdr_scan_mma_kernel<kWarps, kUnits, kRowTiles, kHasE, kSplit, kBf16Out, kBf16In, kFused>;
  allow_dynamic_smem(reinterpret_cast<const void*>(f), static_cast<int>(kGdrScanMmaMaxSmem));
  return f;
}

// The instantiation for a's E (the forward scan has none, and its kernel keeps no registers for
// it), product mode, input and output types (bf16 outputs: the forward in TF32 mode only; bf16
// inputs: the two forms of GdrScanArgs::P_bf16, and the fused backward form, GdrScanArgs::dO;
// null otherwise).
template <int kWarps, int kUnits, int kRowTiles>
ScanKernel kernel_flagged(const GdrScanArgs& a) {
  if (gdr_scan_reads_output_grad(a)) {
    if (!gdr_scan_fused_form_ok(a) || a.dO == nullptr) return nullptr;  // a bf16 dO: the bf16 products' kernel
    return a.out_y_bf16 != nullptr ? opted_in_kernel<kWarps, kUnits, kRowTiles, false, false, true, true, true>()
                                   : opted_in_kernel<kWarps, kUnits, kRowTiles, false, false, false, true, true>();
  }
  if (!gdr_scan_bf16_inputs_ok(a)) return nullptr;
  if (a.P_bf16 != nullptr) {
    if (a.tf32x3) return nullptr;
    return a.E == nullptr ? opted_in_kernel<kWarps, kUnits, kRowTiles, false, false, true, true>()
                          : opted_in_kernel<kWarps, kUnits, kRowTiles, true, false, false, true>();
  }
  if (a.out_state_bf16 != nullptr || a.out_y_bf16 != nullptr) {
    if (a.E != nullptr || a.tf32x3 || a.out_state_bf16 == nullptr || a.out_y_bf16 == nullptr) return nullptr;
    return opted_in_kernel<kWarps, kUnits, kRowTiles, false, false, true>();
  }
  if (a.E != nullptr) {
    return a.tf32x3 ? opted_in_kernel<kWarps, kUnits, kRowTiles, true, true>()
                    : opted_in_kernel<kWarps, kUnits, kRowTiles, true, false>();
  }
  return a.tf32x3 ? opted_in_kernel<kWarps, kUnits, kRowTiles, false, true>()
                  : opted_in_kernel<kWarps, kUnits, kRowTiles, false, false>();
}

// The instantiation for a's sizes in kWarps-warp blocks. The 24- and 32-warp blocks take one unit
// and one row tile only (gdr_scan_mma_supports).
template <int kWarps>
ScanKernel kernel_sized(const GdrScanArgs& a) {
  if constexpr (kWarps > 16) {
    return kernel_flagged<kWarps, 1, 1>(a);
  } else {
    const bool two_units = a.C > 64, two_row_tiles = a.dk > 128;
    if (two_units) return two_row_tiles ? kernel_flagged<kWarps, 2, 2>(a) : kernel_flagged<kWarps, 2, 1>(a);
    return two_row_tiles ? kernel_flagged<kWarps, 1, 2>(a) : kernel_flagged<kWarps, 1, 1>(a);
  }
}

ScanKernel kernel_for_width(const GdrScanArgs& a, int cols) {
  switch (cols) {
    case 128: return kernel_sized<32>(a);
    case 96: return kernel_sized<24>(a);
    case 64: return kernel_sized<16>(a);
    default: return kernel_sized<8>(a);
  }
}

}  // namespace

int gdr_scan_tensor_cores(const GdrScanArgs& a, int cols, void* stream) {
  const bool fused = gdr_scan_reads_output_grad(a);
  if ((cols != 32 && cols != 64 && cols != 96 && cols != 128) || !gdr_scan_mma_supports(a.C, a.dk, a.dv, cols) ||
      a.n_docs < 1 || a.H < 1 || (fused && gdr_scan_fused_smem_bytes(a.C, a.dk, cols) > kGdrScanMmaMaxSmem)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const dim3 grid(static_cast<unsigned>(a.n_docs * a.H), static_cast<unsigned>((a.dv + cols - 1) / cols));
  const dim3 block(static_cast<unsigned>(8 * cols));  // 32 · kWarps threads, kWarps = cols / 4
  const ScanKernel kernel = kernel_for_width(a, cols);
  if (kernel == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  GdrScanArgs args = a;
  void* params[] = {&args};
  const int64_t smem =
      fused ? gdr_scan_fused_smem_bytes(a.C, a.dk, cols) : gdr_scan_mma_smem_bytes(a.C, a.dk, cols, a.P_bf16 != nullptr);
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, params,
                                           static_cast<size_t>(smem), static_cast<cudaStream_t>(stream)));
}

int gdr_scan_mma_width(const GdrScanArgs& a) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return gdr_scan_mma_width_for(a.C, a.dk, a.dv, gdr_scan_width_doc_heads(a), sms, a.P_bf16 != nullptr);
}

int gdr_scan_fused_width(const GdrScanArgs& a) {
  if (a.tf32x3 || !gdr_scan_supports(a.C, a.dk) || a.n_docs < 1 || a.H < 1) return 0;
  int cols = 0;
  switch (a.variant) {
    case kGdrScanAuto: {
      int device = 0, sms = 0;
      if (cudaGetDevice(&device) != cudaSuccess ||
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        return 0;
      }
      return gdr_scan_mma_width_for(a.C, a.dk, a.dv, gdr_scan_width_doc_heads(a), sms, true, true);
    }
    case kGdrScanTensorCores32: cols = 32; break;
    case kGdrScanTensorCores64: cols = 64; break;
    case kGdrScanTensorCores96: cols = 96; break;
    case kGdrScanTensorCores128: cols = 128; break;
    default: return 0;  // the FMA kernels have no fused form
  }
  return gdr_scan_mma_supports(a.C, a.dk, a.dv, cols) && gdr_scan_fused_smem_bytes(a.C, a.dk, cols) <= kGdrScanMmaMaxSmem
             ? cols
             : 0;
}

}  // namespace kernels

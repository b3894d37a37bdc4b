// The fused backward form of the chunk-state scan (kernels/gdr_scan.h, GdrScanArgs::dO) with its
// four products as bf16 mma.sync m16n8k16 (GdrScanArgs::bf16_products). Per reverse step, for a
// block's `cols` columns of the state gradient S (dh, fp32 in registers):
//   dVn = s Pmᵀ dO                       [C, cols]   (Pm zero above its diagonal)
//   y   = dVn + Kd S                     [C, cols]   (y = dU, written out)
//   S   = decay · S + s Qgᵀ dO − Wᵀ y    [dk, cols]
// gdr_scan_mma.cu takes the same four products in TF32 (m16n8k8), its operands widened from bf16
// (Pm, Qg, Kd, W) or rounded to TF32 (dO, S, y) and read from shared memory a value at a time.
// Here dO, S and y are rounded to bf16 as operands, as Pm, Qg, Kd and W already are, and every
// fragment comes in by ldmatrix: half the mma instructions and about half the shared-memory
// wavefronts a step, which bound that kernel. Sums stay fp32 and so does the running state; what
// changes is the operands' rounding, 2⁻⁹ relative where TF32 has 2⁻¹¹ (the test bounds the
// difference, and training's loss is compared in docs/perf.md).
//
// Same blocks and steps as the TF32 kernel: one block of 8, 16, 24 or 32 warps owns one (document,
// head) and 4 · warps state columns. Phase 1: warp w takes the 16 × 16 tile of y (row tile w / (cols
// / 16), column pair w % (cols / 16)), then E = s Qgᵀ dO for its phase-2 tile, folded into the state
// as decay · S + E. Phase 2: warp w updates state rows 16 (w % 8).. and columns 32 (w / 8).. by
// −Wᵀ y and writes them to the shared bf16 copy of S, the next step's phase-1 operand and the
// source of the out_state rows (dh_next, bf16 either way). One unit of y and one state tile per
// warp: C ≤ 64, dk ≤ 128 (gdr_scan_fused_bf16_supports).
//
// The forward form (kForward; GdrScanArgs::bf16_products with the forward's bf16 pointers) runs the
// same loop with two products a step and no dO: y = A + sign_p · W S (A = U, sign_p = −1) and
// S = decay · S + sign_q · Kdᵀ y, the state and y rounded to bf16 as operands. Those are the values
// the forward writes anyway (out_state and out_y in bf16); gdr_scan_mma.cu's TF32 forward takes
// them rounded to TF32 instead, and each of its fragments costs a shared load and a rounding per
// element (the TF32 kernel issued about 12 instructions per mma there, which bound its step).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_head_sizes.h"
#include "kernels/gdr_scan.h"
#include "kernels/gdr_scan_stage.cuh"
#include "kernels/ldmatrix.cuh"
#include "kernels/smem_opt_in.cuh"
#include "kernels/tf32_mma.cuh"

namespace kernels {

namespace {

using gdr_chunk_mma::Frag16A;
using gdr_chunk_mma::Frag16B;
using Bf16 = __nv_bfloat16;

// Pitches in elements. 16-bit rows are padded to an odd number of 16-byte units (conflict-free
// ldmatrix); dO's fp32 rows by 4 floats (16 bytes, cp.async's alignment).
__host__ __device__ constexpr int pitch16(int n) { return n + 8; }
__host__ __device__ constexpr int pitch_do(int cols) { return cols + 4; }

// Byte offsets of the shared regions; their sum is gdr_scan_fused_bf16_smem_bytes, or for the
// forward form (S, y, then P and Q: no dO, its bf16 copy, Qg or Pm) gdr_scan_forward_bf16_smem_bytes.
struct Layout {
  int64_t S, y, dOb, P, Q, Qg, Pm, dO, total;
};
__host__ __device__ constexpr Layout forward_layout_of(int64_t C, int64_t dk, int64_t cols) {
  Layout l{};
  l.S = 0;                                  // bf16 [dk][cols + 8]: S rounded
  l.y = l.S + dk * pitch16(cols) * 2;       // bf16 [C][cols + 8]: sign_q · y rounded
  l.P = l.y + C * pitch16(cols) * 2;        // bf16 [C][dk + 8]: W
  l.Q = l.P + C * pitch16(dk) * 2;          // bf16 [C][dk + 8]: Kd
  l.dOb = l.Qg = l.Pm = l.dO = l.Q + C * pitch16(dk) * 2;  // none
  l.total = l.dO;
  return l;
}
static_assert(forward_layout_of(64, 128, 128).total == gdr_scan_forward_bf16_smem_bytes(64, 128, 128) &&
                  forward_layout_of(32, 80, 32).total == gdr_scan_forward_bf16_smem_bytes(32, 80, 32),
              "the forward layout and the header's size agree");
// dO_bf16: dO comes in bf16 (GdrScanArgs::dO_bf16), staged straight into dOb; no fp32 region.
__host__ __device__ constexpr Layout layout_of(int64_t C, int64_t dk, int64_t cols, bool dO_bf16 = false) {
  Layout l{};
  l.S = 0;                                                  // bf16 [dk][cols + 8]: S rounded
  l.y = l.S + dk * pitch16(cols) * 2;                       // bf16 [C][cols + 8]: −y rounded
  l.dOb = l.y + C * pitch16(cols) * 2;                      // bf16 [C][cols + 8]: dO rounded
  l.P = l.dOb + C * pitch16(cols) * 2;                      // bf16 [C][dk + 8]: Kd
  l.Q = l.P + C * pitch16(dk) * 2;                          // bf16 [C][dk + 8]: W
  l.Qg = l.Q + C * pitch16(dk) * 2;                         // bf16 [C][dk + 8]
  l.Pm = l.Qg + C * pitch16(dk) * 2;                        // bf16 [C][C + 8]
  l.dO = l.Pm + C * pitch16(C) * 2;                         // fp32 [C][cols + 4], as staged
  l.total = l.dO + (dO_bf16 ? 0 : C * pitch_do(static_cast<int>(cols)) * 4);
  return l;
}
static_assert(layout_of(64, 128, 128).total == gdr_scan_fused_bf16_smem_bytes(64, 128, 128) &&
                  layout_of(32, 80, 32).total == gdr_scan_fused_bf16_smem_bytes(32, 80, 32) &&
                  layout_of(64, 96, 96, true).total == gdr_scan_fused_bf16_smem_bytes(64, 96, 96, true),
              "the layout and the header's size agree");

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// threadIdx.x by a volatile read, which the compiler neither hoists out of a loop nor keeps live
// across one (for offsets cheaper to recompute than to hold in a register).
__device__ __forceinline__ int thread_index_now() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  gdr_chunk_mma::mma16<Bf16>(d, Frag16A{{a[0], a[1], a[2], a[3]}}, Frag16B{{b0, b1}});
}

// kC, kDK: the chunk and key head size known at compile time (kernels/gdr_head_sizes.h; the
// k-loops over C and dk then have constant bounds), 0: a.C and a.dk.
// kDO16: the backward's dO in bf16 (GdrScanArgs::dO_bf16; with bf16 y, the 16-bit path's form), an
// instance of its own so that it carries no fp32 staging.
template <int kWarps, bool kBf16Y, bool kForward, int kC = 0, int kDK = 0, bool kDO16 = false>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 8 ? 2 : 1)
    gdr_scan_fused_bf16_kernel(GdrScanArgs a, TileWalk walk_dk, TileWalk walk_c) {
  static_assert(!kForward || kBf16Y, "the forward form writes y in bf16");
  static_assert(!kDO16 || (kBf16Y && !kForward), "a bf16 dO: the backward with bf16 y");
  constexpr int kThreads = 32 * kWarps, kCols = 4 * kWarps, kPairs = kCols / 16;
  constexpr int kPs = pitch16(kCols), kPdo = pitch_do(kCols);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int dk = kDK > 0 ? kDK : static_cast<int>(a.dk), C = kC > 0 ? kC : static_cast<int>(a.C);
  // Offsets within one chunk row's tiles fit 32 bits (C, dk and dv are head sizes): the loop's
  // address arithmetic is 32-bit from 64-bit row bases worked out once a step. 64-bit throughout,
  // with a division per staged piece, it took most of the loop's instructions (docs/perf.md, stop 52).
  const int64_t dv = a.dv;
  const int ldv = static_cast<int>(dv);
  const int pk = pitch16(dk), pc = pitch16(C);
  // With kDO16 dO is staged into dOb_s as it comes: no fp32 copy to round a step.
  const Layout L = kForward ? forward_layout_of(C, dk, kCols) : layout_of(C, dk, kCols, kDO16);
  uint16_t* S_s = reinterpret_cast<uint16_t*>(smem_raw + L.S);
  uint16_t* y_s = reinterpret_cast<uint16_t*>(smem_raw + L.y);
  uint16_t* dOb_s = reinterpret_cast<uint16_t*>(smem_raw + L.dOb);
  uint16_t* P_s = reinterpret_cast<uint16_t*>(smem_raw + L.P);
  uint16_t* Q_s = reinterpret_cast<uint16_t*>(smem_raw + L.Q);
  uint16_t* Qg_s = reinterpret_cast<uint16_t*>(smem_raw + L.Qg);
  uint16_t* Pm_s = reinterpret_cast<uint16_t*>(smem_raw + L.Pm);
  float* dO_s = reinterpret_cast<float*>(smem_raw + L.dO);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  // Phase 2's tile: state rows s_m0.. (16), columns col0.. (32); phase 1's unit of y.
  const int s_m0 = 16 * (warp % 8), col0 = 32 * (warp / 8);
  const bool has_state_tile = s_m0 < dk;
  const int y_m0 = 16 * (warp / kPairs), y_n0 = 16 * (warp % kPairs);
  const bool has_y_unit = y_m0 < C;
  const int doc_head = static_cast<int>(blockIdx.x);
  const int doc = doc_head / static_cast<int>(a.H), head = doc_head % static_cast<int>(a.H);
  const int j0 = static_cast<int>(blockIdx.y) * kCols;
  const int cols = ldv - j0 < kCols ? ldv - j0 : kCols;  // valid columns (a multiple of 4)

  // The running state as mma accumulators: element e of tile nt is row s_m0 + g (+ 8 for e ≥ 2),
  // column col0 + 8 nt + 2t + e % 2. Written to S_s rounded after each update.
  float S_r[4][4];
  auto state_to_shared = [&] {
    if (!has_state_tile) return;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<uint32_t*>(S_s + (s_m0 + g + 8 * h) * kPs + col0 + 8 * nt + 2 * t) =
            bf16_pair(S_r[nt][2 * h], S_r[nt][2 * h + 1]);
      }
    }
  };
  // The state's rows in global layout [dk, dv] at the tile's fragment positions (init and final:
  // fp32, read and written once a block).
  auto state_tile_io = [&](auto f) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = col0 + 8 * nt + 2 * t;
        f(nt, h, static_cast<int64_t>(s_m0 + g + 8 * h) * dv + j0 + c, has_state_tile && c < cols);
      }
    }
  };
  // acc += Xᵀ B for this warp's state tile: X [C][dk] (Qg or W), B [C][cols] (dO or −y), both
  // bf16 rows of the chunk, over the chunk's C rows in k-steps of 16.
  auto state_tile_accumulate = [&](float(&acc)[4][4], const uint16_t* X_s, const uint16_t* B_s) {
    uint32_t fa[4], fb[4];
    for (int k0 = 0; k0 < C; k0 += 16) {
      ldsm_a_of_transposed(fa, X_s, pk, s_m0, k0, lane);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        ldsm_b_pair(fb, B_s, kPs, k0, col0 + 16 * pair, lane);
        mma_bf16(acc[2 * pair], fa, fb[0], fb[1]);
        mma_bf16(acc[2 * pair + 1], fa, fb[2], fb[3]);
      }
    }
  };
  const float* init = a.init != nullptr ? a.init + static_cast<int64_t>(doc_head) * dk * dv : nullptr;
  state_tile_io([&](int nt, int h, int64_t at, bool valid) {
    const float2 v = valid && init != nullptr ? *reinterpret_cast<const float2*>(init + at) : make_float2(0.f, 0.f);
    S_r[nt][2 * h] = v.x;
    S_r[nt][2 * h + 1] = v.y;
  });
  state_to_shared();

  const int n = a.n_chunks[doc];
  auto row_of_step = [&](int step) {
    const int m = a.reverse ? n - 1 - step : step;
    return (static_cast<int64_t>(a.step_off[m]) + doc) * a.H + head;
  };
  // Kd, Qg, Pm and dO of chunk row r (dO through the row map, zeros for −1), then W apart: W is
  // phase 2's only input, and comes in while phase 1 runs. The forward: W, then Kd apart.
  // The [C][dk] tiles (Kd, W, Qg) and the [C][C] one (Pm) by their walks (kernels/gdr_scan_stage.cuh).
  // A thread's first piece of each walk. The forward and the bf16-dO backward work it out at each
  // use from the thread index read anew (thread_index_now), dividing by a row's count of 16-byte
  // pieces as a constant where the instance knows the head sizes. Held in registers through the
  // loop, these offsets made their 24-warp instances spill (the forward 16 bytes, the bf16-dO
  // reverse 68) and cost time (the reverse scan 1.49 against 1.30 ms a step at hybrid base); now
  // neither spills. The fp32-dO backward keeps them held (recomputed, bench gdr's 32-warp instance
  // spilled 20 bytes where it spills none).
  constexpr bool kRecompute = kForward || kDO16;
  const int tid = static_cast<int>(threadIdx.x);
  const int dk_row0 = tid / walk_dk.n, dk_col0 = tid % walk_dk.n, c_row0 = tid / walk_c.n, c_col0 = tid % walk_c.n;
  auto first_piece = [&](const TileWalk& walk, int known_n, int kept_row, int kept_col, int& row, int& col) {
    if constexpr (kRecompute) {
      const int thread = thread_index_now(), per_row = known_n > 0 ? known_n : walk.n;
      row = thread / per_row;
      col = thread % per_row;
    } else {
      row = kept_row;
      col = kept_col;
    }
  };
  // With C and dk known (the fixed-size instances) a tile's walk is known too: kThreads is a multiple
  // of a row's pieces, so each thread keeps its column and its row moves by a constant (one piece a
  // thread for the 24-warp block's [64][96] tiles), in place of the run-time walk's counters and
  // wrap test. (Counting its passes at compile time, so that the loop unrolls whole, made both
  // scans slower: docs/perf.md, stop 55.)
  auto walk_known = [&](auto rows_tag, auto per_row_tag, auto f) {
    constexpr int kRows = decltype(rows_tag)::value, kPer = decltype(per_row_tag)::value;
    static_assert(kThreads % kPer == 0, "a thread keeps its column");
    const int thread = thread_index_now();
#pragma unroll
    for (int row = thread / kPer; row < kRows; row += kThreads / kPer) f(row, thread % kPer);
  };
  // (The fp32-dO backward keeps its held offsets and run-time walks, as above.)
  constexpr bool kKnownWalks =
      kRecompute && kC > 0 && kDK > 0 && kThreads % (kDK > 0 ? kDK / 8 : 1) == 0 &&
      kThreads % (kC > 0 ? kC / 8 : 1) == 0;
  // A [C][8 · pieces] tile by 16-byte copies from src (rows of src_pitch) into dst (rows of
  // dst_pitch): by the known walk, or by the run-time one from the thread's first piece.
  auto stage_tile = [&](auto pieces_tag, const TileWalk& walk, int kept_row, int kept_col, uint16_t* dst,
                        int dst_pitch, const uint16_t* src, int src_pitch) {
    auto copy = [&](int row, int col) { cp_async16(dst + row * dst_pitch + 8 * col, src + row * src_pitch + 8 * col); };
    if constexpr (kKnownWalks) {
      walk_known(std::integral_constant<int, kC>{}, pieces_tag, copy);
    } else {
      int row0, col0;
      first_piece(walk, decltype(pieces_tag)::value, kept_row, kept_col, row0, col0);
      walk_tile<kThreads>(walk, row0, col0, copy);
    }
  };
  auto stage_dk_tile = [&](uint16_t* dst, const uint16_t* src) {
    stage_tile(std::integral_constant<int, kDK / 8>{}, walk_dk, dk_row0, dk_col0, dst, pk, src, dk);
  };
  auto stage_p = [&](int64_t r) {
    stage_dk_tile(P_s, a.P_bf16 + r * C * dk);
    if constexpr (kForward) return;
    stage_dk_tile(Qg_s, a.Qg_bf16 + r * C * dk);
    stage_tile(std::integral_constant<int, kC / 8>{}, walk_c, c_row0, c_col0, Pm_s, pc, a.Pm_bf16 + r * C * C, C);
    if constexpr (kDO16) {  // 8 bf16 a copy (cols is a multiple of 8 here: dv is, and so is j0)
      const uint16_t* dO_cols = a.dO_bf16 + j0;
      // The thread index read anew each step, as for the walks above.
      for (int p = thread_index_now(); p < C * (kCols / 8); p += kThreads) {
        const int i = p / (kCols / 8), c = 8 * (p % (kCols / 8));
        const int64_t src_row = a.dO_rows != nullptr ? a.dO_rows[r * C + i] : r * C + i;
        const bool valid = src_row >= 0 && c < cols;
        const uint16_t* src = valid ? dO_cols + src_row * dv + c : a.dO_bf16;
        cp_async16_zfill(reinterpret_cast<float*>(dOb_s + i * kPs + c), reinterpret_cast<const float*>(src), valid);
      }
    } else {
      const float* dO_cols = a.dO + j0;
      for (int p = threadIdx.x; p < C * (kCols / 4); p += kThreads) {
        const int i = p / (kCols / 4), c = 4 * (p % (kCols / 4));
        const int64_t src_row = a.dO_rows != nullptr ? a.dO_rows[r * C + i] : r * C + i;
        const bool valid = src_row >= 0 && c < cols;
        cp_async16_zfill(dO_s + i * kPdo + c, valid ? dO_cols + src_row * dv + c : a.dO, valid);
      }
    }
  };
  auto stage_q = [&](int64_t r) { stage_dk_tile(Q_s, a.Q_bf16 + r * C * dk); };
  auto out_y = [&] {
    if constexpr (kBf16Y) return a.out_y_bf16;
    else return a.out_y;
  };

  int64_t r_next = n > 0 ? row_of_step(0) : 0;
  if (n > 0) {
    stage_p(r_next);
    cp_async_commit();
    stage_q(r_next);
    cp_async_commit();
  }
  __syncthreads();  // S_s holds the initial state

  for (int step = 0; step < n; ++step) {
    const int64_t r = r_next;
    r_next = step + 1 < n ? row_of_step(step + 1) : r;

    // Phase 0: the state gradient this step starts from (dh_next; the forward: h_in), from the
    // rounded copy: the same bits as rounding the fp32 state.
    // 8-byte pieces, kCols / 4 = kWarps of them a row: the block's 32 · kWarps threads take 32 rows a
    // pass, each thread the same column in every pass, so only the row moves (a division and the
    // row and column arithmetic for every piece cost the forward about 50 of its 450 instructions a
    // warp and step). The fp32-dO backward keeps the loop by pieces: the held column and pointers
    // made its instances spill.
    if constexpr (kRecompute) {
      const int thread = thread_index_now(), c = 4 * (thread % kWarps);
      if (c < cols) {
        uint16_t* out_state = a.out_state_bf16 + r * dk * dv + j0 + c;
        const uint16_t* from = S_s + c;
        for (int i = thread / kWarps; i < dk; i += 32) {
          *reinterpret_cast<uint2*>(out_state + i * ldv) = *reinterpret_cast<const uint2*>(from + i * kPs);
        }
      }
    } else {
      uint16_t* out_state = a.out_state_bf16 + r * dk * dv + j0;
      for (int p = tid; p < dk * (kCols / 4); p += kThreads) {
        const int i = p / (kCols / 4), c = 4 * (p % (kCols / 4));
        if (c < cols) {
          *reinterpret_cast<uint2*>(out_state + i * ldv + c) = *reinterpret_cast<const uint2*>(S_s + i * kPs + c);
        }
      }
    }
    const int64_t rows_at = r * C * dv + j0;  // this step's chunk rows [C, dv] from column j0
    const float dec = __ldg(a.decay + r);
    // The forward's A (U) at this thread's y positions [column tile h][row half], raw bf16 pairs:
    // loaded here so they are in flight through phase 1's products.
    uint32_t A_r[2][2] = {};
    if constexpr (kForward) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = y_m0 + g + 8 * half, c = y_n0 + 8 * h + 2 * t;
          if (has_y_unit && c < cols) {
            A_r[h][half] = *reinterpret_cast<const uint32_t*>(a.A_bf16 + rows_at + row * ldv + c);
          }
        }
      }
    }

    cp_async_wait<1>();  // Kd, Qg, Pm, dO (W may still be in flight); the forward: W
    __syncthreads();
    if constexpr (!kForward && !kDO16) {
      for (int p = threadIdx.x; p < C * (kCols / 4); p += kThreads) {
        const int i = p / (kCols / 4), c = 4 * (p % (kCols / 4));
        const float4 v = *reinterpret_cast<const float4*>(dO_s + i * kPdo + c);
        *reinterpret_cast<uint2*>(dOb_s + i * kPs + c) = make_uint2(bf16_pair(v.x, v.y), bf16_pair(v.z, v.w));
      }
      __syncthreads();
    }

    // Phase 1: y = s Pmᵀ dO + Kd S for this warp's unit; Pmᵀ's rows y_m0.. are zero before column
    // y_m0. The forward: y = A + sign_p · W S.
    if (has_y_unit) {
      float acc[2][4] = {}, acc_odd[2][4] = {};
      uint32_t fa[4], fb[4];
      if constexpr (!kForward) {
        for (int k0 = y_m0; k0 < C; k0 += 16) {
          ldsm_a_of_transposed(fa, Pm_s, pc, y_m0, k0, lane);
          ldsm_b_pair(fb, dOb_s, kPs, k0, y_n0, lane);
          mma_bf16(acc[0], fa, fb[0], fb[1]);
          mma_bf16(acc[1], fa, fb[2], fb[3]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[h][e] *= a.out_scale;
        }
      }
      // Kd S (the forward: W S): even k-steps into acc, odd ones into acc_odd (two dependency chains).
      auto kd_times_s = [&](float(&d)[2][4], int k0) {
        ldsm_a(fa, P_s, pk, y_m0, k0, lane);
        ldsm_b_pair(fb, S_s, kPs, k0, y_n0, lane);
        mma_bf16(d[0], fa, fb[0], fb[1]);
        mma_bf16(d[1], fa, fb[2], fb[3]);
      };
      for (int k0 = 0; k0 < dk; k0 += 32) {
        kd_times_s(acc, k0);
        if (k0 + 16 < dk) kd_times_s(acc_odd, k0 + 16);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = y_n0 + 8 * h + 2 * t;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = y_m0 + g + 8 * half;
          float2 y = make_float2(acc[h][2 * half] + acc_odd[h][2 * half], acc[h][2 * half + 1] + acc_odd[h][2 * half + 1]);
          if constexpr (kForward) {
            const uint32_t bits = A_r[h][half];
            y = make_float2(__uint_as_float(bits << 16) + a.sign_p * y.x,
                            __uint_as_float(bits & 0xffff0000u) + a.sign_p * y.y);
          }
          *reinterpret_cast<uint32_t*>(y_s + row * kPs + c) = bf16_pair(a.sign_q * y.x, a.sign_q * y.y);
          if (c < cols) {
            auto* dst = out_y() + rows_at + row * ldv + c;
            if constexpr (kBf16Y) {
              *reinterpret_cast<uint32_t*>(dst) = bf16_pair(y.x, y.y);
            } else {
              *reinterpret_cast<float2*>(dst) = y;
            }
          }
        }
      }
    }
    // E = s Qgᵀ dO for this warp's state tile, and the decay with it (the forward: the decay alone).
    if (kForward && has_state_tile) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) S_r[nt][e] *= dec;
      }
    } else if (has_state_tile) {
      float e_acc[4][4] = {};
      state_tile_accumulate(e_acc, Qg_s, dOb_s);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) S_r[nt][e] = dec * S_r[nt][e] + a.out_scale * e_acc[nt][e];
      }
    }
    __syncthreads();  // y is complete; Kd, Qg, Pm, dO and S_s are read (the forward: W and S_s)
    if (step + 1 < n) stage_p(r_next);
    cp_async_commit();
    cp_async_wait<1>();  // W of this step (the forward: Kd)
    __syncthreads();

    // Phase 2: S += Wᵀ (−y) for this warp's tile (the forward: Kdᵀ (sign_q · y)), then its rounded
    // copy for the next step.
    if (has_state_tile) {
      state_tile_accumulate(S_r, Q_s, y_s);
      state_to_shared();
    }
    __syncthreads();  // the state is final; W and y are read
    if (step + 1 < n) stage_q(r_next);
    cp_async_commit();
  }
  cp_async_wait<0>();
  float* fin = a.final_state + static_cast<int64_t>(doc_head) * dk * dv;
  state_tile_io([&](int nt, int h, int64_t at, bool valid) {
    if (valid) *reinterpret_cast<float2*>(fin + at) = make_float2(S_r[nt][2 * h], S_r[nt][2 * h + 1]);
  });
}

using ScanKernel = void (*)(GdrScanArgs, TileWalk, TileWalk);

// The kernel, allowed the most shared memory any size takes: an instance runs with several sizes
// (C, dk), and allow_dynamic_smem sets each (kernel, device, bytes) once, so an opt-in to each
// launch's own size would let a smaller size's opt-in stand under a larger launch (refused, invalid
// value).
template <int kWarps, bool kBf16Y, bool kForward = false, int kC = 0, int kDK = 0, bool kDO16 = false>
ScanKernel opted_in() {
  ScanKernel f = gdr_scan_fused_bf16_kernel<kWarps, kBf16Y, kForward, kC, kDK, kDO16>;
  return allow_dynamic_smem(reinterpret_cast<const void*>(f), static_cast<int>(kGdrScanMmaMaxSmem)) == 0 ? f
                                                                                                        : nullptr;
}

// The instance for a's sizes: the model's (C 64, dk 96 or 128) known at compile time where
// kernels::gdr_fixed_head_sizes is on, with bf16 y (the 16-bit path's forms); else C and dk as
// arguments.
template <int kWarps, bool kBf16Y, bool kForward, bool kDO16 = false>
ScanKernel sized(const GdrScanArgs& a) {
  if constexpr (kBf16Y) {
    if (gdr_fixed_head_sizes() && a.C == 64 && (a.dk == 96 || a.dk == 128)) {
      const ScanKernel f = a.dk == 96 ? opted_in<kWarps, true, kForward, 64, 96, kDO16>()
                                      : opted_in<kWarps, true, kForward, 64, 128, kDO16>();
      if (f != nullptr) {
        gdr_count_fixed_head_size_launch(kForward ? GdrSizedKernel::kScanForward : GdrSizedKernel::kScanReverse);
      }
      return f;
    }
  }
  return opted_in<kWarps, kBf16Y, kForward, 0, 0, kDO16>();
}

// The backward's instance: bf16 y, with a bf16 dO or not; or fp32 y (whose dO is fp32:
// gdr_scan_fused_form_ok).
template <int kWarps>
ScanKernel kernel_for(const GdrScanArgs& a) {
  if (a.out_y_bf16 == nullptr) return sized<kWarps, false, false>(a);
  return a.dO_bf16 != nullptr ? sized<kWarps, true, false, true>(a) : sized<kWarps, true, false>(a);
}

// The instance of the block width `cols` (one of the four), or null.
template <bool kForward>
ScanKernel kernel_of_width(const GdrScanArgs& a, int cols) {
  switch (cols) {
    case 32: return kForward ? sized<8, true, true>(a) : kernel_for<8>(a);
    case 64: return kForward ? sized<16, true, true>(a) : kernel_for<16>(a);
    case 96: return kForward ? sized<24, true, true>(a) : kernel_for<24>(a);
    case 128: return kForward ? sized<32, true, true>(a) : kernel_for<32>(a);
    default: return nullptr;
  }
}

int launch(ScanKernel kernel, const GdrScanArgs& a, int cols, int64_t smem, void* stream) {
  if (kernel == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(a.n_docs * a.H), static_cast<unsigned>((a.dv + cols - 1) / cols));
  GdrScanArgs args = a;
  // The walks for the block of 8 · cols threads, the kernel's 32 · kWarps (kernel_of_width).
  TileWalk walk_dk = tile_walk(static_cast<int>(a.C), static_cast<int>(a.dk / 8), 8 * cols);
  TileWalk walk_c = tile_walk(static_cast<int>(a.C), static_cast<int>(a.C / 8), 8 * cols);
  void* params[] = {&args, &walk_dk, &walk_c};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(8 * cols), params,
                                           static_cast<size_t>(smem), static_cast<cudaStream_t>(stream)));
}

}  // namespace

int gdr_scan_fused_bf16(const GdrScanArgs& a, int cols, void* stream) {
  if (!gdr_scan_fused_form_ok(a) || !a.bf16_products || !gdr_scan_fused_bf16_supports(a.C, a.dk, a.dv, cols) ||
      a.n_docs < 1 || a.H < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return launch(kernel_of_width<false>(a, cols), a, cols,
                gdr_scan_fused_bf16_smem_bytes(a.C, a.dk, cols, a.dO_bf16 != nullptr), stream);
}

int gdr_scan_forward_bf16(const GdrScanArgs& a, int cols, void* stream) {
  if (!gdr_scan_forward_bf16_form_ok(a) || !a.bf16_products || !gdr_scan_forward_bf16_supports(a.C, a.dk, a.dv, cols) ||
      a.n_docs < 1 || a.H < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return launch(kernel_of_width<true>(a, cols), a, cols, gdr_scan_forward_bf16_smem_bytes(a.C, a.dk, cols), stream);
}

}  // namespace kernels

// The pieces the warp-column scans share (kernels/gdr_scan_warps.cu, and gdr_scan_wgmma.cu's
// warpgroup form): the chunk size, bf16 packing of accumulators into A fragments, the warps' output
// staging, the block's tile copies and WarpScanBlock, which walks a (document, head)'s chunk rows
// and keeps the copies of the steps ahead in flight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_scan.h"
#include "kernels/ldmatrix.cuh"

namespace kernels::warp_scan {
constexpr int kChunk = 64;     // C
constexpr int kStagePitch = 24;  // a warp's staging rows: 16 columns + 8 (48 bytes, an odd count of 16-byte units)

__host__ __device__ constexpr int pitch16(int n) { return n + 8; }  // conflict-free ldmatrix rows

// Elements of one buffer: a forward one holds W and Kd [C][dk + 8] and U [C][cols + 8], and with
// the chunk output (kOutput) Qg [C][dk + 8] and P [C][C + 8]; a reverse one Kd, W and Qg
// [C][dk + 8], Pm [C][C + 8] and dO [C][cols + 8]. All bf16.
__host__ __device__ constexpr int buffer_elems(int warps, int dk, bool reverse, bool output) {
  return reverse  ? 3 * kChunk * pitch16(dk) + kChunk * pitch16(kChunk) + kChunk * pitch16(16 * warps)
         : output ? 3 * kChunk * pitch16(dk) + kChunk * pitch16(kChunk) + kChunk * pitch16(16 * warps)
                  : 2 * kChunk * pitch16(dk) + kChunk * pitch16(16 * warps);
}
// Shared bytes of a block: `stages` buffers, then each warp's staging tile [dk][24] (the state's
// rows, then y's, then the output's).
__host__ __device__ constexpr int64_t smem_bytes_of(int warps, int dk, int stages, bool reverse, bool output = false) {
  return (static_cast<int64_t>(stages) * buffer_elems(warps, dk, reverse, output) + warps * dk * kStagePitch) * 2;
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four 8 × 8 matrices of 16-bit values stored transposed: lane l gives the address of row l % 8 of
// matrix l / 8; lane 4g + t's register j holds (row g, columns 2t, 2t + 1) of matrix j before the
// transpose, stored at (rows 2t, 2t + 1, column g).
__device__ __forceinline__ void stmatrix_x4_trans_b16(void* smem_row, const uint32_t (&r)[4]) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  gdr_chunk_mma::mma16<__nv_bfloat16>(d, gdr_chunk_mma::Frag16A{{a[0], a[1], a[2], a[3]}},
                                      gdr_chunk_mma::Frag16B{{b0, b1}});
}

// The A fragments (k-step ks: 16 of the accumulators' n) of Xᵀ-shaped accumulators acc[n-tile][4]
// (m16 × n8 tiles: element e at row g + 8 (e / 2), column 8 nt + 2t + e % 2), rounded to bf16 and
// sign-flipped by `flip` (0 or 0x80008000): tiles 2ks and 2ks + 1 make one 16 × 16 A fragment.
template <int kTiles>
__device__ __forceinline__ void pack_a(uint32_t (&out)[kTiles / 2][4], const float (&acc)[kTiles][4], uint32_t flip) {
#pragma unroll
  for (int ks = 0; ks < kTiles / 2; ++ks) {
    out[ks][0] = bf16_pair(acc[2 * ks][0], acc[2 * ks][1]) ^ flip;
    out[ks][1] = bf16_pair(acc[2 * ks][2], acc[2 * ks][3]) ^ flip;
    out[ks][2] = bf16_pair(acc[2 * ks + 1][0], acc[2 * ks + 1][1]) ^ flip;
    out[ks][3] = bf16_pair(acc[2 * ks + 1][2], acc[2 * ks + 1][3]) ^ flip;
  }
}

// Accumulators acc[n-tile][4] of Xᵀ (kTiles 8-column tiles: element e at row g + 8 (e / 2),
// column 8 nt + 2t + e % 2) from a row-major bf16 tile X [8 kTiles][pitch] in shared memory, columns
// c0 .. c0 + 15: by ldmatrix.trans (rows 2t, 2t + 1 of column g), each bf16 widened exactly, its sign
// flipped by `flip` (0 or 0x80008000).
template <int kTiles>
__device__ __forceinline__ void load_transposed_widened(float (&acc)[kTiles][4], const uint16_t* x_s, int pitch,
                                                        int c0, int lane, uint32_t flip) {
  const int j = lane / 8;
#pragma unroll
  for (int rt = 0; rt < kTiles; rt += 2) {
    uint32_t u4[4];
    ldmatrix_x4_trans_b16(u4, x_s + (8 * (rt + j / 2) + lane % 8) * pitch + c0 + 8 * (j % 2));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t bits = u4[q] ^ flip;
      acc[rt + q / 2][2 * (q % 2)] = __uint_as_float(bits << 16);
      acc[rt + q / 2][2 * (q % 2) + 1] = __uint_as_float(bits & 0xffff0000u);
    }
  }
}

// out = x with each bf16's sign flipped by `flip` (0 or 0x80008000).
template <int kN>
__device__ __forceinline__ void flipped(uint32_t (&out)[kN][4], const uint32_t (&x)[kN][4], uint32_t flip) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int q = 0; q < 4; ++q) out[i][q] = x[i][q] ^ flip;
  }
}
template <int kN>
__device__ __forceinline__ void scale_all(float (&x)[kN][4], float by) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int q = 0; q < 4; ++q) x[i][q] *= by;
  }
}

// acc[2p], acc[2p + 1] += a[ks] · B(ks, p) over k-steps ks < kKs and column-tile pairs p < kTiles / 2,
// load_b(fb, ks, p) giving the B fragments of k-step ks, tiles 2p and 2p + 1: each k-step's
// fragments loaded while the one before is multiplied (ncu: the mma waited on their ldmatrix).
template <int kKs, int kTiles, typename LoadB>
__device__ __forceinline__ void mma_tiles(float (&acc)[kTiles][4], const uint32_t (&a)[kKs][4], LoadB load_b) {
  constexpr int kPairs = kTiles / 2;
  uint32_t fb[2][kPairs][4];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) load_b(fb[0][p], 0, p);
#pragma unroll
  for (int ks = 0; ks < kKs; ++ks) {
    if (ks + 1 < kKs) {
#pragma unroll
      for (int p = 0; p < kPairs; ++p) load_b(fb[(ks + 1) % 2][p], ks + 1, p);
    }
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      mma_bf16(acc[2 * p], a[ks], fb[ks % 2][p][0], fb[ks % 2][p][1]);
      mma_bf16(acc[2 * p + 1], a[ks], fb[ks % 2][p][2], fb[ks % 2][p][3]);
    }
  }
}

// The staging row (of 16) and half (8 columns) lane `lane` reads back as one 16-byte piece. Each
// quarter-warp takes whole rows (two lanes a row: a full 32-byte sector of dst each), rows 2 apart:
// rows 48 bytes apart then put its 8 pieces in 8 different 16-byte bank groups. Adjacent rows (row
// lane / 2) put rows r and r + 3 of a quarter in one group (ncu: twice the ideal wavefronts at every
// such load); a quarter taking 8 rows at one half cleared that but wrote half sectors, and the scans
// ran 4% and 10% slower (docs/perf.md, stop 65).
__device__ __forceinline__ int staged_row(int lane) { return 8 * (lane / 16) + (lane / 8) % 2 + 2 * ((lane % 8) / 2); }
__device__ __forceinline__ int staged_half(int lane) { return lane % 2; }

// Writes a warp's packed fragments (pack_a's, [rows][16 columns] once transposed) to its staging
// tile [rows][24], then out as 16-byte pieces to dst (rows of `pitch` elements).
template <int kRows>
__device__ __forceinline__ void store_transposed(uint16_t* stage, const uint32_t (&frag)[kRows / 16][4], uint16_t* dst,
                                                 int pitch, int lane) {
  __syncwarp();  // the last step's reads of the tile are done
  const int j = lane / 8;
#pragma unroll
  for (int ks = 0; ks < kRows / 16; ++ks) {
    stmatrix_x4_trans_b16(stage + (16 * ks + 8 * (j / 2) + lane % 8) * kStagePitch + 8 * (j % 2), frag[ks]);
  }
  __syncwarp();
  const int half = staged_half(lane);
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += 16) {
    const int row = r0 + staged_row(lane);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(row) * pitch + 8 * half) =
        *reinterpret_cast<const uint4*>(stage + row * kStagePitch + 8 * half);
  }
}

// The same as store_transposed through a smaller staging area: two slots of [16][24], one 16-row
// piece at a time (a stmatrix, then one 16-byte load and store a lane), the slots alternating so
// that a piece's stores need no wait for the reads of the one before.
template <int kRows>
__device__ __forceinline__ void store_transposed_pieces(uint16_t* stage, const uint32_t (&frag)[kRows / 16][4],
                                                        uint16_t* dst, int pitch, int lane) {
  __syncwarp();  // the last call's reads of the slots are done
  const int j = lane / 8, row = staged_row(lane), half = staged_half(lane);
#pragma unroll
  for (int ks = 0; ks < kRows / 16; ++ks) {
    uint16_t* slot = stage + (ks % 2) * 16 * kStagePitch;
    stmatrix_x4_trans_b16(slot + (8 * (j / 2) + lane % 8) * kStagePitch + 8 * (j % 2), frag[ks]);
    __syncwarp();
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(16 * ks + row) * pitch + 8 * half) =
        *reinterpret_cast<const uint4*>(slot + row * kStagePitch + 8 * half);
  }
}

// The pieces of a [kRows][8 · kPieces] tile a thread copies: where kThreads is a multiple of a
// row's pieces, the thread keeps one column and its rows step by a constant (a count known at
// compile time: a few immediate offsets from one base, where a division per piece and 64-bit
// addresses took a quarter of the forward's instructions, measured by ncu); else every
// kThreads-th piece. f(row, col) for each.
template <int kThreads, int kRows, int kPieces, typename F>
__device__ __forceinline__ void for_pieces(F f) {
  const int tid = static_cast<int>(threadIdx.x);
  if constexpr (kThreads % kPieces == 0) {
    constexpr int kStep = kThreads / kPieces, kPasses = (kRows + kStep - 1) / kStep;
    const int row0 = tid / kPieces, col = 8 * (tid % kPieces);
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      if (kRows % kStep == 0 || row0 + k * kStep < kRows) f(row0 + k * kStep, col);
    }
  } else {
#pragma unroll
    for (int p = tid; p < kRows * kPieces; p += kThreads) f(p / kPieces, 8 * (p % kPieces));
  }
}

// Starts 16-byte copies of a [kRows][8 · kPieces] tile of 16-bit values (rows of src_pitch) into dst
// (rows of kDstPitch), all kThreads threads of the block; pieces from column `limit` on are left out.
template <int kThreads, int kRows, int kPieces, int kDstPitch>
__device__ __forceinline__ void stage_tile(uint16_t* dst, const uint16_t* src, int src_pitch,
                                           int limit = 8 * kPieces) {
  for_pieces<kThreads, kRows, kPieces>([&](int row, int col) {
    if (col < limit) cp_async16(dst + row * kDstPitch + col, src + row * src_pitch + col);
  });
}

// What a block and its warp own, and the steps ahead of the one in hand (both kernels).
template <int kWarps, int kDK, int kStages>
struct WarpScanBlock {
  static constexpr int kCols = 16 * kWarps, kDkTiles = kDK / 8;
  const GdrScanArgs& a;
  int lane, g, t, doc_head, doc, head, dv, j0, cols, c0, n;
  bool active;
  // kStages − 1 steps ahead: chunk rows and decays in registers (shifted a place a step), their
  // tiles in flight, one cp.async group a step (empty past the end, so that every wait counts alike).
  // And the row of the step after those (row_after), worked out a step before its copies start
  // from the plan's entry (raw_next) read a step before that: no load's latency is waited for at
  // the top of a step (ncu: the chunk row's load, waited for there, took 3% of the samples).
  int64_t rows[kStages - 1];
  float decays[kStages - 1];
  int64_t row_after;
  int raw_next;

  // The (document, head) from blockIdx.x and the column block from blockIdx.y, or the other way
  // round (columns_in_x: a document's column blocks next to each other in the launch order).
  __device__ explicit WarpScanBlock(const GdrScanArgs& args, bool columns_in_x = false) : a(args) {
    lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    doc_head = static_cast<int>(columns_in_x ? blockIdx.y : blockIdx.x);
    doc = doc_head / static_cast<int>(a.H), head = doc_head % static_cast<int>(a.H);
    dv = static_cast<int>(a.dv);
    j0 = static_cast<int>(columns_in_x ? blockIdx.x : blockIdx.y) * kCols;
    cols = dv - j0 < kCols ? dv - j0 : kCols;  // a multiple of 16
    c0 = 16 * static_cast<int>(threadIdx.x / 32);  // this warp's first column within the block
    active = c0 < cols;
    n = a.n_chunks[doc];
  }
  __device__ int raw_of_step(int step) const { return step < n ? a.step_off[a.reverse ? n - 1 - step : step] : 0; }
  __device__ int64_t row_of_raw(int raw) const { return (static_cast<int64_t>(raw) + doc) * a.H + head; }
  __device__ int64_t row_of_step(int step) const { return row_of_raw(raw_of_step(step)); }
  // Sᵀ's element e of tile nt (state row 8 nt + 2t + e % 2, column c0 + g + 8 (e / 2)) in a
  // [n_docs · H, dk, dv] state.
  __device__ int64_t state_at(int nt, int e) const {
    return (static_cast<int64_t>(doc_head) * kDK + 8 * nt + 2 * t + e % 2) * dv + j0 + c0 + g + 8 * (e / 2);
  }
  __device__ void load_init(float (&st)[kDkTiles][4]) const {
#pragma unroll
    for (int nt = 0; nt < kDkTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = active && a.init != nullptr ? a.init[state_at(nt, e)] : 0.f;
    }
  }
  __device__ void store_final(const float (&st)[kDkTiles][4]) const {
    if (!active) return;
#pragma unroll
    for (int nt = 0; nt < kDkTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) a.final_state[state_at(nt, e)] = st[nt][e];
    }
  }
  // stage(r, b): chunk row r's tiles into buffer b.
  template <typename Stage>
  __device__ void prime(Stage stage) {
#pragma unroll
    for (int q = 0; q < kStages - 1; ++q) {
      rows[q] = q < n ? row_of_step(q) : 0;
      decays[q] = q < n ? __ldg(a.decay + rows[q]) : 0.f;
      if (q < n) stage(rows[q], q);
      cp_async_commit();
    }
    row_after = row_of_step(kStages - 1);
    raw_next = raw_of_step(kStages);
  }
  // At the top of `step` (whose row and decay the caller has taken from rows[0], decays[0]): waits
  // for its buffer, then shifts the look-ahead and starts the copies kStages − 1 steps ahead, into
  // the buffer the last step read (every warp is past it at the barrier). kForProducts: the buffer is
  // read by warpgroup products (kernels/wgmma.cuh), which see the copies only after a proxy fence.
  template <bool kForProducts = false, typename Stage>
  __device__ void advance(int step, Stage stage) {
    cp_async_wait<kStages - 2>();
    if constexpr (kForProducts) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
#pragma unroll
    for (int q = 0; q + 1 < kStages - 1; ++q) {
      rows[q] = rows[q + 1];
      decays[q] = decays[q + 1];
    }
    const int ahead = step + kStages - 1;
    if (ahead < n) {
      rows[kStages - 2] = row_after;
      decays[kStages - 2] = __ldg(a.decay + row_after);
      stage(row_after, ahead % kStages);
      row_after = row_of_raw(raw_next);
      raw_next = raw_of_step(ahead + 2);
    }
    cp_async_commit();
  }
};

// One forward step of warp-owned columns (both forward kernels, gdr_scan_warps.cu and
// gdr_scan_copy_warps.cu): from the state st and a buffer holding chunk row r's W, Kd [C][dk + 8] and U
// [C][cols + 8] (and with kOutput Qg [C][dk + 8] and P [C][C + 8]), writes out_state[r], out_y[r]
// (and out_o[r]) through the warp's staging tile and leaves st at the next step's state. The
// work issues in the order the next step needs it: y, then the state's update, and only then the
// stores and the output, so that the update's products run while the rest issues (the products
// are asm volatile, so the order here is the order they issue in).
template <int kWarps, int kDK, bool kOutput, int kStages>
__device__ __forceinline__ void forward_step(float (&st)[kDK / 8][4], const uint16_t* buf, uint16_t* stage_s,
                                             const GdrScanArgs& a, const WarpScanBlock<kWarps, kDK, kStages>& blk,
                                             int64_t r, float dec, uint32_t flip_p, uint32_t flip_q) {
  constexpr int kC = kChunk, kCols = 16 * kWarps;
  constexpr int kPk = pitch16(kDK), kPu = pitch16(kCols), kPc = pitch16(kC);
  constexpr int kDkTiles = kDK / 8, kRowTiles = kC / 8;
  const int lane = blk.lane, dv = blk.dv, c0 = blk.c0;
  const uint16_t* w_s = buf;
  const uint16_t* kd_s = w_s + kC * kPk;
  const uint16_t* u_s = kd_s + kC * kPk;

  // The state this step starts from, rounded: the A operand of Sᵀ Wᵀ (and of the output's Sᵀ
  // Qgᵀ), and out_state[r].
  uint32_t sa[kDkTiles / 2][4];
  pack_a<kDkTiles>(sa, st, 0u);

  // yᵀ = sign_p (sign_p Aᵀ + Sᵀ Wᵀ): the accumulators start at sign_p Aᵀ, U's bf16 pairs by
  // ldmatrix.trans (rows 2t, 2t + 1 of column g: yᵀ's accumulator layout) widened exactly.
  float acc[kRowTiles][4];
  load_transposed_widened<kRowTiles>(acc, u_s, kPu, c0, lane, flip_p);
  mma_tiles(acc, sa, [&](uint32_t(&fb)[4], int ks, int p) {
    ldsm_b_pair_of_transposed(fb, w_s, kPk, 16 * ks, 16 * p, lane);
  });
  // y rounded (its sign restored): out_y[r], and the update's operand as sign_q · y.
  uint32_t ya[kRowTiles / 2][4];
  pack_a<kRowTiles>(ya, acc, flip_p);

  // Sᵀ = decay · Sᵀ + (sign_q y)ᵀ Kd, before the stores and the output: the next step waits on it.
  {
    uint32_t yq[kRowTiles / 2][4];
    flipped(yq, ya, flip_q);
    scale_all(st, dec);
    mma_tiles(st, yq, [&](uint32_t(&fb)[4], int ks, int p) { ldsm_b_pair(fb, kd_s, kPk, 16 * ks, 16 * p, lane); });
  }

  store_transposed<kDK>(stage_s, sa, a.out_state_bf16 + r * kDK * dv + blk.j0 + c0, dv, lane);
  store_transposed<kC>(stage_s, ya, a.out_y_bf16 + r * kC * dv + blk.j0 + c0, dv, lane);
  if constexpr (kOutput) {
    // Oᵀ = Sᵀ Qgᵀ + yᵀ Pᵀ: P's row tile pair p (O's rows 16p..) has no terms past column 16p + 15,
    // so k-steps up to p.
    const uint16_t* qg_s = u_s + kC * kPu;
    const uint16_t* p_s = qg_s + kC * kPk;
    float o[kRowTiles][4] = {};
    mma_tiles(o, sa, [&](uint32_t(&fb)[4], int ks, int p) {
      ldsm_b_pair_of_transposed(fb, qg_s, kPk, 16 * ks, 16 * p, lane);
    });
#pragma unroll
    for (int p = 0; p < kRowTiles / 2; ++p) {
#pragma unroll
      for (int ks = 0; ks <= p; ++ks) {
        uint32_t fb[4];
        ldsm_b_pair_of_transposed(fb, p_s, kPc, 16 * ks, 16 * p, lane);
        mma_bf16(o[2 * p], ya[ks], fb[0], fb[1]);
        mma_bf16(o[2 * p + 1], ya[ks], fb[2], fb[3]);
      }
    }
    scale_all(o, a.out_scale);
    uint32_t oa[kRowTiles / 2][4];
    pack_a<kRowTiles>(oa, o, 0u);
    store_transposed<kC>(stage_s, oa, a.out_o_bf16 + r * kC * dv + blk.j0 + c0, dv, lane);
  }
}

// One reverse step of warp-owned columns (both reverse kernels, gdr_scan_warps.cu and
// gdr_scan_copy_warps.cu): from the state gradient st and a buffer holding chunk row r's Kd, W, Qg
// [C][dk + 8], Pm [C][C + 8] and the block's columns of dO [C][cols + 8], writes out_state[r] and
// out_y[r] (dU) through the warp's staging tile and leaves st at the next step's state.
template <int kWarps, int kDK, int kStages>
__device__ __forceinline__ void reverse_step(float (&st)[kDK / 8][4], const uint16_t* buf, uint16_t* stage_s,
                                             const GdrScanArgs& a, const WarpScanBlock<kWarps, kDK, kStages>& blk,
                                             int64_t r, float dec, uint32_t flip_q) {
  constexpr int kC = kChunk, kCols = 16 * kWarps;
  constexpr int kPk = pitch16(kDK), kPc = pitch16(kC), kPo = pitch16(kCols);
  constexpr int kDkTiles = kDK / 8, kRowTiles = kC / 8;
  const int lane = blk.lane, dv = blk.dv, c0 = blk.c0;
  const float s = a.out_scale;
  const uint16_t* kd_s = buf;
  const uint16_t* w_s = kd_s + kC * kPk;
  const uint16_t* qg_s = w_s + kC * kPk;
  const uint16_t* pm_s = qg_s + kC * kPk;
  const uint16_t* do_s = pm_s + kC * kPc;

  // dOᵀ's A fragments (m: this warp's columns, k: the chunk's rows).
  uint32_t oa[kC / 16][4];
#pragma unroll
  for (int ks = 0; ks < kC / 16; ++ks) ldsm_a_of_transposed(oa[ks], do_s, kPo, c0, 16 * ks, lane);

  // yᵀ = s (dOᵀ Pm) + Sᵀ Kdᵀ; Pm[k][i] is zero for k < i, so tile pair p takes k-steps from p on.
  // The part without the state first: it does not wait for the last step's products.
  float acc[kRowTiles][4] = {};
#pragma unroll
  for (int p = 0; p < kRowTiles / 2; ++p) {
#pragma unroll
    for (int ks = p; ks < kC / 16; ++ks) {
      uint32_t fb[4];
      ldsm_b_pair(fb, pm_s, kPc, 16 * ks, 16 * p, lane);
      mma_bf16(acc[2 * p], oa[ks], fb[0], fb[1]);
      mma_bf16(acc[2 * p + 1], oa[ks], fb[2], fb[3]);
    }
  }
  scale_all(acc, s);
  uint32_t sa[kDkTiles / 2][4];
  pack_a<kDkTiles>(sa, st, 0u);
  mma_tiles(acc, sa, [&](uint32_t(&fb)[4], int ks, int p) {
    ldsm_b_pair_of_transposed(fb, kd_s, kPk, 16 * ks, 16 * p, lane);
  });

  // Sᵀ = decay · Sᵀ + s (dOᵀ Qg), a pair of dk tiles at a time (their sums in 8 registers); then
  // + (sign_q y)ᵀ W. At dk 96 the first part runs while y's products do, and the stores come after
  // the update's products are issued: the next step waits on the state, not on them (the
  // products are asm volatile, so the order here is the order they issue in). At dk 128 that
  // order needs more than 255 registers (ptxas spilled, and bench gdr's backward took 1.6% longer,
  // docs/perf.md stop 64), so there each part comes where its operands are first ready.
  auto add_do_qg = [&] {
#pragma unroll
    for (int p = 0; p < kDkTiles / 2; ++p) {
      float e[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < kC / 16; ++ks) {
        uint32_t fb[4];
        ldsm_b_pair(fb, qg_s, kPk, 16 * ks, 16 * p, lane);
        mma_bf16(e[0], oa[ks], fb[0], fb[1]);
        mma_bf16(e[1], oa[ks], fb[2], fb[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = 0; q < 4; ++q) st[2 * p + h][q] = dec * st[2 * p + h][q] + s * e[h][q];
      }
    }
  };
  constexpr bool kEarlyUpdate = kDK <= 96;
  if constexpr (kEarlyUpdate) add_do_qg();
  uint32_t ya[kRowTiles / 2][4];
  pack_a<kRowTiles>(ya, acc, 0u);
  if constexpr (!kEarlyUpdate) {
    store_transposed<kDK>(stage_s, sa, a.out_state_bf16 + r * kDK * dv + blk.j0 + c0, dv, lane);
    store_transposed<kC>(stage_s, ya, a.out_y_bf16 + r * kC * dv + blk.j0 + c0, dv, lane);
    add_do_qg();
  }
  {
    uint32_t yq[kRowTiles / 2][4];
    flipped(yq, ya, flip_q);
    mma_tiles(st, yq, [&](uint32_t(&fb)[4], int ks, int p) { ldsm_b_pair(fb, w_s, kPk, 16 * ks, 16 * p, lane); });
  }
  if constexpr (kEarlyUpdate) {
    store_transposed<kDK>(stage_s, sa, a.out_state_bf16 + r * kDK * dv + blk.j0 + c0, dv, lane);
    store_transposed<kC>(stage_s, ya, a.out_y_bf16 + r * kC * dv + blk.j0 + c0, dv, lane);
  }
}

}  // namespace kernels::warp_scan

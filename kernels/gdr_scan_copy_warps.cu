// The bf16 scans with warp-owned columns (gdr_scan_warps.cu: the same steps, warp_scan::forward_step
// and reverse_step, so the same bits) fed by two copy warps. There every thread stages its share
// of a chunk row ahead with 16-byte cp.async, and the block meets at a __syncthreads each step
// before the buffer the last step read is refilled: ncu put 16% of the forward's stall samples at
// that barrier (the column warps finish their steps unevenly) and about 20 copy instructions a
// thread and step among the products (docs/perf.md, stop 64). Here the column warps only compute,
// and two more warps keep a ring of buffers filled. Each buffer has a "full" shared-memory barrier,
// on which every copy thread arrives once its copies into it have landed (and thread 0 once it has
// written the step's chunk row and decay beside it), and an "empty" one, on which each column warp
// arrives when done with it; the copy warps wait for that before refilling the buffer
// (kernels/mbarrier.cuh). A column warp waits only for its own step's buffer.
// (Hopper's bulk copies, one a tile row, fed the forward 2.5 times slower than this, and one copy
// warp 20% slower: docs/perf.md, stop 64.)
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_scan.h"
#include "kernels/gdr_scan_warps.cuh"
#include "kernels/mbarrier.cuh"
#include "kernels/smem_opt_in.cuh"
#include "kernels/tf32_mma.cuh"

namespace kernels {

namespace {

std::atomic<bool> g_copy_warps{true};
std::atomic<int64_t> g_launches{0};

using namespace warp_scan;

constexpr int kCopyWarps = 2, kCopyThreads = 32 * kCopyWarps;

// Buffers in the ring: 3 where they fit (the forward at the presets' sizes, the reverse at dk 96),
// else 2.
constexpr int stages_of(int warps, int dk, bool reverse, bool output) {
  return smem_bytes_of(warps, dk, 3, reverse, output) + 3 * 32 <= kGdrScanMmaMaxSmem ? 3 : 2;
}
// Shared memory: the buffers and the column warps' staging tiles (as gdr_scan_warps.cu's kernels),
// then per buffer its two barriers, its step's chunk row and decay.
constexpr int64_t copy_warps_smem_bytes(int warps, int dk, bool reverse, bool output) {
  const int stages = stages_of(warps, dk, reverse, output);
  return smem_bytes_of(warps, dk, stages, reverse, output) + stages * 32;
}

// The copy threads' (ct of kCopyThreads) share of a [C][8 · kPieces] tile: every kCopyThreads-th
// 16-byte piece, f(row, piece) for each, unrolled (the reverse's dO rows sit in registers indexed
// by the piece's place in this order).
template <int kPieces, typename F>
__device__ __forceinline__ void for_copy_pieces(int ct, F f) {
  constexpr int kAll = kChunk * kPieces, kPer = (kAll + kCopyThreads - 1) / kCopyThreads;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int p = ct + k * kCopyThreads;
    if (kAll % kCopyThreads == 0 || p < kAll) f(p / kPieces, p % kPieces);
  }
}

// A [C][8 · kPieces] tile of 16-bit values (rows of src_pitch) into dst (rows of kDstPitch); pieces
// from `limit` on left out.
template <int kPieces, int kDstPitch>
__device__ __forceinline__ void copy_tile(int ct, uint16_t* dst, const uint16_t* src, int64_t src_pitch,
                                          int limit = kPieces) {
  for_copy_pieces<kPieces>(ct, [&](int row, int piece) {
    if (piece < limit) cp_async16(dst + row * kDstPitch + 8 * piece, src + row * src_pitch + 8 * piece);
  });
}

// kReverse: the fused backward form (gdr_scan_warps.cu's reverse kernel), else the forward (with
// the chunk output where kOutput).
template <int kWarps, int kDK, bool kReverse, bool kOutput>
__global__ void __launch_bounds__(32 * (kWarps + kCopyWarps)) gdr_scan_copy_warps_kernel(GdrScanArgs a) {
  constexpr int kStages = stages_of(kWarps, kDK, kReverse, kOutput);
  constexpr int kC = kChunk, kCols = 16 * kWarps;
  constexpr int kPk = pitch16(kDK), kPcol = pitch16(kCols), kPc = pitch16(kC);
  constexpr int kBuf = buffer_elems(kWarps, kDK, kReverse, kOutput);
  constexpr int kDkPieces = kDK / 8, kColPieces = kCols / 8, kCPieces = kC / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const smem = reinterpret_cast<uint16_t*>(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem_raw + smem_bytes_of(kWarps, kDK, kStages, kReverse, kOutput));
  uint64_t* const empty = full + kStages;
  int64_t* const row_s = reinterpret_cast<int64_t*>(empty + kStages);
  float* const dec_s = reinterpret_cast<float*>(row_s + kStages);
  const int warp = static_cast<int>(threadIdx.x / 32);
  // The copy warps' columns (c0 from 16 · kWarps) are past the block's: blk counts them inactive.
  WarpScanBlock<kWarps, kDK, kStages> blk(a);
  const int dv = blk.dv;
  if (threadIdx.x == 0) {
    for (int b = 0; b < kStages; ++b) {
      mbar::barrier_init(full + b, kCopyThreads + 1);
      mbar::barrier_init(empty + b, kWarps);
    }
  }
  __syncthreads();

  if (warp >= kWarps) {
    const int ct = static_cast<int>(threadIdx.x) - 32 * kWarps;
    // The reverse's dO rows of this thread's pieces (for_copy_pieces' order), read a step before
    // their copies: −1 for a zero row.
    constexpr int kDoPerThread = kReverse ? (kC * kColPieces + kCopyThreads - 1) / kCopyThreads : 1;
    int64_t do_rows[kDoPerThread];
    auto read_do_rows = [&](int64_t r) {
      int k = 0;
      for_copy_pieces<kColPieces>(ct, [&](int row, int) {
        do_rows[k++] = a.dO_rows != nullptr ? a.dO_rows[r * kC + row] : r * kC + row;
      });
    };
    // Each step's chunk row, decay (and dO rows) are loaded a step before its copies start.
    int64_t r_next = blk.row_of_step(0);
    float dec_next = ct == 0 && blk.n > 0 ? __ldg(a.decay + r_next) : 0.f;
    if constexpr (kReverse) {
      if (blk.n > 0) read_do_rows(r_next);
    }
    int raw = blk.raw_of_step(1);
    for (int q = 0; q < blk.n; ++q) {
      const int b = q % kStages;
      const int64_t r = r_next;
      const float dec = dec_next;
      if (q >= kStages) mbar::wait(empty + b, (q / kStages - 1) & 1);
      uint16_t* buf = smem + b * kBuf;
      if constexpr (kReverse) {
        copy_tile<kDkPieces, kPk>(ct, buf, a.P_bf16 + r * kC * kDK, kDK);                 // Kd
        copy_tile<kDkPieces, kPk>(ct, buf + kC * kPk, a.Q_bf16 + r * kC * kDK, kDK);      // W
        copy_tile<kDkPieces, kPk>(ct, buf + 2 * kC * kPk, a.Qg_bf16 + r * kC * kDK, kDK);  // Qg
        copy_tile<kCPieces, kPc>(ct, buf + 3 * kC * kPk, a.Pm_bf16 + r * kC * kC, kC);    // Pm
        uint16_t* do_s = buf + 3 * kC * kPk + kC * kPc;
        const uint16_t* dO_cols = a.dO_bf16 + blk.j0;
        int k = 0;
        for_copy_pieces<kColPieces>(ct, [&](int row, int piece) {
          const int64_t src_row = do_rows[k++];
          const bool valid = src_row >= 0 && piece < blk.cols / 8;
          const uint16_t* src = valid ? dO_cols + src_row * dv + 8 * piece : a.dO_bf16;
          cp_async16_zfill(reinterpret_cast<float*>(do_s + row * kPcol + 8 * piece),
                           reinterpret_cast<const float*>(src), valid);
        });
      } else {
        copy_tile<kDkPieces, kPk>(ct, buf, a.P_bf16 + r * kC * kDK, kDK);             // W
        copy_tile<kDkPieces, kPk>(ct, buf + kC * kPk, a.Q_bf16 + r * kC * kDK, kDK);  // Kd
        copy_tile<kColPieces, kPcol>(ct, buf + 2 * kC * kPk, a.A_bf16 + r * kC * dv + blk.j0, dv,
                                     blk.cols / 8);  // U
        if constexpr (kOutput) {
          uint16_t* qg_s = buf + 2 * kC * kPk + kC * kPcol;
          copy_tile<kDkPieces, kPk>(ct, qg_s, a.o_Qg_bf16 + r * kC * kDK, kDK);
          copy_tile<kCPieces, kPc>(ct, qg_s + kC * kPk, a.o_P_bf16 + r * kC * kC, kC);
        }
      }
      mbar::arrive_on_copies(full + b);  // each copy thread, once its copies land
      if (ct == 0) {
        row_s[b] = r;
        dec_s[b] = dec;
        mbar::arrive(full + b);
      }
      if (q + 1 < blk.n) {
        r_next = blk.row_of_raw(raw);
        raw = blk.raw_of_step(q + 2);
        if (ct == 0) dec_next = __ldg(a.decay + r_next);
        if constexpr (kReverse) read_do_rows(r_next);
      }
    }
    return;  // the column warps wait for every copy (their steps' "full" barriers) before the block ends
  }

  uint16_t* const stage_s = smem + kStages * kBuf + warp * kDK * kStagePitch;
  const uint32_t flip_p = a.sign_p < 0.f ? 0x80008000u : 0u, flip_q = a.sign_q < 0.f ? 0x80008000u : 0u;
  float st[kDK / 8][4];
  blk.load_init(st);
  for (int step = 0; step < blk.n; ++step) {
    const int b = step % kStages;
    mbar::wait(full + b, (step / kStages) & 1);
    if (blk.active) {
      if constexpr (kReverse) {
        reverse_step<kWarps, kDK>(st, smem + b * kBuf, stage_s, a, blk, row_s[b], dec_s[b], flip_q);
      } else {
        forward_step<kWarps, kDK, kOutput>(st, smem + b * kBuf, stage_s, a, blk, row_s[b], dec_s[b], flip_p,
                                           flip_q);
      }
    }
    __syncwarp();  // every lane's reads of the buffer are done
    if (blk.lane == 0) mbar::arrive(empty + b);
  }
  blk.store_final(st);
}

using Kernel = void (*)(GdrScanArgs);

template <int kWarps, int kDK, bool kReverse, bool kOutput>
Kernel opted_in() {
  constexpr int64_t kBytes = copy_warps_smem_bytes(kWarps, kDK, kReverse, kOutput);
  // Not taken: the chunk output where the thread-copy kernel does not take it (two buffers), and
  // blocks of more than 8 warps in all: 10 warps leave 168 registers a thread (each quarter of the
  // SM holds three warps), and ptxas spilled.
  if constexpr (kBytes > kGdrScanMmaMaxSmem || kWarps + kCopyWarps > 8 ||
                (kOutput && (kReverse || stages_of(kWarps, kDK, false, true) != 3))) {
    return nullptr;
  } else {
    const Kernel f = gdr_scan_copy_warps_kernel<kWarps, kDK, kReverse, kOutput>;
    return allow_dynamic_smem(reinterpret_cast<const void*>(f), static_cast<int>(kBytes)) == 0 ? f : nullptr;
  }
}

template <bool kReverse, bool kOutput>
Kernel kernel_of(int warps, int dk) {
  if (warps == 4) return dk == 96 ? opted_in<4, 96, kReverse, kOutput>() : opted_in<4, 128, kReverse, kOutput>();
  if (warps == 6) return dk == 96 ? opted_in<6, 96, kReverse, kOutput>() : opted_in<6, 128, kReverse, kOutput>();
  return nullptr;  // 8 column warps: see opted_in
}

// backward_form: the fused backward form (GdrScanArgs::dO_bf16), else the forward form (with the
// chunk output where GdrScanArgs::out_o_bf16 is set).
Kernel kernel_for(const GdrScanArgs& a, int cols, bool backward_form) {
  const int warps = cols / 16, dk = static_cast<int>(a.dk);
  if (backward_form) return kernel_of<true, false>(warps, dk);
  return a.out_o_bf16 != nullptr ? kernel_of<false, true>(warps, dk) : kernel_of<false, false>(warps, dk);
}

}  // namespace

void gdr_scan_copy_warps(bool on) { g_copy_warps = on; }
bool gdr_scan_copy_warps() { return g_copy_warps.load(); }
int64_t gdr_scan_copy_warps_launches() { return g_launches.load(); }

bool gdr_scan_copy_warps_take(const GdrScanArgs& a, int cols, bool backward_form) {
  if (!g_copy_warps.load() || (cols != 64 && cols != 96) || (a.dk != 96 && a.dk != 128) || a.n_docs < 1 || a.H < 1) {
    return false;
  }
  if (!backward_form && a.out_o_bf16 != nullptr && (a.o_P_bf16 == nullptr || a.o_Qg_bf16 == nullptr)) return false;
  return kernel_for(a, cols, backward_form) != nullptr;
}

int gdr_scan_copy_warps_launch(const GdrScanArgs& a, int cols, bool backward_form, void* stream) {
  if (!gdr_scan_copy_warps_take(a, cols, backward_form)) return static_cast<int>(cudaErrorInvalidValue);
  const Kernel f = kernel_for(a, cols, backward_form);
  ++g_launches;
  const int warps = cols / 16;
  const bool output = !backward_form && a.out_o_bf16 != nullptr;
  const dim3 grid(static_cast<unsigned>(a.n_docs * a.H), static_cast<unsigned>((a.dv + cols - 1) / cols));
  const dim3 block(static_cast<unsigned>(32 * (warps + kCopyWarps)));
  const int64_t smem = copy_warps_smem_bytes(warps, static_cast<int>(a.dk), backward_form, output);
  GdrScanArgs args = a;
  void* params[] = {&args};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(f), grid, block, params,
                                           static_cast<size_t>(smem), static_cast<cudaStream_t>(stream)));
}

}  // namespace kernels

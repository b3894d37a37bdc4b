// The two bf16 scans (kernels/gdr_scan.h's recurrence: the forward's bf16 form, and the fused
// backward form with a bf16 dO) with each warp owning 16 columns of the state whole, in registers:
// no shared copy of the state, no exchange between warps, one barrier a step. The state is held
// transposed, Sᵀ [16 columns, dk] as fp32 mma accumulators, so that each product takes it, and y,
// as its A operand straight from the accumulators (rounded to bf16). The forward's step, for warp
// w's columns:
//   out_state[r] = S                               (rounded to bf16)
//   yᵀ  = Aᵀ + sign_p · Sᵀ Pᵀ        [16, C]       P = W [C][dk] by ldmatrix
//   out_y[r] = y                                   (rounded to bf16)
//   Sᵀ  = decay · Sᵀ + sign_q · yᵀ Q  [16, dk]     Q = Kd [C][dk] by ldmatrix.trans
// and with GdrScanArgs::out_o_bf16 also the chunk output Oᵀ = s (Sᵀ Qgᵀ + yᵀ Pᵀ) from the same A
// fragments (in place of the separate output product: 0.68 + 0.56 -> 1.07 ms a step at hybrid
// base). The reverse (gdr_scan_reverse_warps_kernel) holds the state gradient the same way for its
// four products. The operands are rounded where gdr_scan_bf16.cu's block kernels round them (the
// state and y to bf16, sums and the running state fp32); only the order of the fp32 sums differs.
// Those kernels share the state between 24 warps through shared memory, each warp a 16 × 16 unit
// of y and a 16 × 32 tile of the state: four barriers and about 450 instructions a warp for 24 mma
// each step (docs/perf.md, stop 55). At hybrid base the scans took 0.99 and 1.21 ms a step there,
// 0.68 and 0.90 here (stop 56).
// A warp issues each step's work in the order the next step needs it: y, then the state's update,
// and only then the stores and the output (and in the reverse the products without the state
// first), so that the update's products run while the rest of the step issues: at hybrid base the
// scans went 1.07 -> 1.02 and 0.91 -> 0.88 ms a step, with the same bits (stop 64). The steps
// themselves are warp_scan::forward_step and reverse_step (gdr_scan_warps.cuh): by default
// gdr_scan_forward_warps and gdr_scan_reverse_warps launch them in kernels fed by two copy warps
// (gdr_scan_copy_warps.cu: 0.98 and 0.80 ms), and these kernels, whose every thread copies, where
// those do not take the sizes (128-column blocks) or are switched off.
//
// Blocks: kWarps warps, 16 · kWarps columns from j0 = blockIdx.y · 16 · kWarps, one (document,
// head) per blockIdx.x; the block stages the next steps' tiles by cp.async while the warps work on
// this one (stages_of: buffers in a ring). Each warp writes its rows of out_state and out_y through
// a shared staging tile of its own (stmatrix.trans, then 16-byte stores). C = 64 and dk 96 or 128
// compiled in; dv a multiple of 16; the signs ±1 (applied to the bf16 values' sign bits: exact).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_scan.h"
#include "kernels/gdr_scan_warps.cuh"
#include "kernels/ldmatrix.cuh"
#include "kernels/smem_opt_in.cuh"

namespace kernels {

namespace {

std::atomic<bool> g_warp_columns{true};
std::atomic<int> g_warp_width{0};
std::atomic<int64_t> g_warp_launches{0};

using namespace warp_scan;

// kOutput: also the chunk output O = s (P y + Qg S) (GdrScanArgs::out_o_bf16): Oᵀ = s (Sᵀ Qgᵀ + yᵀ Pᵀ)
// from the same A fragments as the step's own products.
template <int kWarps, int kDK, int kStages, bool kOutput>
__global__ void __launch_bounds__(32 * kWarps) gdr_scan_forward_warps_kernel(GdrScanArgs a) {
  constexpr int kC = kChunk, kThreads = 32 * kWarps, kCols = 16 * kWarps;
  constexpr int kPk = pitch16(kDK), kPu = pitch16(kCols), kPc = pitch16(kC);
  constexpr int kDkTiles = kDK / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const smem = reinterpret_cast<uint16_t*>(smem_raw);
  constexpr int kBuf = buffer_elems(kWarps, kDK, false, kOutput);  // one buffer: W, Kd, U (Qg, P)
  uint16_t* const stage_s = smem + kStages * kBuf + (threadIdx.x / 32) * kDK * kStagePitch;
  WarpScanBlock<kWarps, kDK, kStages> blk(a);
  const int dv = blk.dv;
  const uint32_t flip_p = a.sign_p < 0.f ? 0x80008000u : 0u, flip_q = a.sign_q < 0.f ? 0x80008000u : 0u;

  // Sᵀ: tile nt holds state rows (dk) 8 nt + 2t, + 1 for columns c0 + g (e 0, 1) and c0 + g + 8 (e 2, 3).
  float st[kDkTiles][4];
  blk.load_init(st);

  // Chunk row r's W and Kd [C][dk] and the block's valid columns of U into buffer b.
  auto stage = [&](int64_t r, int b) {
    uint16_t* w_s = smem + b * kBuf;
    stage_tile<kThreads, kC, kDK / 8, kPk>(w_s, a.P_bf16 + r * kC * kDK, kDK);
    stage_tile<kThreads, kC, kDK / 8, kPk>(w_s + kC * kPk, a.Q_bf16 + r * kC * kDK, kDK);
    stage_tile<kThreads, kC, kCols / 8, kPu>(w_s + 2 * kC * kPk, a.A_bf16 + r * kC * dv + blk.j0, dv, blk.cols);
    if constexpr (kOutput) {
      uint16_t* qg_s = w_s + 2 * kC * kPk + kC * kPu;
      stage_tile<kThreads, kC, kDK / 8, kPk>(qg_s, a.o_Qg_bf16 + r * kC * kDK, kDK);
      stage_tile<kThreads, kC, kC / 8, kPc>(qg_s + kC * kPk, a.o_P_bf16 + r * kC * kC, kC);
    }
  };
  blk.prime(stage);
  for (int step = 0; step < blk.n; ++step) {
    const int64_t r = blk.rows[0];
    const float dec = blk.decays[0];
    const int b = step % kStages;
    blk.advance(step, stage);
    if (!blk.active) continue;
    forward_step<kWarps, kDK, kOutput>(st, smem + b * kBuf, stage_s, a, blk, r, dec, flip_p, flip_q);
  }
  cp_async_wait<0>();
  blk.store_final(st);
}

// The fused backward form (GdrScanArgs::dO_bf16 with bf16 products and bf16 y; gdr_scan_bf16.cu's
// kDO16 instances) with warp-owned columns: per reverse step, for this warp's 16 columns,
//   out_state[r] = S                                           (dh_next, rounded to bf16)
//   yᵀ  = s (dOᵀ Pm) + Sᵀ Kdᵀ          [16, C]   (Pm zero above its diagonal: k-steps from the tile's)
//   out_y[r] = y                                               (dU, rounded)
//   Sᵀ  = decay · Sᵀ + s (dOᵀ Qg) + sign_q yᵀ W    [16, dk]
// dOᵀ's A fragments come once a step by ldmatrix.trans and serve both of its products. dO comes
// through the row map (dO_rows; −1: a zero row) into each buffer.
template <int kWarps, int kDK, int kStages>
__global__ void __launch_bounds__(32 * kWarps) gdr_scan_reverse_warps_kernel(GdrScanArgs a) {
  constexpr int kC = kChunk, kThreads = 32 * kWarps, kCols = 16 * kWarps;
  constexpr int kPk = pitch16(kDK), kPc = pitch16(kC), kPo = pitch16(kCols);
  constexpr int kDkTiles = kDK / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const smem = reinterpret_cast<uint16_t*>(smem_raw);
  constexpr int kBuf = buffer_elems(kWarps, kDK, true, false);  // one buffer: Kd, W, Qg, Pm, dO
  uint16_t* const stage_s = smem + kStages * kBuf + (threadIdx.x / 32) * kDK * kStagePitch;
  WarpScanBlock<kWarps, kDK, kStages> blk(a);
  const int dv = blk.dv;
  const uint32_t flip_q = a.sign_q < 0.f ? 0x80008000u : 0u;

  float st[kDkTiles][4];  // Sᵀ, as in the forward
  blk.load_init(st);

  // The dO rows of this thread's pieces of the next chunk row staged (for_pieces' order), read a step
  // before their copies (as WarpScanBlock::row_after): −1 for a zero row.
  constexpr int kDoPieces = kCols / 8;
  constexpr int kPerThread = kThreads % kDoPieces == 0 ? (kC + kThreads / kDoPieces - 1) / (kThreads / kDoPieces)
                                                       : (kC * kDoPieces + kThreads - 1) / kThreads;
  int64_t do_rows[kPerThread];
  auto read_do_rows = [&](int64_t r) {
    int k = 0;
    for_pieces<kThreads, kC, kDoPieces>([&](int i, int) {
      do_rows[k++] = a.dO_rows != nullptr ? a.dO_rows[r * kC + i] : r * kC + i;
    });
  };
  auto stage = [&](int64_t r, int b) {
    uint16_t* kd_s = smem + b * kBuf;
    stage_tile<kThreads, kC, kDK / 8, kPk>(kd_s, a.P_bf16 + r * kC * kDK, kDK);
    stage_tile<kThreads, kC, kDK / 8, kPk>(kd_s + kC * kPk, a.Q_bf16 + r * kC * kDK, kDK);
    stage_tile<kThreads, kC, kDK / 8, kPk>(kd_s + 2 * kC * kPk, a.Qg_bf16 + r * kC * kDK, kDK);
    stage_tile<kThreads, kC, kC / 8, kPc>(kd_s + 3 * kC * kPk, a.Pm_bf16 + r * kC * kC, kC);
    uint16_t* do_s = kd_s + 3 * kC * kPk + kC * kPc;
    const uint16_t* dO_cols = a.dO_bf16 + blk.j0;
    int k = 0;
    for_pieces<kThreads, kC, kDoPieces>([&](int i, int c) {
      const int64_t src_row = do_rows[k++];
      const bool valid = src_row >= 0 && c < blk.cols;
      const uint16_t* src = valid ? dO_cols + src_row * dv + c : a.dO_bf16;
      cp_async16_zfill(reinterpret_cast<float*>(do_s + i * kPo + c), reinterpret_cast<const float*>(src), valid);
    });
  };
  blk.prime([&](int64_t r, int b) {
    read_do_rows(r);
    stage(r, b);
  });
  if (kStages - 1 < blk.n) read_do_rows(blk.row_after);
  for (int step = 0; step < blk.n; ++step) {
    const int64_t r = blk.rows[0];
    const float dec = blk.decays[0];
    const int b = step % kStages;
    blk.advance(step, stage);
    if (step + kStages < blk.n) read_do_rows(blk.row_after);  // for the next step's copies
    if (!blk.active) continue;
    reverse_step<kWarps, kDK>(st, smem + b * kBuf, stage_s, a, blk, r, dec, flip_q);
  }
  cp_async_wait<0>();
  blk.store_final(st);
}

using WarpsKernel = void (*)(GdrScanArgs);

// The copies' depth: chunk rows staged ahead of the one in hand, 2 in the forward and 1 in the
// reverse (3 and 2 buffers). Measured at hybrid base (docs/perf.md, issue 7, stop 56): forward 0.99
// ms a step with 2 buffers, 0.68 with 3, 0.69 with 4; reverse 0.90 with 2, 0.92 with 3. The
// forward with the chunk output takes 2 where 3 do not fit.
constexpr int stages_of(bool reverse, bool output, int warps, int dk) {
  return reverse ? 2 : smem_bytes_of(warps, dk, 3, false, output) <= kGdrScanMmaMaxSmem ? 3 : 2;
}

template <bool kReverse, int kWarps, int kDK, bool kOutput = false>
WarpsKernel opted_in() {
  constexpr int kStages = stages_of(kReverse, kOutput, kWarps, kDK);
  constexpr int64_t kBytes = smem_bytes_of(kWarps, kDK, kStages, kReverse, kOutput);
  static_assert(kBytes <= kGdrScanMmaMaxSmem, "the block's buffers fit");
  WarpsKernel f = nullptr;
  if constexpr (kOutput && kStages != 3) {
    return nullptr;  // not taken (gdr_scan_forward_output_width): no instance
  } else if constexpr (kReverse) {
    f = gdr_scan_reverse_warps_kernel<kWarps, kDK, kStages>;
  } else {
    f = gdr_scan_forward_warps_kernel<kWarps, kDK, kStages, kOutput>;
  }
  return allow_dynamic_smem(reinterpret_cast<const void*>(f), static_cast<int>(kBytes)) == 0 ? f : nullptr;
}

template <bool kReverse, bool kOutput = false>
WarpsKernel kernel_of(int warps, int dk) {
  if (warps == 4) return dk == 96 ? opted_in<kReverse, 4, 96, kOutput>() : opted_in<kReverse, 4, 128, kOutput>();
  if (warps == 6) return dk == 96 ? opted_in<kReverse, 6, 96, kOutput>() : opted_in<kReverse, 6, 128, kOutput>();
  return dk == 96 ? opted_in<kReverse, 8, 96, kOutput>() : opted_in<kReverse, 8, 128, kOutput>();
}

// The sizes both kernels take, and the block width for them (forced, or picked for dv).
int width_for(const GdrScanArgs& a) {
  if (a.C != kChunk || (a.dk != 96 && a.dk != 128) || a.dv < 16 || a.dv % 16 != 0 || a.dv > kGdrScanBf16MaxDv ||
      (a.sign_p != 1.f && a.sign_p != -1.f) || (a.sign_q != 1.f && a.sign_q != -1.f)) {
    return 0;
  }
  const int forced = g_warp_width.load();
  if (forced == 64 || forced == 96 || forced == 128) return forced;
  // Two blocks a head where the value width splits so (hybrid base's 192 in 96, 256 in 128),
  // else 64-column blocks.
  if (a.dv % 96 == 0 && a.dv / 96 <= 2) return 96;
  if (a.dv % 128 == 0) return 128;
  return 64;
}

template <bool kReverse>
int launch(const GdrScanArgs& a, int cols, void* stream) {
  if (cols == 0 || a.n_docs < 1 || a.H < 1) return static_cast<int>(cudaErrorInvalidValue);
  const int warps = cols / 16, dk = static_cast<int>(a.dk);
  const bool output = !kReverse && a.out_o_bf16 != nullptr;
  if (output && (a.o_P_bf16 == nullptr || a.o_Qg_bf16 == nullptr)) return static_cast<int>(cudaErrorInvalidValue);
  const WarpsKernel f = output ? kernel_of<false, true>(warps, dk) : kernel_of<kReverse>(warps, dk);
  const int stages = stages_of(kReverse, output, warps, dk);
  if (f == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  ++g_warp_launches;
  const dim3 grid(static_cast<unsigned>(a.n_docs * a.H), static_cast<unsigned>((a.dv + cols - 1) / cols));
  GdrScanArgs args = a;
  void* params[] = {&args};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(f), grid, dim3(32 * warps), params,
                                           static_cast<size_t>(smem_bytes_of(warps, dk, stages, kReverse, output)),
                                           static_cast<cudaStream_t>(stream)));
}

}  // namespace

void gdr_scan_warp_columns(bool on) { g_warp_columns = on; }
bool gdr_scan_warp_columns() { return g_warp_columns.load(); }
void gdr_scan_warp_width(int cols) { g_warp_width = cols; }
int64_t gdr_scan_warp_launches() { return g_warp_launches.load(); }

int gdr_scan_forward_warps_width(const GdrScanArgs& a) {
  return gdr_scan_forward_bf16_form_ok(a) ? width_for(a) : 0;
}

int gdr_scan_forward_warps(const GdrScanArgs& a, void* stream) {
  if (gdr_scan_forward_wgmma_width(a) > 0) return gdr_scan_forward_wgmma(a, stream);
  const int cols = gdr_scan_forward_warps_width(a);
  if (gdr_scan_copy_warps_take(a, cols, false)) {
    ++g_warp_launches;
    return gdr_scan_copy_warps_launch(a, cols, false, stream);
  }
  return launch<false>(a, cols, stream);
}

int gdr_scan_forward_output_width(const GdrScanArgs& a) {
  if (!a.bf16_products || a.variant != kGdrScanAuto || !g_warp_columns.load() || gdr_scan_forward_bf16_width(a) == 0) {
    return 0;
  }
  // Only where the output's tiles leave room for the 3 buffers: with 2 the forward took 0.99 ms a
  // step against 0.68 (stages_of), more than the separate product saves.
  const int cols = gdr_scan_forward_warps_width(a);
  return cols > 0 && stages_of(false, true, cols / 16, static_cast<int>(a.dk)) == 3 ? cols : 0;
}

int gdr_scan_reverse_warps_width(const GdrScanArgs& a) {
  const bool form = gdr_scan_fused_form_ok(a) && a.bf16_products && a.dO_bf16 != nullptr && a.out_y_bf16 != nullptr;
  return form ? width_for(a) : 0;
}

int gdr_scan_reverse_warps(const GdrScanArgs& a, void* stream) {
  const int cols = gdr_scan_reverse_warps_width(a);
  if (gdr_scan_copy_warps_take(a, cols, true)) {
    ++g_warp_launches;
    return gdr_scan_copy_warps_launch(a, cols, true, stream);
  }
  return launch<true>(a, cols, stream);
}

}  // namespace kernels

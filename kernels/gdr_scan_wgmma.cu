// The forward bf16 scan (kernels/gdr_scan.h's forward form with bf16 products, optionally the
// chunk output) with its products on Hopper's warpgroup instructions (kernels/wgmma.cuh): the
// same recurrence and roundings as gdr_scan_warps.cu's forward kernel (bit-equal in every run of
// the test so far, which bounds the difference at 4e-3),
// whose warps each own 16 state columns and load every product's B operand from shared memory by
// ldmatrix, warp by warp (ncu at hybrid base: 940 instructions a warp a step, 166 of them mma,
// the warps stalled most on those loads). Here the four warps of a group (64 state columns) take
// each product as one instruction a k-step reading B from shared memory once for the group.
//
// Off by default: slower at hybrid base (docs/perf.md, issue 7, stop 63): 1.25 ms a step against
// 1.07. A head's dv 192 takes three 64-column blocks where the warp kernel takes two of 96, so
// each chunk's four tiles are copied in half again as often, and with one block of four warps an
// SM (the copies' three buffers fill shared memory) the step is a chain of waits: the copies, the
// products, the output stores (ncu: long-scoreboard stalls 4 – 8 cycles an instruction).
//
// A step, for the group's columns (Sᵀ [64 columns, dk] fp32 accumulators, as in the warp kernel):
//   out_state[r] = S                                  (rounded to bf16: the A fragments sa)
//   yᵀ = sign_p (sign_p Aᵀ + Sᵀ Wᵀ)   [64, C]        W staged K-major
//   out_y[r] = y                                      (rounded: the A fragments ya)
//   Sᵀ = decay · Sᵀ + sign_q yᵀ Kd     [64, dk]       Kd staged N-major (its rows are K here)
//   Oᵀ = Sᵀ Qgᵀ + yᵀ Pᵀ; out_o[r] = s Oᵀ              (kOutput; Qg and P staged K-major)
// Blocks: four warps, 64 columns from blockIdx.x's, one (document, head) per blockIdx.y (a head's
// column blocks next to each other in the launch order), WarpScanBlock's walk and look-ahead
// copies. Built for sm_90a only (kernels/CMakeLists.txt: deltadeck_kernels_sm90a);
// gdr_scan_forward_wgmma_width is 0 where the kernel cannot run (no image for the GPU: its
// shared-memory opt-in fails).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_scan.h"
#include "kernels/gdr_scan_warps.cuh"
#include "kernels/smem_opt_in.cuh"
#include "kernels/wgmma.cuh"
#include "kernels/wgmma_check.h"

namespace kernels {

namespace {

using namespace warp_scan;

std::atomic<bool> g_wgmma{false};
std::atomic<int64_t> g_wgmma_launches{0};

// One buffer (16-bit elements): W and Kd [C · dk] interleaved for the products, U [C][cols + 8]
// row-major (read by ldmatrix), and with the output Qg [C · dk] and P [C · C] interleaved.
__host__ __device__ constexpr int wg_buffer_elems(int warps, int dk, bool output) {
  return 2 * kChunk * dk + kChunk * pitch16(16 * warps) + (output ? kChunk * dk + kChunk * kChunk : 0);
}
// `stages` buffers, then each warp's two output staging slots [16][24] (store_transposed_pieces).
__host__ __device__ constexpr int64_t wg_smem_bytes(int warps, int dk, int stages, bool output) {
  return (static_cast<int64_t>(stages) * wg_buffer_elems(warps, dk, output) + warps * 32 * kStagePitch) * 2;
}
// Chunk rows staged: three buffers where they fit, else two (two buffers and two blocks an SM
// took 1.47 ms a step at hybrid base, three buffers and one block 1.25: docs/perf.md, stop 63).
constexpr int wg_stages(int warps, int dk, bool output) {
  return wg_smem_bytes(warps, dk, 3, output) <= kGdrScanMmaMaxSmem ? 3 : 2;
}

// Starts 16-byte copies of a row-major [kRows][8 · kPieces] tile of 16-bit values (rows of
// src_pitch) into the interleaved layout (kernels/wgmma.cuh): K-major (source rows along N) or
// kNMajor (source rows along K). Eight consecutive threads take the eight rows of one core
// matrix: 128 contiguous bytes written, and a warp reads 64 contiguous bytes of each of 8 rows.
template <int kThreads, int kRows, int kPieces, bool kNMajor>
__device__ __forceinline__ void stage_interleaved(uint16_t* dst, const uint16_t* src, int src_pitch) {
  static_assert(kRows % 8 == 0, "whole core matrices");
  constexpr int kTotal = kRows * kPieces;
#pragma unroll
  for (int i0 = 0; i0 < kTotal; i0 += kThreads) {
    const int i = i0 + static_cast<int>(threadIdx.x);
    if (kTotal % kThreads == 0 || i < kTotal) {
      const int q = i / 8, piece = q % kPieces, row = (q / kPieces) * 8 + i % 8;
      const int at = kNMajor ? wgmma::n_major_offset(row, piece, kRows) : wgmma::k_major_offset(row, piece, kPieces);
      cp_async16(dst + at, src + row * src_pitch + 8 * piece);
    }
  }
}

template <int kWarps, int kDK, int kStages, bool kOutput, bool kNegQ>
__global__ void __launch_bounds__(32 * kWarps, 1) gdr_scan_forward_wgmma_kernel(GdrScanArgs a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // compiled for a target without wgmma: never launched (the host sees no sm_90a image)
#else
  static_assert(kWarps % 4 == 0, "whole warpgroups");
  constexpr int kC = kChunk, kThreads = 32 * kWarps, kCols = 16 * kWarps;
  constexpr int kPu = pitch16(kCols), kTile = kC * kDK;
  constexpr int kDkTiles = kDK / 8, kRowTiles = kC / 8, kDkPieces = kDK / 8;
  constexpr int kBuf = wg_buffer_elems(kWarps, kDK, kOutput);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* const smem = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const stage_s = smem + kStages * kBuf + (threadIdx.x / 32) * 32 * kStagePitch;
  WarpScanBlock<kWarps, kDK, kStages> blk(a, /*columns_in_x=*/true);
  const int lane = blk.lane, dv = blk.dv, c0 = blk.c0;
  const uint32_t flip_p = a.sign_p < 0.f ? 0x80008000u : 0u;

  float st[kDkTiles][4];  // Sᵀ: tile nt, state rows 8 nt + 2t (+1), columns c0 + g (+8)
  blk.load_init(st);

  // Chunk row r's tiles into buffer b: W, Kd, the block's columns of U, and Qg and P.
  auto stage = [&](int64_t r, int b) {
    uint16_t* w_s = smem + b * kBuf;
    stage_interleaved<kThreads, kC, kDkPieces, false>(w_s, a.P_bf16 + r * kTile, kDK);
    stage_interleaved<kThreads, kC, kDkPieces, true>(w_s + kTile, a.Q_bf16 + r * kTile, kDK);
    stage_tile<kThreads, kC, kCols / 8, kPu>(w_s + 2 * kTile, a.A_bf16 + r * kC * dv + blk.j0, dv);
    if constexpr (kOutput) {
      uint16_t* qg_s = w_s + 2 * kTile + kC * kPu;
      stage_interleaved<kThreads, kC, kDkPieces, false>(qg_s, a.o_Qg_bf16 + r * kTile, kDK);
      stage_interleaved<kThreads, kC, kC / 8, false>(qg_s + kTile, a.o_P_bf16 + r * kC * kC, kC);
    }
  };
  blk.prime(stage);
  float o[kRowTiles][4] = {};  // the chunk output's sums (kOutput); the first product overwrites them
  for (int step = 0; step < blk.n; ++step) {
    const int64_t r = blk.rows[0];
    const float dec = blk.decays[0];
    const int b = step % kStages;
    blk.template advance<true>(step, stage);
    const uint16_t* w_s = smem + b * kBuf;
    const uint16_t* kd_s = w_s + kTile;
    const uint16_t* u_s = kd_s + kTile;
    const uint16_t* qg_s = u_s + kC * kPu;
    const uint16_t* p_s = qg_s + kTile;
    // K-adjacent core matrices 128 bytes apart; N-adjacent ones a row of core matrices apart.
    const uint64_t w_desc = wgmma::descriptor(w_s, 128, 128 * kDkPieces);
    const uint64_t kd_desc = wgmma::descriptor(kd_s, 128, 128 * (kC / 8));

    // The state this step starts from, rounded: the A operand of Sᵀ Wᵀ (and Sᵀ Qgᵀ), and out_state[r].
    uint32_t sa[kDkTiles / 2][4];
    pack_a<kDkTiles>(sa, st, 0u);
    // yᵀ's accumulators start at sign_p Aᵀ (U's bf16 pairs by ldmatrix.trans, widened exactly).
    float acc[kRowTiles][4];
    load_transposed_widened<kRowTiles>(acc, u_s, kPu, c0, lane, flip_p);
    // Registers a product reads or writes are written before the fence (hold keeps the compiler from
    // moving those writes past it) and not touched again until the wait (PTX: undefined otherwise).
    wgmma::hold(sa);
    wgmma::hold(acc);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kDK / 16; ++ks) wgmma::product<kC, false>(acc, sa[ks], wgmma::at_k_step(w_desc, ks), true);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold(acc);
    wgmma::hold(sa);
    store_transposed_pieces<kDK>(stage_s, sa, a.out_state_bf16 + r * kDK * dv + blk.j0 + c0, dv, lane);

    // y rounded (its sign restored): out_y[r], and the A operand of the update and of Oᵀ += yᵀ Pᵀ.
    uint32_t ya[kRowTiles / 2][4];
    pack_a<kRowTiles>(ya, acc, flip_p);
    // Sᵀ = decay · Sᵀ + sign_q yᵀ Kd (sign_q by the product's scale of A), then the chunk output
    // Oᵀ = Sᵀ Qgᵀ + yᵀ Pᵀ from the step's two A operands: after y, so that its sums do not hold
    // registers while y's do.
    scale_all(st, dec);
    wgmma::hold(st);
    wgmma::hold(ya);
    if constexpr (kOutput) wgmma::hold(o);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kC / 16; ++ks) {
      wgmma::product<kDK, true, kNegQ ? -1 : 1>(st, ya[ks], wgmma::at_k_step(kd_desc, ks), true);
    }
    if constexpr (kOutput) {
      const uint64_t qg_desc = wgmma::descriptor(qg_s, 128, 128 * kDkPieces);
      const uint64_t p_desc = wgmma::descriptor(p_s, 128, 128 * (kC / 8));
#pragma unroll
      for (int ks = 0; ks < kDK / 16; ++ks) {
        wgmma::product<kC, false>(o, sa[ks], wgmma::at_k_step(qg_desc, ks), ks > 0);
      }
#pragma unroll
      for (int ks = 0; ks < kC / 16; ++ks) wgmma::product<kC, false>(o, ya[ks], wgmma::at_k_step(p_desc, ks), true);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold(st);
    wgmma::hold(sa);
    wgmma::hold(ya);
    store_transposed_pieces<kC>(stage_s, ya, a.out_y_bf16 + r * kC * dv + blk.j0 + c0, dv, lane);
    if constexpr (kOutput) {
      wgmma::hold(o);
      scale_all(o, a.out_scale);
      uint32_t oa[kRowTiles / 2][4];
      pack_a<kRowTiles>(oa, o, 0u);
      store_transposed_pieces<kC>(stage_s, oa, a.out_o_bf16 + r * kC * dv + blk.j0 + c0, dv, lane);
    }
  }
  cp_async_wait<0>();
  blk.store_final(st);
#endif
}

using Kernel = void (*)(GdrScanArgs);

// One warpgroup a block: 64 state columns. Three (one block a head at hybrid base's dv 192) have
// 168 registers a thread: 1.67 ms a step with three buffers and 3.97 with two (stop 63).
constexpr int kWarps = 4, kCols = 16 * kWarps;

template <int kDK, bool kOutput, bool kNegQ>
Kernel opted_in() {
  constexpr int kStages = wg_stages(kWarps, kDK, kOutput);
  constexpr int64_t kBytes = wg_smem_bytes(kWarps, kDK, kStages, kOutput);
  static_assert(kBytes <= kGdrScanMmaMaxSmem, "the block's buffers fit");
  const Kernel f = gdr_scan_forward_wgmma_kernel<kWarps, kDK, kStages, kOutput, kNegQ>;
  return allow_dynamic_smem(reinterpret_cast<const void*>(f), static_cast<int>(kBytes)) == 0 ? f : nullptr;
}

template <int kDK>
Kernel kernel_of(bool output, bool neg_q) {
  return output ? (neg_q ? opted_in<kDK, true, true>() : opted_in<kDK, true, false>())
                : (neg_q ? opted_in<kDK, false, true>() : opted_in<kDK, false, false>());
}
Kernel kernel_of(int dk, bool output, bool neg_q) {
  return dk == 96 ? kernel_of<96>(output, neg_q) : kernel_of<128>(output, neg_q);
}

bool sizes_taken(const GdrScanArgs& a) {
  return a.C == kChunk && (a.dk == 96 || a.dk == 128) && a.dv % kCols == 0 && a.dv <= kGdrScanBf16MaxDv &&
         (a.sign_p == 1.f || a.sign_p == -1.f) && (a.sign_q == 1.f || a.sign_q == -1.f) && a.n_docs >= 1 &&
         a.H >= 1 && a.n_docs * a.H <= 65535;  // gridDim.y
}

bool output_asked(const GdrScanArgs& a) { return a.out_o_bf16 != nullptr; }

}  // namespace

void gdr_scan_wgmma(bool on) { g_wgmma = on; }
bool gdr_scan_wgmma() { return g_wgmma.load(); }
int64_t gdr_scan_wgmma_launches() { return g_wgmma_launches.load(); }

int gdr_scan_forward_wgmma_width(const GdrScanArgs& a) {
  if (!g_wgmma.load() || !gdr_scan_forward_bf16_form_ok(a) || !sizes_taken(a)) return 0;
  if (output_asked(a) && (a.o_P_bf16 == nullptr || a.o_Qg_bf16 == nullptr)) return 0;
  return kernel_of(static_cast<int>(a.dk), output_asked(a), a.sign_q < 0.f) != nullptr ? kCols : 0;
}

int gdr_scan_forward_wgmma(const GdrScanArgs& a, void* stream) {
  const int cols = gdr_scan_forward_wgmma_width(a);
  if (cols == 0) return static_cast<int>(cudaErrorInvalidValue);
  const int dk = static_cast<int>(a.dk);
  const bool output = output_asked(a);
  const Kernel f = kernel_of(dk, output, a.sign_q < 0.f);
  ++g_wgmma_launches;
  const dim3 grid(static_cast<unsigned>(a.dv / cols), static_cast<unsigned>(a.n_docs * a.H));
  const int64_t smem = wg_smem_bytes(kWarps, dk, wg_stages(kWarps, dk, output), output);
  GdrScanArgs args = a;
  void* params[] = {&args};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(f), grid, dim3(32 * kWarps), params,
                                           static_cast<size_t>(smem), static_cast<cudaStream_t>(stream)));
}

}  // namespace kernels

// kernels/wgmma_check.h: the helpers' product and layouts at the smallest size, for tests.
namespace kernels {

namespace {

template <bool kNMajor>
__global__ void __launch_bounds__(128) wgmma_check_kernel(const uint16_t* A, const uint16_t* B, float* D) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  __shared__ __align__(128) uint16_t b_s[64 * 32];
  if constexpr (kNMajor) {
    stage_interleaved<128, 32, 8, true>(b_s, B, 64);  // rows: K; pieces along N
  } else {
    stage_interleaved<128, 64, 4, false>(b_s, B, 32);  // rows: N; pieces along K
  }
  cp_async_wait_all();
  wgmma::fence_shared_for_products();
  __syncthreads();
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const auto pair = [&](int row, int col) {
    return static_cast<uint32_t>(A[row * 32 + col]) | static_cast<uint32_t>(A[row * 32 + col + 1]) << 16;
  };
  uint32_t a[2][4];
  for (int ks = 0; ks < 2; ++ks) {
    a[ks][0] = pair(16 * w + g, 16 * ks + 2 * t);
    a[ks][1] = pair(16 * w + g + 8, 16 * ks + 2 * t);
    a[ks][2] = pair(16 * w + g, 16 * ks + 2 * t + 8);
    a[ks][3] = pair(16 * w + g + 8, 16 * ks + 2 * t + 8);
  }
  float d[8][4] = {};
  const uint64_t desc = wgmma::descriptor(b_s, 128, 128 * 4);  // 4 core matrices along K either way
  wgmma::hold(a);
  wgmma::hold(d);
  wgmma::fence();
  for (int ks = 0; ks < 2; ++ks) wgmma::product<64, kNMajor>(d, a[ks], wgmma::at_k_step(desc, ks), true);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::hold(d);
  for (int nt = 0; nt < 8; ++nt) {
    for (int e = 0; e < 4; ++e) D[(16 * w + g + 8 * (e / 2)) * 64 + 8 * nt + 2 * t + e % 2] = d[nt][e];
  }
#endif
}

}  // namespace

int wgmma_product_check(const uint16_t* A, const uint16_t* B, float* D, bool n_major, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (n_major) {
    wgmma_check_kernel<true><<<1, 128, 0, s>>>(A, B, D);
  } else {
    wgmma_check_kernel<false><<<1, 128, 0, s>>>(A, B, D);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

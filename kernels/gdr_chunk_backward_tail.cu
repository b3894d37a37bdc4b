// The end of the chunked gated delta rule's backward (kernels/gdr_chunk_backward_tail.h): one block
// of 8 warps per (chunk, head), two blocks per SM (held there by 128 registers a thread), three
// for the fixed head sizes with bf16 products (80 registers). With bf16 or fp16 q and k they are
// staged in shared memory as they come, 71 KiB a block at dk = 128 (55 KiB with bf16 products,
// 47 KiB at dk = 96, 48 with L2Norm's rows); fp32 q and k are staged in fp32, 103 KiB. A chunk of
// no tokens (a fixed layout's spare chunk, model/gdr_plan_slots.h) has nothing to write: its block
// returns at once.
//
//   gates   γ = cumsum(g) as a warp scan, b, e, κ, b e, decay;
//   load    Q and K into shared memory, four pieces per thread in flight at once; dA_raw and
//           dP_raw's lower block triangles by cp.async meanwhile (not with bf16 products, below);
//   masks   S = K Kᵀ and QK = Q Kᵀ on the lower block triangle, five tiles per warp (as the fused
//           front's G), by 16-bit mma on 16-bit rows. In registers: dS = dA b_i D and Z's part
//           dS ⊙ S on the K warps, dPm and Z's part dPm ⊙ QK on the Q warps; dS and dPm replace
//           dA_raw and dP_raw in shared memory (with bf16 products: go to bf16 tiles of their
//           own), Z's row and column sums and Σ_j dA S D go to per-row accumulators;
//   dq, dk  warp w takes row strip w % 4 and half the columns: dq = dPm K (k-steps left of the
//           diagonal block), dk = (dS + dSᵀ) K (all k-steps) + dPmᵀ Q (from the diagonal block on),
//           nine k-blocks per strip whichever strip; the epilogue adds e dQg, b e dRw and κ dKd
//           read at the fragments' positions (fp32, or bf16 with bf16_grads), writes rows below
//           the chunk's length to the token layout, and sums dRw ⊙ K, dQg ⊙ Q and dKd ⊙ K per row;
//   dv      dv = b dRu and Σ(dRu ⊙ V) per row, a warp per row; or Σ(dRu ⊙ V) read from
//           dbeta_v where the solve's backward took dRu's part (and wrote dv);
//   rows    dβ, dγ, and dg as the reverse cumsum of dγ.
// At dk = 96 with bf16 products (one pass over each half's columns), dq and dk's epilogues may
// also apply L2Norm's backward as they store (GdrChunkBackwardTailArgs::q_rstd; see the dq, dk
// phase): no pass of the norm's own over dq and dk through memory.
// The other products are split-TF32 mma.sync (kernels/gdr_chunk_mma.cuh), skipping the products
// with a bf16 or fp16 operand's zero remainder; or, with bf16_products, bf16 mma: the masks'
// backward then reads dA_raw and dP_raw straight from global memory and writes dS + dSᵀ and dPm
// as bf16 tiles (18 KiB) in place of the fp32 ones (34 KiB), read by ldmatrix
// (kernels/ldmatrix.cuh); staged in fp32 as well, the block took 81 KiB at dk = 96, two an SM. (dS
// and dPm rounded to TF32 instead of split, as the solve's backward takes them under 16-bit
// training, made this kernel slower: 0.76 -> 0.83 ms at bench gdr's shape, docs/perf.md stop 32.)
// Per-row sums go through shared-memory atomics, as in the masks' backward kernel (gdr_chunk.cu).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/gdr_chunk_backward_tail.h"
#include "kernels/gdr_chunk_io.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_chunk_stage.cuh"
#include "kernels/ldmatrix.cuh"

namespace kernels {

namespace {

using namespace gdr_chunk_io;
using namespace gdr_chunk_mma;
using namespace gdr_chunk_stage;

constexpr int kC = 64;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTPitch = kC + 4;  // rows of dS and dPm (read as [m][k] and, transposed, as [k][m])
constexpr int kPitch16 = kC + 8;  // rows of the bf16 dS + dSᵀ and dPm (bf16_products): 9 16-byte units

// Shared memory, regions of kC rows of a multiple of 16 bytes (cp.async's alignment):
//   Q, K     [C][qk_pitch] each, of q and k's staged type (qk_bytes a value);
//   dS, dPm  [C][kTPitch] each in fp32, only without bf16 products; the per-row values in fp32;
//   with bf16 products, dS + dSᵀ and dPm in bf16, [C][kPitch16] each;
//   last, only for a launch that takes L2Norm's backward (norm_rows), its four per-row values.
// Rows of fp32 are padded by 4 elements, 16-bit rows by 8 (16 bytes either way): every dk taken
// (a multiple of 16) then puts a fragment's loads in 32 different banks, for 16-bit rows in both
// orientations (K and Q are read as [n][k] for the masks and as [k][n] for dq and dk).
__host__ __device__ constexpr int qk_region_bytes(int dk, int qk_bytes) { return kC * qk_pitch(dk, qk_bytes) * qk_bytes; }
// The fp32 dS and dPm tiles only without bf16 products: with them, the masks' backward reads dA_raw
// and dP_raw from global memory (each element once, by one lane) and writes only the bf16 tiles.
__host__ __device__ constexpr int fp32_tile_floats(bool bf16_products) { return bf16_products ? 0 : 2 * kC * kTPitch; }
constexpr int kRowFloats = 12 * kC;  // γ, b, e, κ, b e and the seven per-row sums
constexpr int kNormRowFloats = 4 * kC;  // L2Norm's r and Σ(y ⊙ dy) of q's and k's rows
constexpr int kBf16TileBytes = 2 * kC * kPitch16;
__host__ __device__ constexpr int smem_bytes(int dk, int qk_bytes, bool bf16_products, bool norm_rows = false) {
  return 2 * qk_region_bytes(dk, qk_bytes) + 4 * (fp32_tile_floats(bf16_products) + kRowFloats) +
         (bf16_products ? 2 * kBf16TileBytes : 0) + (norm_rows ? 4 * kNormRowFloats : 0);
}
static_assert(smem_bytes(128, 2, false) == 72704 && smem_bytes(128, 4, false) == 105472 &&
                  smem_bytes(128, 2, true) == 56320 && smem_bytes(96, 2, true) == 48128 &&
                  smem_bytes(96, 2, true, true) == 49152,
              "71 KiB and 103 KiB at dk = 128; with bf16 products 55 KiB, 47 KiB at dk = 96 (48 with L2Norm's rows)");
// Blocks an SM the kernel is compiled for: three for the fixed head sizes' instances with bf16
// products (80 registers a thread, 12 bytes spilled, 52 at dk = 96 with L2Norm's backward), else
// two (128 registers; the instance
// that reads the sizes as arguments spills ~860 bytes at 80).
template <bool kBf16Products, int kDK>
constexpr int kMinBlocks = kBf16Products && kDK > 0 ? 3 : 2;
// The instances whose dq, dk phase covers each half's columns in one pass (dk = 96 with bf16
// products), the ones that take L2Norm's backward (GdrChunkBackwardTailArgs::q_rstd).
template <bool kBf16Products, int kDK>
constexpr bool kOnePass = kBf16Products && kDK == 96;

// Elements at, at + 1 (at even) of a chunk-layout input in fp32, or in bf16 (kBf16).
template <bool kBf16>
__device__ __forceinline__ float2 load_pair(const void* base, int64_t at) {
  if constexpr (kBf16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(base) + at));
  } else {
    return *reinterpret_cast<const float2*>(static_cast<const float*>(base) + at);
  }
}

// acc (+)= A B for a 16-row strip from row m0 and kW 8-column tiles from column n0 (kW even), k from
// k_begin to k_end in steps of 16, by bf16 mma on ldmatrix fragments: A a row-major bf16 [m][k]
// tile, or with kTransposed the transpose of a row-major [k][m] one; B a row-major bf16 [k][n]
// tile. A pair whose second tile lies past the columns used reads the rows' padding (not stored).
template <int kW, bool kTransposed>
__device__ __forceinline__ void bf16_strip_accumulate(float (&acc)[kW][4], const __nv_bfloat16* A_s, int pa, int m0,
                                                      int k_begin, int k_end, const __nv_bfloat16* B_s, int pb, int n0,
                                                      int lane) {
  static_assert(kW % 2 == 0, "tiles in pairs");
  for (int k0 = k_begin; k0 < k_end; k0 += 16) {
    Frag16A a;
    if constexpr (kTransposed) {
      ldsm_a_of_transposed(a.r, A_s, pa, m0, k0, lane);
    } else {
      ldsm_a(a.r, A_s, pa, m0, k0, lane);
    }
#pragma unroll
    for (int np = 0; np < kW / 2; ++np) {
      uint32_t b[4];
      ldsm_b_pair(b, B_s, pb, k0, n0 + 16 * np, lane);
      mma16<__nv_bfloat16>(acc[2 * np], a, Frag16B{{b[0], b[1]}});
      mma16<__nv_bfloat16>(acc[2 * np + 1], a, Frag16B{{b[2], b[3]}});
    }
  }
}

// Tiles per pass when a warp covers n 8-column tiles: n itself up to 4, else the largest of 4, 3, 2
// that divides n (no pass computes clamped tiles it does not store), else 4.
__device__ __forceinline__ int pass_tiles(int n) {
  if (n <= 4) return n;
  for (int w = 4; w >= 2; --w) {
    if (n % w == 0) return w;
  }
  return 4;
}

// kBf16Grads: dQg, dRw and dKd in bf16 (GdrChunkBackwardTailArgs::bf16_grads; instantiated for q, k
// and v of one 16-bit type only, the 16-bit training path). kBf16Products: dq and dk's products in
// bf16 (GdrChunkBackwardTailArgs::bf16_products; with kBf16Grads and bf16 q, k, v only).
// kDK, kDV: the head sizes known at compile time (with_head_sizes), 0: l.dk and l.dv.
// kExactDecay: expf for the masks' decays on the 16-bit path too (gdr_chunk_fast_decay off; fixed
// head sizes only).
template <typename T, typename TV, int VW, bool kBf16Grads, bool kBf16Products, int kDK = 0, int kDV = 0,
          bool kExactDecay = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks<kBf16Products, kDK>)
    gdr_chunk_backward_tail_kernel(GdrChunkList l, GdrChunkBackwardTailArgs a) {
  // Inputs given in bf16 or fp16 are TF32 values: their products skip the remainders' terms, and
  // the masks' products take the 16-bit mma on the staged rows.
  constexpr bool kQkExact = !std::is_same<T, float>::value;
  constexpr bool kFastDecay = kQkExact && !kExactDecay;  // the 16-bit path, as the front's (decay_between)
  static_assert(!kBf16Products || (kBf16Grads && std::is_same<T, __nv_bfloat16>::value), "bf16 products: bf16 q, k");
  using SQ = Staged<T>;
  extern __shared__ __align__(16) float smem[];
  const int dk = kDK > 0 ? kDK : static_cast<int>(l.dk), dv = kDV > 0 ? kDV : static_cast<int>(l.dv);
  const int pk = qk_pitch(dk, sizeof(SQ));
  // Regions offset in elements of their own type, not in bytes from a char*: the compiler then
  // shares address registers between them (byte offsets spill ~90 bytes in dq, dk).
  const int qk_bytes = qk_region_bytes(dk, sizeof(SQ));
  SQ* Q_s = reinterpret_cast<SQ*>(smem);                    // [C][pk]
  SQ* K_s = Q_s + qk_bytes / static_cast<int>(sizeof(SQ));  // [C][pk]
  float* dS_s = smem + 2 * qk_bytes / 4;                    // [C][kTPitch], without bf16 products
  float* dPm_s = dS_s + kC * kTPitch;                       // [C][kTPitch], without bf16 products
  float* gam_s = dS_s + fp32_tile_floats(kBf16Products);
  float* b_s = gam_s + kC;
  float* e_s = b_s + kC;
  float* kap_s = e_s + kC;
  float* be_s = kap_s + kC;
  float* row_z = be_s + kC;   // Σ_j Z[i][j]
  float* col_z = row_z + kC;  // Σ_i Z[i][j]
  float* row_db = col_z + kC;  // Σ_j dA S D
  float* rw_k = row_db + kC;  // Σ dRw ⊙ K
  float* qg_q = rw_k + kC;    // Σ dQg ⊙ Q
  float* kd_k = qg_q + kC;    // Σ dKd ⊙ K
  float* ru_v = kd_k + kC;    // Σ dRu ⊙ V
  // bf16 products: dS + dSᵀ and dPm as bf16 [C][kPitch16] (dPm's tiles above the block diagonal
  // are neither written nor read).
  __nv_bfloat16* dSsym16 = reinterpret_cast<__nv_bfloat16*>(ru_v + kC);
  __nv_bfloat16* dPm16 = dSsym16 + kC * kPitch16;
  // L2Norm's backward (GdrChunkBackwardTailArgs::q_rstd), after the rest (only such launches have
  // room for them): the scales r of q's and k's rows, and the rows' Σ(y ⊙ dy) of dq and dk.
  float* rq_s = reinterpret_cast<float*>(smem_bytes(dk, sizeof(SQ), kBf16Products) + reinterpret_cast<char*>(smem));
  float* rk_s = rq_s + kC;
  float* dot_q = rk_s + kC;
  float* dot_k = dot_q + kC;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t r = blockIdx.x, n = r / l.H, h = r % l.H;
  const int64_t start = l.chunk_start[n];
  const int len = l.chunk_len[n];
  const bool norm = kOnePass<kBf16Products, kDK> && a.q_rstd != nullptr;  // L2Norm's backward in dq, dk
  // A fixed layout's spare chunk (no tokens: a step captured as a CUDA graph plans for the most
  // chunks a batch can have) has nothing to write: every output is a token's.
  if (len == 0) return;

  // dA_raw and dP_raw's lower block triangles into dS_s and dPm_s by cp.async (the masks' backward
  // turns them into dS and dPm in place); zeros above it, where dS is read as dSᵀ. With bf16
  // products the masks' backward reads them from global memory instead.
  const float* dA_raw = a.dA_raw + r * kC * kC;
  const float* dP_raw = a.dP_raw != nullptr ? a.dP_raw + r * kC * kC : nullptr;
  if constexpr (!kBf16Products) {
    for (int e = tid; e < kC * kC / 4; e += kThreads) {
      const int i = e / (kC / 4), c = 4 * (e % (kC / 4));
      const bool lower = c < 16 * (i / 16 + 1);
      cp_async16_zfill(dS_s + i * kTPitch + c, dA_raw + i * kC + c, lower);
      cp_async16_zfill(dPm_s + i * kTPitch + c, dP_raw != nullptr ? dP_raw + i * kC + c : dA_raw, lower && dP_raw != nullptr);
    }
    cp_async_commit();
  }

  // Gates, and zeros for the accumulators.
  if (tid < kC) row_z[tid] = col_z[tid] = row_db[tid] = rw_k[tid] = qg_q[tid] = kd_k[tid] = ru_v[tid] = 0.f;
  if (norm && tid < kC) {
    rq_s[tid] = tid < len ? a.q_rstd[(start + tid) * l.H + h] : 0.f;
    rk_s[tid] = tid < len ? a.k_rstd[(start + tid) * l.H + h] : 0.f;
    dot_q[tid] = dot_k[tid] = 0.f;
  }
  stage_gates(a.g, a.beta, start, len, l.H, h, gam_s, b_s);
  if (tid < kC) {
    e_s[tid] = expf(gam_s[tid]);
    kap_s[tid] = expf(gam_s[kC - 1] - gam_s[tid]);
    be_s[tid] = b_s[tid] * e_s[tid];
  }

  // Q and K into shared memory.
  stage_qk<VW>(static_cast<const T*>(a.q), static_cast<const T*>(a.k), l.H * dk, h, dk, start, len, Q_s, K_s, pk,
               [](int, int, const float*, const float*) {});
  cp_async_wait<0>();
  __syncthreads();

  // The masks' backward on S = K Kᵀ (warps 4–7) and QK = Q Kᵀ (warps 0–3), lower block triangle,
  // five tiles a warp in one pass (LowerTriangleTiles).
  {
    const bool is_q = warp < 4, have_dP = a.dP_raw != nullptr;
    const SQ* X_s = is_q ? Q_s : K_s;
    const LowerTriangleTiles tiles(warp % 4);
    // With bf16 products, this lane's pairs of dP_raw (Q warps) or dA_raw (K warps), loaded before
    // the product so that their latency passes under it.
    float2 raw[5][2];
    if constexpr (kBf16Products) {
      const float* src = is_q ? dP_raw : dA_raw;
#pragma unroll
      for (int nt = 0; nt < 5; ++nt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = 16 * tiles.strip(nt) + g + 8 * hr, j = 8 * tiles.n(nt) + 2 * t;
          raw[nt][hr] = src != nullptr ? __ldg(reinterpret_cast<const float2*>(src + i * kC + j)) : float2{};
        }
      }
    }
    // This lane's part of rows m0 + g and m0 + g + 8 of the strip being done (a strip's tiles are
    // consecutive), added into the block's row sums when its last tile is done.
    float zr[2] = {0.f, 0.f}, dbr[2] = {0.f, 0.f};
    auto flush_rows = [&](int m0) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float s = sum_over_t(zr[hr]), sdb = sum_over_t(dbr[hr]);
        if (t == 0) {
          atomicAdd(row_z + m0 + g + 8 * hr, s);
          if (!is_q) atomicAdd(row_db + m0 + g + 8 * hr, sdb);
        }
        zr[hr] = dbr[hr] = 0.f;
      }
    };
#pragma unroll
    for (int nt = 0; nt < 5; ++nt) {
      const int m0 = 16 * tiles.strip(nt);
      const int j = 8 * tiles.n(nt) + 2 * t;
      // One tile's product at a time (k inner): its accumulators are all a lane holds, where five
      // tiles' products interleaved held twenty and spilled.
      float acc1[1][4];
      strip_times_kt<1>(acc1, X_s, K_s, pk, dk, m0, 8 * tiles.n(nt), g, t);
      float zc[2] = {0.f, 0.f};  // this lane's part of columns j, j + 1
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = m0 + g + 8 * hr;
        float2* io = reinterpret_cast<float2*>((is_q ? dPm_s : dS_s) + i * kTPitch + j);
        float2 staged;  // dP_raw (Q warps) or dA_raw (K warps)
        if constexpr (kBf16Products) {
          staged = raw[nt][hr];
        } else {
          staged = *io;
        }
        const float in[2] = {staged.x, staged.y};
        float out[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float x = acc1[0][2 * hr + c];
          float z = 0.f, o = 0.f;
          if (is_q) {
            if (have_dP && i >= j + c) {
              o = a.scale * in[c] * decay_between<kFastDecay>(gam_s[i], gam_s[j + c]);  // dPm
              z = o * x;
            }
          } else if (i > j + c) {
            const float D = decay_between<kFastDecay>(gam_s[i], gam_s[j + c]);
            const float dA = -in[c];
            o = dA * b_s[i] * D;  // dS
            z = o * x;
            dbr[hr] += dA * x * D;
          }
          out[c] = o;
          zr[hr] += z;
          zc[c] += z;
        }
        if constexpr (kBf16Products) {
          // dS is strictly lower triangular, so each element of dS + dSᵀ is one of the two:
          // dS at (i, j) below the diagonal, zero on it, dS's (j, i) above it, written here
          // by transposition; nothing is written twice.
          __nv_bfloat16* row16 = (is_q ? dPm16 : dSsym16) + i * kPitch16 + j;
          if (is_q || i > j) {
            *reinterpret_cast<__nv_bfloat162*>(row16) = __floats2bfloat162_rn(out[0], out[1]);
          } else if (i == j) {
            row16[0] = __float2bfloat16_rn(0.f);
          }
          if (!is_q) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              if (i > j + c) dSsym16[(j + c) * kPitch16 + i] = __float2bfloat16_rn(out[c]);
            }
          }
        } else {
          *io = make_float2(out[0], out[1]);
        }
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float s = sum_over_g(zc[c]);
        if (g == 0) atomicAdd(col_z + j + c, s);
      }
      if (nt < 4 && nt + 1 == tiles.split) flush_rows(m0);  // the even warp's first strip is done
    }
    flush_rows(16 * tiles.strip(4));
  }
  __syncthreads();

  // dq = dPm K + e dQg and dk = (dS + dSᵀ) K + dPmᵀ Q + b e dRw + κ dKd: warp w takes row strip
  // w % 4 and half of dk's columns, in passes of up to four 8-column tiles (pass_tiles; pairs of
  // tiles with bf16 products, or all six in one pass at a compile-time dk of 96).
  //
  // With L2Norm's backward (norm), each epilogue stores dx = r dy − (r Σ(y ⊙ dy)) y, y the staged
  // q or k, dy the value the epilogue would store. The one pass holds a row's half in each of two
  // warps' accumulators, so their sums of y ⊙ dy meet in shared memory behind the two warps'
  // barrier before the stores: the sum of the fp32 values (the norm's own kernel reads them
  // rounded to bf16). Measured and not kept (docs/perf.md, stop 59): a pass over the written rows
  // at the kernel's end, read back from L2 (0.20 ms a step at hybrid base, as much as the norm's
  // kernel); the rows' sums worked out from the masks' (dS and dPm in fp32 where the products
  // take them in bf16: 2.8e-3 off).
  {
    const int mt = warp % 4, m0 = 16 * mt, half = warp / 4;
    const int n_half = dk / 16;  // tiles per half
    T* dq = static_cast<T*>(a.dq);
    T* dkk = static_cast<T*>(a.dk);
    float srw[2] = {0.f, 0.f}, sqg[2] = {0.f, 0.f}, skd[2] = {0.f, 0.f};
    // With norm, the next epilogue's r and r Σ(y ⊙ dy) for this lane's rows m0 + g + 8 hr.
    float nr[2] = {0.f, 0.f}, na[2] = {0.f, 0.f};
    // With norm: the pass's Σ(y ⊙ dy) of this lane's rows, dy(nt, hr) = (first, second) of tile nt,
    // row m0 + g + 8 hr; summed over both halves' warps in dot_s, then the epilogue's scales.
    auto norm_scales = [&](int n0, int n_tiles, const SQ* Y_s, float* dot_s, const float* r_s, auto dy) {
      float part[2] = {0.f, 0.f};
#pragma unroll
      for (int nt = 0; nt < 6; ++nt) {
        if (nt >= n_tiles) continue;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = m0 + g + 8 * hr, c = n0 + 8 * nt + 2 * t;
          const float2 v = dy(nt, hr);
          part[hr] += to_f32(Y_s[i * pk + c]) * v.x + to_f32(Y_s[i * pk + c + 1]) * v.y;
        }
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float s = sum_over_t(part[hr]);
        if (t == 0) atomicAdd(dot_s + m0 + g + 8 * hr, s);
      }
      // The row strip's two warps (halves 0 and 1) meet at a barrier of their own (ids 1 – 4; 0 is
      // __syncthreads'): the others need not wait for them.
      asm volatile("bar.sync %0, 64;" ::"r"(1 + mt) : "memory");
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = m0 + g + 8 * hr;
        nr[hr] = r_s[i];
        na[hr] = r_s[i] * dot_s[i];
      }
    };
    // The epilogues of a pass's tiles, from tile `first` of this half, n_tiles of them stored;
    // qg_at(nt, hr, at), rw_at and kd_at give dQg's, dRw's and dKd's pair at element `at`, row
    // m0 + g + 8 hr of tile nt.
    auto loaded = [&](const void* base) {
      return [base](int, int, int64_t at) { return base != nullptr ? load_pair<kBf16Grads>(base, at) : make_float2(0.f, 0.f); };
    };
    auto dq_epilogue = [&](const auto& acc, int first, int n_tiles, auto qg_at) {
      constexpr int kW = std::extent<std::remove_reference_t<decltype(acc)>>::value;
#pragma unroll
      for (int nt = 0; nt < kW; ++nt) {
        if (nt >= n_tiles) continue;
        const int c = half * (dk / 2) + 8 * (first + nt) + 2 * t;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = m0 + g + 8 * hr;
          const float2 qg = qg_at(nt, hr, (r * kC + i) * dk + c);
          sqg[hr] += qg.x * to_f32(Q_s[i * pk + c]) + qg.y * to_f32(Q_s[i * pk + c + 1]);
          if (i < len) {
            float x0 = acc[nt][2 * hr] + e_s[i] * qg.x, x1 = acc[nt][2 * hr + 1] + e_s[i] * qg.y;
            if (norm) {
              x0 = nr[hr] * x0 - na[hr] * to_f32(Q_s[i * pk + c]);
              x1 = nr[hr] * x1 - na[hr] * to_f32(Q_s[i * pk + c + 1]);
            }
            store2(dq + ((start + i) * l.H + h) * dk + c, x0, x1);
          }
        }
      }
    };
    auto dk_epilogue = [&](const auto& acc, int first, int n_tiles, auto rw_at, auto kd_at) {
      constexpr int kW = std::extent<std::remove_reference_t<decltype(acc)>>::value;
#pragma unroll
      for (int nt = 0; nt < kW; ++nt) {
        if (nt >= n_tiles) continue;
        const int c = half * (dk / 2) + 8 * (first + nt) + 2 * t;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = m0 + g + 8 * hr;
          const int64_t row = (r * kC + i) * dk + c;
          const float2 rw = rw_at(nt, hr, row);
          const float2 kd = kd_at(nt, hr, row);
          const float k0v = to_f32(K_s[i * pk + c]), k1v = to_f32(K_s[i * pk + c + 1]);
          srw[hr] += rw.x * k0v + rw.y * k1v;
          skd[hr] += kd.x * k0v + kd.y * k1v;
          if (i < len) {
            float x0 = acc[nt][2 * hr] + be_s[i] * rw.x + kap_s[i] * kd.x;
            float x1 = acc[nt][2 * hr + 1] + be_s[i] * rw.y + kap_s[i] * kd.y;
            if (norm) {
              x0 = nr[hr] * x0 - na[hr] * k0v;
              x1 = nr[hr] * x1 - na[hr] * k1v;
            }
            store2(dkk + ((start + i) * l.H + h) * dk + c, x0, x1);
          }
        }
      }
    };
    if constexpr (kBf16Products) {
      auto passes = [&](auto count) {
        constexpr int kW = decltype(count)::value;
        for (int first = 0; first < n_half; first += kW) {
          const int n_tiles = n_half - first < kW ? n_half - first : kW;
          const int n0 = half * (dk / 2) + 8 * first;
          // The epilogues' bf16 pairs of dQg, dRw and dKd, loaded before the products so that the
          // loads' latency passes under them (the kernel waits on global loads most of its time).
          uint32_t qg[kW][2], rw[kW][2], kd[kW][2];
#pragma unroll
          for (int nt = 0; nt < kW; ++nt) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const int tile = first + nt < n_half ? first + nt : first;  // in bounds, not stored
              const int64_t at = (r * kC + m0 + g + 8 * hr) * dk + half * (dk / 2) + 8 * tile + 2 * t;
              auto pair = [at](const void* base) {
                return base != nullptr ? __ldg(reinterpret_cast<const unsigned int*>(static_cast<const __nv_bfloat16*>(base) + at)) : 0u;
              };
              qg[nt][hr] = pair(a.dQg);
              rw[nt][hr] = pair(a.dRw);
              kd[nt][hr] = pair(a.dKd);
            }
          }
          auto from = [](const uint32_t (&x)[kW][2]) {
            return [&x](int nt, int hr, int64_t) {
              return make_float2(__uint_as_float(x[nt][hr] << 16), __uint_as_float(x[nt][hr] & 0xffff0000u));
            };
          };
          float acc[kW][4] = {};
          bf16_strip_accumulate<kW, false>(acc, dPm16, kPitch16, m0, 0, m0 + 16, K_s, pk, n0, lane);
          if constexpr (kOnePass<kBf16Products, kDK>) {
            if (norm) {
              norm_scales(n0, n_tiles, Q_s, dot_q, rq_s, [&](int nt, int hr) {
                const float e = e_s[m0 + g + 8 * hr];
                const float2 q2 = from(qg)(nt, hr, 0);
                return make_float2(acc[nt][2 * hr] + e * q2.x, acc[nt][2 * hr + 1] + e * q2.y);
              });
            }
          }
          dq_epilogue(acc, first, n_tiles, from(qg));
#pragma unroll
          for (int nt = 0; nt < kW; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
          }
          bf16_strip_accumulate<kW, false>(acc, dSsym16, kPitch16, m0, 0, kC, K_s, pk, n0, lane);
          bf16_strip_accumulate<kW, true>(acc, dPm16, kPitch16, m0, m0, kC, Q_s, pk, n0, lane);
          if constexpr (kOnePass<kBf16Products, kDK>) {
            if (norm) {
              norm_scales(n0, n_tiles, K_s, dot_k, rk_s, [&](int nt, int hr) {
                const int i = m0 + g + 8 * hr;
                const float2 r2 = from(rw)(nt, hr, 0), k2 = from(kd)(nt, hr, 0);
                return make_float2(acc[nt][2 * hr] + be_s[i] * r2.x + kap_s[i] * k2.x,
                                   acc[nt][2 * hr + 1] + be_s[i] * r2.y + kap_s[i] * k2.y);
              });
            }
          }
          dk_epilogue(acc, first, n_tiles, from(rw), from(kd));
        }
      };
      // dk = 96 known at compile time (kDK): its six tiles a half in one pass, so the A fragments
      // are read once and all the epilogue's loads are in flight together (three passes of two
      // took a quarter of the kernel's stall samples in their address arithmetic and waits).
      if constexpr (kDK == 96) {
        passes(std::integral_constant<int, 6>{});
      } else if (n_half % 4 == 0) {
        passes(std::integral_constant<int, 4>{});
      } else {
        passes(std::integral_constant<int, 2>{});
      }
    } else {
      with_tile_count(pass_tiles(n_half), [&](auto count) {
        constexpr int kW = decltype(count)::value;
        for (int pass = 0; pass * kW < n_half; ++pass) {
          const int n_tiles = n_half - kW * pass < kW ? n_half - kW * pass : kW;
          auto col = [&](int nt) { return half * (dk / 2) + 8 * (kW * pass + (nt < n_tiles ? nt : n_tiles - 1)); };
          // dq first, then dk: one set of accumulators live at a time.
          float acc[kW][4];
          strip_product<kW, false, kQkExact>(
              acc, 0, m0 + 16, [&](int k0) { return frag_a(dPm_s, kTPitch, m0, k0, g, t); },
              [&](int k0, int nt) { return frag_b_kn<kQkExact>(K_s, pk, k0, col(nt), g, t); });
          dq_epilogue(acc, kW * pass, n_tiles, loaded(a.dQg));
          // (dS + dSᵀ) as the A operand: both halves loaded and added before the split.
          strip_product<kW, false, kQkExact>(
              acc, 0, kC,
              [&](int k0) {
                FragA f;
                const int rr[4] = {m0 + g, m0 + g + 8, m0 + g, m0 + g + 8},
                          cc[4] = {k0 + t, k0 + t, k0 + t + 4, k0 + t + 4};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  split_tf32(dS_s[rr[e] * kTPitch + cc[e]] + dS_s[cc[e] * kTPitch + rr[e]], f.big[e], f.small[e]);
                }
                return f;
              },
              [&](int k0, int nt) { return frag_b_kn<kQkExact>(K_s, pk, k0, col(nt), g, t); });
          strip_accumulate<kW, false, kQkExact>(
              acc, m0, kC, [&](int k0) { return frag_at(dPm_s, kTPitch, m0, k0, g, t); },
              [&](int k0, int nt) { return frag_b_kn<kQkExact>(Q_s, pk, k0, col(nt), g, t); });
          dk_epilogue(acc, kW * pass, n_tiles, loaded(a.dRw), loaded(a.dKd));
        }
      });
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float a_rw = sum_over_t(srw[hr]), a_qg = sum_over_t(sqg[hr]), a_kd = sum_over_t(skd[hr]);
      if (t == 0) {
        atomicAdd(rw_k + m0 + g + 8 * hr, a_rw);
        atomicAdd(qg_q + m0 + g + 8 * hr, a_qg);
        atomicAdd(kd_k + m0 + g + 8 * hr, a_kd);
      }
    }
  }

  // dv = b dRu, and Σ dRu ⊙ V per row: warp w takes rows w, w + 8, ..., two at a time, each lane
  // the row's pieces lane, lane + 32, ...; a row's sum is the warp's, so no atomics. (A flat loop
  // over pieces with a shared atomic per piece serialised on the row's address when rows are not
  // a multiple of 32 pieces long: 60k cycles per block at dv = 192.)
  if (a.dbeta_v != nullptr) {
    if (tid < kC) ru_v[tid] = a.dbeta_v[r * kC + tid];
  } else {
    const TV* v = static_cast<const TV*>(a.v);
    TV* dvv = static_cast<TV*>(a.dv);
    const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * dv;
    const int dv_n = dv / VW;
    for (int i0 = warp; i0 < kC; i0 += 2 * kWarps) {
      for (int pb = 0; pb < dv_n; pb += 64) {  // uniform over the warp (warp_sum below)
        const int p0 = pb + lane;
        // Up to two pieces of each of the two rows in flight.
        float dru[4][VW];
        Vec<TV, VW> vr[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = i0 + kWarps * (u / 2), pc = p0 + 32 * (u % 2);
          const bool in = pc < dv_n;
          load_n<VW>(dru[u], a.dRu + (r * kC + i) * dv + pc * VW, in);
          vr[u] = load_raw<VW>(v + (start + i) * v_stride + h * dv + pc * VW, in && i < len);
        }
        float sum[2] = {0.f, 0.f};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = i0 + kWarps * (u / 2), pc = p0 + 32 * (u % 2);
#pragma unroll
          for (int j = 0; j < VW; ++j) {
            sum[u / 2] += dru[u][j] * vr[u].get(j);
            dru[u][j] *= b_s[i];
          }
          if (pc < dv_n && i < len) store_n<VW>(dvv + ((start + i) * l.H + h) * dv + pc * VW, dru[u]);
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float s = warp_sum(sum[u]);
          if (lane == 0) ru_v[i0 + kWarps * u] += s;
        }
      }
    }
  }
  __syncthreads();

  // Per row: dβ and dγ, then dg = reverse cumsum of dγ (row_db's storage reused for dγ).
  float db = 0.f;
  float* dgam_s = row_z;
  if (tid < kC) {
    const float e = e_s[tid];
    db = row_db[tid] + e * rw_k[tid] + ru_v[tid];
    dgam_s[tid] = row_z[tid] - col_z[tid] + b_s[tid] * e * rw_k[tid] + e * qg_q[tid] - kap_s[tid] * kd_k[tid];
  }
  __syncthreads();
  if (tid < 32) {
    float x = kap_s[tid] * kd_k[tid] + kap_s[tid + 32] * kd_k[tid + 32];
    x = warp_sum(x);
    if (tid == 0) dgam_s[kC - 1] += x + a.ddecay[r] * expf(gam_s[kC - 1]);
  }
  __syncthreads();
  if (tid < len) {
    float acc = 0.f;
    for (int j = kC - 1; j >= tid; --j) acc += dgam_s[j];
    const int64_t tok = (start + tid) * l.H + h;
    a.dg[tok] = acc;
    a.dbeta[tok] = db;
  }
}

}  // namespace

namespace {

bool tail_vectorizable(const GdrChunkList& l, const GdrChunkBackwardTailArgs& a) {
  return vectorizable(l, a.in_qk, a.in_v, {a.dRu}, {a.q, a.k}, {a.v, a.dv}, a.v_token_stride);
}

}  // namespace

bool gdr_chunk_backward_tail_takes_norm(const GdrChunkList& l, const GdrChunkBackwardTailArgs& a) {
  // The instance launch_fused and with_head_sizes pick below for these arguments is a one-pass one.
  return a.bf16_grads && a.bf16_products && a.in_qk == DType::BF16 && a.in_v == DType::BF16 &&
         tail_vectorizable(l, a) && gdr_fixed_head_sizes() && l.dk == 96 && l.dv == 192 &&
         gdr_chunk_fused_supports(l.C, l.dk, l.dv);
}

int gdr_chunk_backward_tail(const GdrChunkList& l, const GdrChunkBackwardTailArgs& a, void* stream) {
  // dRw, dKd, dQg are read two floats at a time at the fragments' positions; dA_raw and dP_raw
  // move by 16-byte cp.async (or, with bf16 products, are read two floats at a time).
  if (!aligned_to(8, a.dRw, a.dKd, a.dQg) || !aligned_to(16, a.dA_raw, a.dP_raw)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // bf16 dQg, dRw and dKd only beside q, k and v of one 16-bit type (launch_fused's second variant).
  if (a.bf16_grads && (a.in_qk != a.in_v || a.in_qk == DType::F32)) return static_cast<int>(cudaErrorInvalidValue);
  // bf16 products only on that path with bf16 inputs (the dS and dPm tiles share the mma with K, Q).
  if (a.bf16_products && (!a.bf16_grads || a.in_qk != DType::BF16)) return static_cast<int>(cudaErrorInvalidValue);
  // L2Norm's backward takes both rows' scales, and the one-pass instances.
  if ((a.q_rstd == nullptr) != (a.k_rstd == nullptr) ||
      (a.q_rstd != nullptr && !gdr_chunk_backward_tail_takes_norm(l, a))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const bool vec = tail_vectorizable(l, a);
  const size_t smem =
      static_cast<size_t>(smem_bytes(static_cast<int>(l.dk), elem_bytes(a.in_qk), a.bf16_products,
                                     gdr_chunk_backward_tail_takes_norm(l, a)));
  const bool bf16_products = a.bf16_products;
  return launch_fused(
      l, a.in_qk, a.in_v, vec, kThreads, smem, stream,
      [bf16_products, &l, exact_decay = !gdr_chunk_fast_decay()](auto qk, auto v, auto w, auto bf16_grads) {
        using QK = decltype(qk);
        using V = decltype(v);
        constexpr int kW = decltype(w)::value;
        constexpr bool kGrads = decltype(bf16_grads)::value;
        if constexpr (kGrads && std::is_same<QK, __nv_bfloat16>::value) {
          if constexpr (kW == 4) {
            if (bf16_products) {
              return with_head_sizes(GdrSizedKernel::kTail, l.dk, l.dv, [exact_decay](auto dk, auto dv) {
                constexpr int kDk = decltype(dk)::value, kDv = decltype(dv)::value;
                if constexpr (kDk > 0) {
                  if (exact_decay) {
                    gdr_count_chunk_exact_decay_launch();
                    return gdr_chunk_backward_tail_kernel<QK, V, kW, true, true, kDk, kDv, true>;
                  }
                }
                return gdr_chunk_backward_tail_kernel<QK, V, kW, true, true, kDk, kDv>;
              });
            }
          }
          if (bf16_products) return gdr_chunk_backward_tail_kernel<QK, V, kW, true, true>;
        }
        return gdr_chunk_backward_tail_kernel<QK, decltype(v), decltype(w)::value, kGrads, false>;
      },
      a, a.bf16_grads);
}

}  // namespace kernels

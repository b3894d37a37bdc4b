// The fused front of the chunked gated delta rule (kernels/gdr_chunk_front.h): one block of 8 warps
// per (chunk, head). With bf16 or fp16 q, k and v (16-bit training) they are staged in shared
// memory as they come, 73.75 KiB a block at dk = 128 and three blocks per SM; fp32 inputs are
// staged in fp32, 107 KiB and two blocks (as is any mix of 16-bit and fp32 inputs).
//
//   gates   γ = cumsum(g) as a warp scan, e, κ, β e, decay;
//   load    Q and K into shared memory, four pieces per thread in flight at once; Kd = κ K and
//           Qg = e Q go out on the way (the fixed head sizes' instances with the norm: every piece
//           by cp.async, started before the gates, kCopies16);
//   G       [Q; K] Kᵀ on the 20 tiles of each matrix at or left of the diagonal blocks, five per
//           warp (strips p and 3 − p share two warps), by 16-bit mma for 16-bit q and k; the epilogue
//           applies the decay mask in registers and writes P to global memory, A to shared memory;
//   inverse (I + A)⁻¹ by 16 × 16 blocks: warps 0–1 solve the four diagonal blocks by forward
//           substitution (one column per thread) while warps 2–7 load V's first panel; then the
//           off-diagonal blocks by block diagonals, T_ij = −T_ii Σ_{j ≤ k < i} A_ik T_kj, one warp
//           per block, three levels;
//   W, U    W = (Tm diag(β e)) K and U = (Tm diag(β)) V, the diagonal scales applied to Tm's
//           fragments as they load, only the k-steps left of each strip's diagonal block (Tm is
//           lower triangular): warp w takes strips w % 2 and 3 − w % 2 (10 k-steps of 8 together)
//           on every fourth 8-column tile. With bf16 K and V these are bf16 mma in k-steps of 16
//           (5 together), the scaled Tm in two bf16 parts (scaled_tm_times_bf16).
// W, U, Kd, Qg and P are stored in fp32 or, with bf16_out, rounded to bf16 as they are stored.
// The other products are split-TF32 mma.sync (kernels/gdr_chunk_mma.cuh); an operand read from
// bf16 or fp16 inputs is a TF32 value already, so the products with its zero remainder are
// skipped. (Tm rounded to TF32 for W and U instead of split, as the solve's backward takes its
// products under 16-bit training, left this kernel's time as it was: 0.34 ms either way; what
// cost was loading each bf16 value of K and V by itself, which ldmatrix now does eight at a time.)
// Shared rows are padded so that a fragment's 32 loads fall in 32 banks where the tile is
// read in one orientation; fp32 K is read both as [n][k] (for G) and [k][n] (for W), and takes
// 2-way conflicts in the second. The bf16 W and U products' 8-byte reads of Tm (pitch 68) take
// 2-way conflicts too (a pitch of 8 mod 32 would clear them but put them on the inverse's reads).
// Per block and phase (clock64, bench gdr's shape, bf16 inputs,
// fp32 staging of stop 31): gates 3k cycles, load 10k, G 8k, inverse 13k, W 5k, U 6k.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gdr_chunk_front.h"
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
constexpr int kPanel = 128;         // columns of V per panel
constexpr int kTPitch = kC + 4;     // rows of A and Tm (read as [m][k])
constexpr int kVPitch = kPanel + 8;  // rows of a V panel (read as [k][n]), in elements
constexpr int kMPitch = 16 + 8;     // a 16 × 16 block of the inverse, read as [k][n]

// Q, K and V are staged in shared memory as they come when they come in bf16 or fp16 (their
// values exactly, in half the room: three blocks share an SM), else as fp32.
//   K      [C][qk_pitch]  of q and k's staged type (qk_bytes a value)
//   Q | V  [C][qk_pitch] of Q, then [C][kVPitch] of each V panel (v_bytes a value)
//   A, Tm, the inverse's blocks and the gates in fp32.
// Rows of fp32 are padded by 4 elements, 16-bit rows by 8 (16 bytes either way): every dk taken
// (a multiple of 16) then puts a fragment's loads in 32 different banks.
__host__ __device__ constexpr int k_region_bytes(int dk, int qk_bytes) { return kC * qk_pitch(dk, qk_bytes) * qk_bytes; }
__host__ __device__ constexpr int qv_region_bytes(int qk_bytes, int v_bytes) {
  return kC * kVPitch * (qk_bytes > v_bytes ? qk_bytes : v_bytes);  // qk_pitch ≤ kVPitch (dk ≤ 128)
}
constexpr int kFloatsAfterQkv = 2 * kC * kTPitch  // A, Tm
                                + 3 * 16 * kMPitch  // one block per warp of a level of the inverse
                                + 5 * kC;           // γ, β, e, κ, β e
__host__ __device__ constexpr int smem_bytes(int dk, int qk_bytes, int v_bytes) {
  return k_region_bytes(dk, qk_bytes) + qv_region_bytes(qk_bytes, v_bytes) + 4 * kFloatsAfterQkv;
}
// 73.75 KiB with 16-bit q, k and v at dk = 128: three blocks per SM (at most 80 registers a thread).
constexpr int min_blocks(int qk_bytes, int v_bytes) { return qk_bytes == 2 && v_bytes == 2 ? 3 : 2; }
static_assert(smem_bytes(128, 2, 2) + 1024 <= 228 * 1024 / 3, "three 16-bit blocks fit an H100 SM's shared memory");

// acc[j] = (Tm diag(scale)) B for a 16-row strip from m0 of Tm (fp32 rows of kTPitch, k < k_end)
// and kN 8-column tiles of B (bf16 rows [k][n] of b_pitch), tile j at column col0 + 32 j: bf16
// m16n8k16 mma, the scaled Tm split into two bf16 parts (split_bf16_pair), B exact. Each fragment
// of B by ldmatrix (two tiles an instruction), where the TF32 form loaded each B value by itself
// (two 16-bit loads and two shifts a tile and k-step of 8) and split every Tm value in two TF32
// parts for two mma a k-step of 8: half the mma and about a third of the loads.
template <int kN>
__device__ __forceinline__ void scaled_tm_times_bf16(float (&acc)[kN][4], const float* T_s, const float* scale, int m0,
                                                     int k_end, const __nv_bfloat16* B_s, int b_pitch, int col0,
                                                     int lane) {
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
  }
  const int g = lane / 4, t = lane % 4, m = lane / 8;
  for (int k0 = 0; k0 < k_end; k0 += 16) {
    // The A fragment's rows m0 + g and m0 + g + 8 at columns k0 + 2t, + 1 and k0 + 2t + 8, + 9.
    const float* r0 = T_s + (m0 + g) * kTPitch + k0 + 2 * t;
    const float* r1 = r0 + 8 * kTPitch;
    const float2 s0 = *reinterpret_cast<const float2*>(scale + k0 + 2 * t);
    const float2 s1 = *reinterpret_cast<const float2*>(scale + k0 + 2 * t + 8);
    const float2 x[4] = {*reinterpret_cast<const float2*>(r0), *reinterpret_cast<const float2*>(r1),
                         *reinterpret_cast<const float2*>(r0 + 8), *reinterpret_cast<const float2*>(r1 + 8)};
    Frag16A hi, lo;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 sc = i < 2 ? s0 : s1;
      split_bf16_pair(x[i].x * sc.x, x[i].y * sc.y, hi.r[i], lo.r[i]);
    }
#pragma unroll
    for (int pair = 0; pair < kN / 2; ++pair) {
      // Matrices (k0, tile j), (k0 + 8, tile j), (k0, tile j + 1), (k0 + 8, tile j + 1).
      const int j = 2 * pair;
      uint32_t b[4];
      ldmatrix_x4_trans_b16(b, B_s + (k0 + lane % 8 + 8 * (m % 2)) * b_pitch + col0 + 32 * (j + m / 2));
      mma16<__nv_bfloat16>(acc[j], hi, Frag16B{{b[0], b[1]}});
      mma16<__nv_bfloat16>(acc[j], lo, Frag16B{{b[0], b[1]}});
      mma16<__nv_bfloat16>(acc[j + 1], hi, Frag16B{{b[2], b[3]}});
      mma16<__nv_bfloat16>(acc[j + 1], lo, Frag16B{{b[2], b[3]}});
    }
    if constexpr (kN % 2 == 1) {
      uint32_t b[2];  // matrices (k0, last tile), (k0 + 8, last tile); lanes 16–31 give no address
      ldmatrix_x2_trans_b16(b, B_s + (k0 + lane % 8 + 8 * (m % 2)) * b_pitch + col0 + 32 * (kN - 1));
      mma16<__nv_bfloat16>(acc[kN - 1], hi, Frag16B{{b[0], b[1]}});
      mma16<__nv_bfloat16>(acc[kN - 1], lo, Frag16B{{b[0], b[1]}});
    }
  }
}

// L2Norm of the staged rows of Q and K (GdrChunkFrontArgs::q_norm), 16-bit T, dk 64, 96 or 128: the
// arithmetic of kernels/l2_norm.cu's pair kernel, in its order, so y and r are that kernel's bits.
// Half a warp a row; lane l of the half holds the pairs at columns 2l + 32p; r = 1/sqrt(Σ x² +
// eps) by a half-warp sum, y = x · r rounded to T back into the staged row and to q_norm / k_norm;
// qg_pair / kd_pair get y (as fp32) to write Qg and Kd from; r goes to q_rstd / k_rstd. Rows past
// the chunk's length (zeros) give zero y and write only Qg and Kd. The caller has synchronised
// after staging; the block synchronises after this before the rows are read.
template <typename T, class QgPair, class KdPair>
__device__ __forceinline__ void normalise_qk(T* Q_s, T* K_s, int pk, int dk, int64_t start, int len, int64_t H,
                                             int64_t h, const GdrChunkFrontArgs& a, QgPair qg_pair, KdPair kd_pair) {
  using T2 = Vec<T, 2>;
  const int half = (threadIdx.x % 32) / 16, c0 = 2 * (threadIdx.x % 16), warp = threadIdx.x / 32;
  const int pairs = dk / 32;
  // 2 kC rows (Q's, then K's), two a warp at a time: every lane takes the same number of steps.
  // (Four rows a half-warp in flight at once measured slower: 1.16 against 1.13 ms a step.)
  for (int row = 2 * warp + half; row < 2 * kC; row += 2 * kWarps) {
    const bool is_q = row < kC;
    const int i = row % kC;
    T* x_s = (is_q ? Q_s : K_s) + i * pk;
    float v[8];
    float ss = 0.f;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      T2 x;
      if (p < pairs) x.load(x_s + c0 + 32 * p);
      v[2 * p] = p < pairs ? x.get(0) : 0.f;
      v[2 * p + 1] = p < pairs ? x.get(1) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < 2 * pairs) ss += v[e] * v[e];
    }
    const float rr = rsqrtf(half_warp_sum(ss) + a.norm_eps);
    const int64_t tok = (start + i) * H + h;
    T* y_out = static_cast<T*>(is_q ? a.q_norm : a.k_norm) + tok * dk;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      if (p >= pairs) break;
      const int c = c0 + 32 * p;
      T2 y;
      y.set(0, v[2 * p] * rr);
      y.set(1, v[2 * p + 1] * rr);
      y.store(x_s + c);
      if (i < len) y.store(y_out + c);
      if (is_q) qg_pair(i, c, y.get(0), y.get(1));
      else kd_pair(i, c, y.get(0), y.get(1));
    }
    if (i < len && c0 == 0) (is_q ? a.q_rstd : a.k_rstd)[tok] = rr;
  }
}

// kDK, kDV: the head sizes known at compile time (with_head_sizes), 0: l.dk and l.dv. kCopies16
// (bf16 instances of fixed head sizes, launched where the rows move as 16-byte copies): q, k and V's
// panels by cp.async, with the norm q and k in flight while the gates are worked out, and V's second
// panel while the first one's product runs.
// kExactDecay: expf for the masks' decays on the 16-bit path too (gdr_chunk_fast_decay off; fixed
// head sizes only).
template <typename T, typename TV, int VW, int kDK = 0, int kDV = 0, bool kCopies16 = false, bool kExactDecay = false>
__global__ void __launch_bounds__(kThreads, min_blocks(sizeof(Staged<T>), sizeof(Staged<TV>)))
    gdr_chunk_front_kernel(GdrChunkList l, GdrChunkFrontArgs a) {
  // Inputs given in bf16 or fp16 are TF32 values: their products skip the remainders' terms, and
  // G's products take the 16-bit mma on the staged rows.
  constexpr bool kQkExact = !std::is_same<T, float>::value, kVExact = !std::is_same<TV, float>::value;
  constexpr bool kFastDecay = kQkExact && !kExactDecay;  // the 16-bit path (decay_between)
  using SQ = Staged<T>;
  using SV = Staged<TV>;
  extern __shared__ __align__(16) float smem[];
  const int dk = kDK > 0 ? kDK : static_cast<int>(l.dk), dv = kDV > 0 ? kDV : static_cast<int>(l.dv);
  const int pk = qk_pitch(dk, sizeof(SQ));
  char* const base = reinterpret_cast<char*>(smem);
  SQ* K_s = reinterpret_cast<SQ*>(base);                               // [C][pk]
  char* const QV_s = base + k_region_bytes(dk, sizeof(SQ));            // Q [C][pk], then a V panel [C][kVPitch]
  float* A_s = reinterpret_cast<float*>(QV_s + qv_region_bytes(sizeof(SQ), sizeof(SV)));  // [C][kTPitch]
  float* T_s = A_s + kC * kTPitch;  // [C][kTPitch]
  float* M_s = T_s + kC * kTPitch;  // [3][16][kMPitch]
  float* gam_s = M_s + 3 * 16 * kMPitch;
  float* b_s = gam_s + kC;
  float* e_s = b_s + kC;
  float* kap_s = e_s + kC;
  float* be_s = kap_s + kC;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  const int64_t r = blockIdx.x, n = r / l.H, h = r % l.H;
  const int64_t start = l.chunk_start[n];
  const int len = l.chunk_len[n];

  // The outputs, fp32 or bf16 (GdrChunkFrontArgs::bf16_out).
  const OutRows W_out{a.W, a.bf16_out}, U_out{a.U, a.bf16_out}, Kd_out{a.Kd, a.bf16_out};
  const OutRows Qg_out{a.Qg, a.bf16_out}, P_out{a.P, a.bf16_out};

  // A fixed layout's spare chunk (no tokens; model/gdr_plan_slots.h) gets what the products below
  // give a chunk of zero rows, without them: zero Kd, Qg, P, W and U, Tm = I, decay 1. The scans
  // read them for their dummy documents, whose states stay zero.
  if (len == 0) {
    auto zeros = [&](const OutRows& o, int64_t at, int count) {
      // Four at a time where every width is a multiple of 4 (VW) and the output's base is aligned.
      const bool four = VW == 4 && reinterpret_cast<uintptr_t>(o.base) % (o.bf16 ? 8 : 16) == 0;
      if (four) {
        for (int e = 4 * tid; e < count; e += 4 * kThreads) o.zero4(at + e);
      } else {
        for (int e = tid; e < count; e += kThreads) {
          if (o.bf16) static_cast<__nv_bfloat16*>(o.base)[at + e] = __float2bfloat16_rn(0.f);
          else static_cast<float*>(o.base)[at + e] = 0.f;
        }
      }
    };
    zeros(Kd_out, r * kC * dk, kC * dk);
    zeros(Qg_out, r * kC * dk, kC * dk);
    zeros(P_out, r * kC * kC, kC * kC);
    if (tid == 0) a.decay[r] = 1.f;
    if (a.W == nullptr) return;
    zeros(W_out, r * kC * dk, kC * dk);
    zeros(U_out, r * kC * dv, kC * dv);
    for (int e = tid; e < kC * kC; e += kThreads) a.Tm[r * kC * kC + e] = e / kC == e % kC ? 1.f : 0.f;
    return;
  }

  static_assert(!kCopies16 || (kDK > 0 && sizeof(SQ) == 2 && sizeof(SV) == 2), "16-byte copies: 16-bit rows, fixed sizes");
  if constexpr (kCopies16) {
    if (a.q_norm != nullptr) {
      const int64_t ts = a.qk_token_stride != 0 ? a.qk_token_stride : l.H * dk;
      copy_rows_async(static_cast<const T*>(a.q), ts, h * dk, dk, start, len, tid, kThreads, reinterpret_cast<SQ*>(QV_s), pk);
      copy_rows_async(static_cast<const T*>(a.k), ts, h * dk, dk, start, len, tid, kThreads, K_s, pk);
      cp_async_commit();
    }
  }

  // Gates. Rows past the chunk's length have g = β = 0 (and zero q, k, v below).
  for (int e = tid; e < kC * kTPitch; e += kThreads) T_s[e] = 0.f;
  stage_gates(a.g, a.beta, start, len, l.H, h, gam_s, b_s);
  if (tid < kC) {
    e_s[tid] = expf(gam_s[tid]);
    kap_s[tid] = expf(gam_s[kC - 1] - gam_s[tid]);
    be_s[tid] = b_s[tid] * e_s[tid];
    if (tid == 0) a.decay[r] = expf(gam_s[kC - 1]);
  }
  __syncthreads();

  // Q and K into shared memory; Kd and Qg out (with the norm, after it: normalise_qk).
  SQ* Q_s = reinterpret_cast<SQ*>(QV_s);
  const int64_t qk_ts = a.qk_token_stride != 0 ? a.qk_token_stride : l.H * dk;
  if (a.q_norm == nullptr) {
    stage_qk<VW>(static_cast<const T*>(a.q), static_cast<const T*>(a.k), qk_ts, h, dk, start, len, Q_s, K_s, pk,
                 [&](int i, int d, const float* qv, const float* kv) {
                   float qg[VW], kd[VW];
#pragma unroll
                   for (int j = 0; j < VW; ++j) {
                     qg[j] = e_s[i] * qv[j];
                     kd[j] = kap_s[i] * kv[j];
                   }
                   Qg_out.store<VW>((r * kC + i) * dk + d, qg);
                   Kd_out.store<VW>((r * kC + i) * dk + d, kd);
                 });
  } else if constexpr (kQkExact) {  // gdr_chunk_front_forward refuses the norm for fp32 q and k
    if constexpr (kCopies16) {
      cp_async_wait<0>();
    } else {
      stage_qk<VW>(static_cast<const T*>(a.q), static_cast<const T*>(a.k), qk_ts, h, dk, start, len, Q_s, K_s, pk,
                   [](int, int, const float*, const float*) {});
    }
    __syncthreads();
    normalise_qk<T>(
        Q_s, K_s, pk, dk, start, len, l.H, h, a,
        [&](int i, int c, float y0, float y1) { Qg_out.store2((r * kC + i) * dk + c, e_s[i] * y0, e_s[i] * y1); },
        [&](int i, int c, float y0, float y1) { Kd_out.store2((r * kC + i) * dk + c, kap_s[i] * y0, kap_s[i] * y1); });
  }
  // P above the diagonal blocks is zero (those tiles are not computed below).
  for (int e = tid; e < kC * kC / 4; e += kThreads) {
    const int i = e / (kC / 4), j = 4 * (e % (kC / 4));
    if (j >= 16 * (i / 16 + 1)) P_out.zero4((r * kC + i) * kC + j);
  }
  __syncthreads();

  // G = [Q; K] Kᵀ on the 20 tiles of each matrix at or left of the diagonal blocks, masked in
  // registers: P to global memory, A to shared memory. Warps 0–3 take Q, 4–7 K, five tiles a warp
  // in one pass (LowerTriangleTiles: warps 2p and 2p + 1 share the strips p and 3 − p).
  {
    const bool is_q = warp < 4;
    const SQ* X_s = is_q ? Q_s : K_s;
    const LowerTriangleTiles tiles(warp % 4);
    float acc[5][4];
    lower_tiles_times_kt(acc, X_s, K_s, pk, dk, tiles, g, t);
#pragma unroll
    for (int nt = 0; nt < 5; ++nt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = 16 * tiles.strip(nt) + g + 8 * hr, j = 8 * tiles.n(nt) + 2 * t;
        const float D0 = i >= j ? decay_between<kFastDecay>(gam_s[i], gam_s[j]) : 0.f;
        const float D1 = i >= j + 1 ? decay_between<kFastDecay>(gam_s[i], gam_s[j + 1]) : 0.f;
        const float g0 = acc[nt][2 * hr], g1 = acc[nt][2 * hr + 1];
        if (is_q) {
          P_out.store2((r * kC + i) * kC + j, g0 * D0, g1 * D1);
        } else {
          *reinterpret_cast<float2*>(A_s + i * kTPitch + j) =
              make_float2(i > j ? b_s[i] * g0 * D0 : 0.f, i > j + 1 ? b_s[i] * g1 * D1 : 0.f);
        }
      }
    }
  }
  __syncthreads();
  if (a.W == nullptr) return;  // the backward's recompute: P, Kd, Qg and decay are all it needs

  // V's panels come into Q's place (Q is no longer needed).
  const TV* v = static_cast<const TV*>(a.v);
  const int64_t v_stride = a.v_token_stride != 0 ? a.v_token_stride : l.H * dv;
  SV* V_s = reinterpret_cast<SV*>(QV_s);
  auto load_v_panel = [&](int p0, int pw, int first_thread, int n_threads) {
    stage_rows<VW>(v, v_stride, h * dv + p0, pw, start, len, tid - first_thread, n_threads, V_s, kVPitch);
  };

  // Diagonal 16 × 16 blocks of (I + A)⁻¹ on warps 0–1, one column per thread: x_i = δ_ic −
  // Σ_{j<i} A_ij x_j (the entries above the diagonal stay the zeros T_s was filled with).
  if (warp < 2) {
    const int base = 16 * (tid / 16), c = tid % 16;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < i; ++j) acc += A_s[(base + i) * kTPitch + base + j] * x[j];
      x[i] = (i == c ? 1.f : 0.f) - acc;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) T_s[(base + i) * kTPitch + base + c] = x[i];
  } else if constexpr (kCopies16) {
    copy_rows_async(v, v_stride, h * dv, dv < kPanel ? dv : kPanel, start, len, tid - 64, kThreads - 64, V_s, kVPitch);
    cp_async_commit();
  } else {
    load_v_panel(0, dv < kPanel ? dv : kPanel, 64, kThreads - 64);
  }
  __syncthreads();

  // The blocks below the diagonal, one block diagonal at a time (each reads the ones before it).
  for (int d = 1; d < 4; ++d) {
    if (warp < 4 - d) {
      const int bj = warp, bi = warp + d;
      float* M = M_s + warp * 16 * kMPitch;
      float acc[2][4];
      strip_product<2>(
          acc, 16 * bj, 16 * bi, [&](int k0) { return frag_a(A_s, kTPitch, 16 * bi, k0, g, t); },
          [&](int k0, int nt) { return frag_b_kn(T_s, kTPitch, k0, 16 * bj + 8 * nt, g, t); });
      store_strip<2>(M, kMPitch, 0, 0, acc, 1.f, g, t);
      __syncwarp();
      strip_product<2>(
          acc, 0, 16, [&](int k0) { return frag_a(T_s, kTPitch, 16 * bi, 16 * bi + k0, g, t); },
          [&](int k0, int nt) { return frag_b_kn(M, kMPitch, k0, 8 * nt, g, t); });
      store_strip<2>(T_s, kTPitch, 16 * bi, 16 * bj, acc, -1.f, g, t);
    }
    __syncthreads();
  }

  for (int e = tid; e < kC * kC / 4; e += kThreads) {
    const int i = e / (kC / 4), j = 4 * (e % (kC / 4));
    *reinterpret_cast<float4*>(a.Tm + (r * kC + i) * kC + j) = *reinterpret_cast<const float4*>(T_s + i * kTPitch + j);
  }

  // W = (Tm diag(β e)) K and U = (Tm diag(β)) V. Row strip mt needs the k-steps left of its
  // diagonal block only (Tm is lower triangular), 2 (mt + 1) of them of 8 (mt + 1 of 16 in the bf16
  // form), so warp w takes the strips p = w % 2 and 3 − p (10 k-steps of 8 together) on the
  // 8-column tiles w / 2, w / 2 + 4, ...
  const int p = warp % 2, tile0 = warp / 2;
  // dst: the output, written from element offset `at` (rows of `pitch` elements).
  // The warp's tiles tile0 + 4 j < width / 8, as many as there are (1 to 4): at dk = 96 three for W,
  // and two in dv = 192's second V panel, where four computed a tile or two that were not stored.
  auto tm_product = [&](auto b_exact, const auto* B_s, int b_pitch, int width, const float* scale, const OutRows& dst,
                        int64_t at, int64_t pitch) {
    const int n_tiles = (width / 8 - tile0 + 3) / 4;
    if (n_tiles <= 0) return;
    with_tile_count<4>(n_tiles, [&](auto count) {
      constexpr int kN = decltype(count)::value;
      constexpr bool kBExact = decltype(b_exact)::value;
      for (int strip = 0; strip < 2; ++strip) {
        const int mt = strip == 0 ? p : 3 - p;
        float acc[kN][4];
        if constexpr (std::is_same<std::remove_cv_t<std::remove_pointer_t<decltype(B_s)>>, __nv_bfloat16>::value) {
          scaled_tm_times_bf16<kN>(acc, T_s, scale, 16 * mt, 16 * (mt + 1), B_s, b_pitch, 8 * tile0, lane);
        } else {
          strip_product<kN, false, kBExact>(
              acc, 0, 16 * (mt + 1), [&](int k0) { return frag_a(T_s, kTPitch, 16 * mt, k0, g, t, scale); },
              [&](int k0, int nt) { return frag_b_kn<kBExact>(B_s, b_pitch, k0, 8 * (tile0 + 4 * nt), g, t); });
        }
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) {
          const int c = 8 * (tile0 + 4 * nt) + 2 * t;
          dst.store2(at + (16 * mt + g) * pitch + c, acc[nt][0], acc[nt][1]);
          dst.store2(at + (16 * mt + g + 8) * pitch + c, acc[nt][2], acc[nt][3]);
        }
      }
    });
  };
  tm_product(std::integral_constant<bool, kQkExact>{}, K_s, pk, dk, be_s, W_out, r * kC * dk, dk);
  if constexpr (kCopies16) {
    // V's second panel (at most one more: dv ≤ 2 · kPanel) into K's room, as soon as every warp is
    // done with K, and its product after the first panel's.
    static_assert(kDV <= 2 * kPanel, "at most two panels of V");
    constexpr int kP1 = kDV - kPanel, kP1Pitch = kP1 + 8;
    static_assert(kP1 <= 0 || kC * kP1Pitch * 2 <= k_region_bytes(kDK, 2), "V's second panel fits K's room");
    SV* V1_s = reinterpret_cast<SV*>(K_s);
    cp_async_wait<0>();
    __syncthreads();  // V's first panel is in, and K is done with
    if constexpr (kP1 > 0) {
      copy_rows_async(v, v_stride, h * dv + kPanel, kP1, start, len, tid, kThreads, V1_s, kP1Pitch);
      cp_async_commit();
    }
    tm_product(std::integral_constant<bool, kVExact>{}, V_s, kVPitch, kDV < kPanel ? kDV : kPanel, b_s, U_out,
               r * kC * dv, dv);
    if constexpr (kP1 > 0) {
      cp_async_wait<0>();
      __syncthreads();
      tm_product(std::integral_constant<bool, kVExact>{}, V1_s, kP1Pitch, kP1, b_s, U_out, r * kC * dv + kPanel, dv);
    }
    return;
  }
  for (int p0 = 0; p0 < dv; p0 += kPanel) {
    const int pw = dv - p0 < kPanel ? dv - p0 : kPanel;
    if (p0 > 0) {
      __syncthreads();  // every warp is done with the panel before
      load_v_panel(p0, pw, 0, kThreads);
      __syncthreads();
    }
    tm_product(std::integral_constant<bool, kVExact>{}, V_s, kVPitch, pw, b_s, U_out, r * kC * dv + p0, dv);
  }
}

}  // namespace

namespace {

bool front_vec(const GdrChunkList& l, const GdrChunkFrontArgs& a) {
  return a.qk_token_stride % 4 == 0 &&
         vectorizable(l, a.in_qk, a.in_v, {a.Kd, a.Qg, a.q_rstd, a.k_rstd}, {a.q, a.k, a.q_norm, a.k_norm}, {a.v},
                      a.v_token_stride);
}

}  // namespace

bool gdr_chunk_front_takes_norm(const GdrChunkList& l, const GdrChunkFrontArgs& a) {
  // The sizes the L2Norm's pair kernel takes (kernels/l2_norm.cu), whose arithmetic the front repeats.
  return (l.dk == 64 || l.dk == 96 || l.dk == 128) && a.in_qk != DType::F32 && front_vec(l, a);
}

int gdr_chunk_front_forward(const GdrChunkList& l, const GdrChunkFrontArgs& a, void* stream) {
  const bool norm = a.q_norm != nullptr || a.k_norm != nullptr || a.q_rstd != nullptr || a.k_rstd != nullptr;
  if (norm && (a.q_norm == nullptr || a.k_norm == nullptr || a.q_rstd == nullptr || a.k_rstd == nullptr ||
               !gdr_chunk_front_takes_norm(l, a))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (a.qk_token_stride != 0 && a.qk_token_stride < l.H * l.dk) return static_cast<int>(cudaErrorInvalidValue);
  const bool vec = front_vec(l, a);
  // q, k and v by 16-byte copies where they are aligned for them (and gdr_chunk_copies16 is on).
  const int64_t qk_stride = a.qk_token_stride != 0 ? a.qk_token_stride : l.H * l.dk;
  const bool copies16 = gdr_chunk_copies16() && rows_copy16(a.q, qk_stride) && rows_copy16(a.k, qk_stride) &&
                        rows_copy16(a.v, a.v_token_stride != 0 ? a.v_token_stride : l.H * l.dv);
  const size_t smem = static_cast<size_t>(smem_bytes(static_cast<int>(l.dk), elem_bytes(a.in_qk), elem_bytes(a.in_v)));
  return launch_fused(
      l, a.in_qk, a.in_v, vec, kThreads, smem, stream,
      [&l, copies16, exact_decay = !gdr_chunk_fast_decay()](auto qk, auto v, auto w, auto) {
        using QK = decltype(qk);
        using V = decltype(v);
        constexpr int kW = decltype(w)::value;
        if constexpr (std::is_same<QK, __nv_bfloat16>::value && std::is_same<V, __nv_bfloat16>::value && kW == 4) {
          return with_head_sizes(GdrSizedKernel::kFront, l.dk, l.dv, [copies16, exact_decay](auto dk, auto dv) {
            constexpr int kDk = decltype(dk)::value, kDv = decltype(dv)::value;
            if constexpr (kDk > 0) {
              if (exact_decay) gdr_count_chunk_exact_decay_launch();
              if (copies16) {
                gdr_count_chunk_copies16_launch();
                return exact_decay ? gdr_chunk_front_kernel<QK, V, kW, kDk, kDv, true, true>
                                   : gdr_chunk_front_kernel<QK, V, kW, kDk, kDv, true>;
              }
              if (exact_decay) return gdr_chunk_front_kernel<QK, V, kW, kDk, kDv, false, true>;
            }
            return gdr_chunk_front_kernel<QK, V, kW, kDk, kDv>;
          });
        }
        return gdr_chunk_front_kernel<QK, V, kW>;
      },
      a);
}

}  // namespace kernels

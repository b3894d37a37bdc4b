// The backward's products with the chunk states (kernels/gdr_chunk_state_grads.h). Two blocks of
// 8 warps per row r, one for each half of dk's columns of dQg, dW and dKd (and of dP_raw's), so a
// block needs only its half of h_in and dh_next. A block stages, by cp.async:
//   group 0: dO's C rows (through the row map), its half of h_in, all of Vn;
//   group 1: its half of dh_next;
//   group 2: dU, into dO's room once the first pass is done with dO.
// With an fp32 dU (kCompact off) dh_next's group comes in during the first pass, and two blocks fit
// an SM at bench gdr's shape (87 kB a block, 92 kB in the bf16 form). With a bf16 dU (the 16-bit
// path, kCompact) dh_next and dU both take dO's fp32 room after the first pass: 70 kB (74 kB), three
// blocks an SM, whose loads and products overlap instead. With a bf16 dO too (kDOBf16) dO takes half
// that room and dh_next the other half, in a group of its own staged with the first (it lands
// during the first pass), and dU takes dO's half after it; or, by default (kTight), dO takes a bf16
// room of its own, dh_next takes it after the first pass and dU takes Vn's after the second: at
// hybrid base's dk 96, dv 192, 71.6 KiB instead of 97.6, three blocks an SM instead of two (0.97 ->
// 0.94 ms a step); at moe-1b's dk 128, dv 256, 102 KiB instead of 136, two blocks instead of one
// (2.52 -> 2.18; docs/perf.md stop 57).
// A block takes three passes over k = dv, each warp a 16-row tile of C and a quarter of the columns:
//   pass 1 (dO)   dQg and dP_raw tiles, one A fragment for both;
//   pass 2 (Vn)   dKd tiles, and the block's share of ddecay from the staged h_in and dh_next;
//   pass 3 (dU)   dW tiles.
// The two blocks of a row add their ddecay halves to a zeroed output: two addends onto zero, so the
// sum does not depend on their order.
// The products take one of two forms (Tf32Products, Bf16Products below), chosen at the launch.
// In both the mma's k order is permuted the same way for both operands (the sum over k does not
// depend on the order), so each lane's k values of a row are consecutive and one load:
//   TF32 m16n8k8:  slots t and t + 4 of a k-step k0 are columns k0 + 2t and k0 + 2t + 1: one 8-byte
//                  fp32 or 4-byte bf16 load. Rows padded by 8 elements put a warp's loads in 32
//                  different banks for dv a multiple of 32.
//   bf16 m16n8k16: lane t's pairs (2t, 2t + 1) and (2t + 8, 2t + 9) of a k-step are columns
//                  k0 + 4t .. k0 + 4t + 3: one 16-byte fp32 or 8-byte bf16 load. A pitch of 16 mod 32
//                  elements puts each quarter-warp's 16-byte loads (two rows) and each half-warp's
//                  8-byte loads (four rows) in distinct banks.
// The pitch comes with the launch (gdr_chunk_state_grads_pitch), so the header's shared memory
// size and the kernel use one rule.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gdr_chunk_state_grads.h"
#include "kernels/gdr_head_sizes.h"
#include "kernels/smem_opt_in.cuh"
#include "kernels/tf32_mma.cuh"

namespace kernels {

namespace {

std::atomic<bool> g_tight{true};
std::atomic<int64_t> g_tight_launches{0};
std::atomic<bool> g_whole_row{true};
std::atomic<int64_t> g_whole_row_launches{0};

constexpr int kC = 64;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// rows × dv bf16 elements (row stride dv) into shared rows of pitch p.
__device__ __forceinline__ void stage_bf16(uint16_t* dst, const uint16_t* src, int rows, int dv, int p) {
  const int per_row = dv / 8;
  for (int i = threadIdx.x; i < rows * per_row; i += kThreads) {
    const int row = i / per_row, c = i % per_row;
    cp_async16(dst + row * p + 8 * c, src + static_cast<int64_t>(row) * dv + 8 * c);
  }
}

// The C rows (fp32 or bf16 bits) of chunk row r into shared rows of pitch p: row i from src row
// map[first + i] (zeros where that is −1), or first + i without a map.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, const T* src, const int32_t* map, int64_t first, int dv, int p) {
  constexpr int kPer16 = 16 / static_cast<int>(sizeof(T));
  const int per_row = dv / kPer16;
  for (int i = threadIdx.x; i < kC * per_row; i += kThreads) {
    const int row = i / per_row, c = i % per_row;
    const int64_t src_row = map != nullptr ? map[first + row] : first + row;
    const bool valid = src_row >= 0;
    const T* from = valid ? src + src_row * dv + kPer16 * c : src;
    cp_async16_zfill(reinterpret_cast<float*>(dst + row * p + kPer16 * c), reinterpret_cast<const float*>(from), valid);
  }
}

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};

// TF32 m16n8k8 (see the top): fp32 operands rounded to TF32, bf16 ones widened exactly.
struct Tf32Products {
  static constexpr int kStep = 8;
  // The A fragment of rows m0..m0+15 at k-step k0.
  static __device__ __forceinline__ FragA a(const float* x, int p, int m0, int k0, int g, int t) {
    const float2 lo = *reinterpret_cast<const float2*>(x + (m0 + g) * p + k0 + 2 * t);
    const float2 hi = *reinterpret_cast<const float2*>(x + (m0 + g + 8) * p + k0 + 2 * t);
    return {{round_tf32(lo.x), round_tf32(hi.x), round_tf32(lo.y), round_tf32(hi.y)}};
  }
  static __device__ __forceinline__ FragA a(const uint16_t* x, int p, int m0, int k0, int g, int t) {
    const uint32_t lo = *reinterpret_cast<const uint32_t*>(x + (m0 + g) * p + k0 + 2 * t);
    const uint32_t hi = *reinterpret_cast<const uint32_t*>(x + (m0 + g + 8) * p + k0 + 2 * t);
    return {{lo << 16, hi << 16, lo & 0xffff0000u, hi & 0xffff0000u}};  // the even column is the low half
  }
  // The B fragment of output columns n0..n0+7 from a bf16 tile whose rows are those columns ([n][k]).
  static __device__ __forceinline__ FragB b(const uint16_t* y, int p, int n0, int k0, int g, int t) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(y + (n0 + g) * p + k0 + 2 * t);
    return {{w << 16, w & 0xffff0000u}};
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const FragA& a, const FragB& b) { mma_tf32(d, a.r, b.r); }
};

// bf16 m16n8k16 (see the top): fp32 operands rounded to bf16 (to nearest even), bf16 ones as they are.
struct Bf16Products {
  static constexpr int kStep = 16;
  static __device__ __forceinline__ uint32_t pair_of(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ FragA a(const float* x, int p, int m0, int k0, int g, int t) {
    const float4 lo = *reinterpret_cast<const float4*>(x + (m0 + g) * p + k0 + 4 * t);
    const float4 hi = *reinterpret_cast<const float4*>(x + (m0 + g + 8) * p + k0 + 4 * t);
    return {{pair_of(lo.x, lo.y), pair_of(hi.x, hi.y), pair_of(lo.z, lo.w), pair_of(hi.z, hi.w)}};
  }
  static __device__ __forceinline__ FragA a(const uint16_t* x, int p, int m0, int k0, int g, int t) {
    const uint2 lo = *reinterpret_cast<const uint2*>(x + (m0 + g) * p + k0 + 4 * t);
    const uint2 hi = *reinterpret_cast<const uint2*>(x + (m0 + g + 8) * p + k0 + 4 * t);
    return {{lo.x, hi.x, lo.y, hi.y}};
  }
  static __device__ __forceinline__ FragB b(const uint16_t* y, int p, int n0, int k0, int g, int t) {
    const uint2 w = *reinterpret_cast<const uint2*>(y + (n0 + g) * p + k0 + 4 * t);
    return {{w.x, w.y}};
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const FragA& a, const FragB& b) {
    gdr_chunk_mma::mma16<__nv_bfloat16>(d, gdr_chunk_mma::Frag16A{{a.r[0], a.r[1], a.r[2], a.r[3]}},
                                        gdr_chunk_mma::Frag16B{{b.r[0], b.r[1]}});
  }
};

// acc[j] += A · (the 8 rows from n0 + 8j of the bf16 tile Y, read as [n][k])ᵀ at k-step k0, for the
// kN tiles of a warp.
template <class P, int kN>
__device__ __forceinline__ void mma_tiles(float (&acc)[kN][4], const FragA& A, const uint16_t* Y, int p, int n0,
                                          int k0, int g, int t) {
#pragma unroll
  for (int j = 0; j < kN; ++j) P::mma(acc[j], A, P::b(Y, p, n0 + 8 * j, k0, g, t));
}

// For each k-step k0 of dv: the A fragment of rows m0.. of X, handed to use(A, k0). Unrolled
// whole where dv is known at compile time (kDV > 0), else as the compiler picks.
template <class P, int kDV, typename TX, class Use>
__device__ __forceinline__ void over_k(const TX* X, int p, int dv, int m0, int g, int t, Use use) {
  if constexpr (kDV > 0) {
#pragma unroll
    for (int k0 = 0; k0 < kDV; k0 += P::kStep) use(P::a(X, p, m0, k0, g, t), k0);
  } else {
    for (int k0 = 0; k0 < dv; k0 += P::kStep) use(P::a(X, p, m0, k0, g, t), k0);
  }
}

// alpha · one 16 × 8 accumulator tile into out (row length ld) at rows m0.., columns n0.., in fp32 or
// rounded to bf16.
__device__ __forceinline__ void store_tile(float* out, int ld, int m0, int n0, const float (&d)[4], float alpha, int g,
                                           int t) {
  *reinterpret_cast<float2*>(out + (m0 + g) * ld + n0 + 2 * t) = make_float2(alpha * d[0], alpha * d[1]);
  *reinterpret_cast<float2*>(out + (m0 + g + 8) * ld + n0 + 2 * t) = make_float2(alpha * d[2], alpha * d[3]);
}
__device__ __forceinline__ void store_tile(__nv_bfloat16* out, int ld, int m0, int n0, const float (&d)[4],
                                           float alpha, int g, int t) {
  *reinterpret_cast<__nv_bfloat162*>(out + (m0 + g) * ld + n0 + 2 * t) = __floats2bfloat162_rn(alpha * d[0], alpha * d[1]);
  *reinterpret_cast<__nv_bfloat162*>(out + (m0 + g + 8) * ld + n0 + 2 * t) =
      __floats2bfloat162_rn(alpha * d[2], alpha * d[3]);
}
// The same into an output of either type (the launch's bf16_out, uniform over the block).
__device__ __forceinline__ void store_tile(void* out, bool bf16, int64_t first, int ld, int m0, int n0,
                                           const float (&d)[4], float alpha, int g, int t) {
  if (bf16) {
    store_tile(static_cast<__nv_bfloat16*>(out) + first, ld, m0, n0, d, alpha, g, t);
  } else {
    store_tile(static_cast<float*>(out) + first, ld, m0, n0, d, alpha, g, t);
  }
}

// The bf16 form's pitch (kernels/gdr_chunk_state_grads.h, gdr_chunk_state_grads_pitch), for the
// kernels that know dv at compile time; the launch checks the two agree.
__host__ __device__ constexpr int bf16_form_pitch(int dv) { return dv % 32 == 16 ? dv : dv + 16; }

// kNT: 8-column tiles per warp in the [C, dk] products (dk = 32 kNT: a block's half is 16 kNT
// columns, two warps share each 16-row tile of C).
// kCompact: dU in bf16, and dh_next and dU staged in dO's room after the first pass (see the top).
// P: the products' form (Tf32Products or Bf16Products); pitch_arg: the shared rows' pitch in elements.
// kDV: dv known at compile time (0: a.dv). The k-loops over dv then unroll whole and the staging
// loops divide by constants: the launch with dv as an argument spent about nine in ten of its
// instructions on loop and address arithmetic (ncu, hybrid base: 3.5k instructions a warp for 132
// mma), and the kernel is bound by issuing them.
// kDOBf16: dO in bf16 (the bf16 form with kCompact only; see the top).
// kTight (with kDOBf16): each operand staged only while a pass needs it, in 71.6 KiB at hybrid base's
// dk 96, dv 192 (three blocks an SM, against two in the 97.6 KiB of kDOBf16's other layout; kernels/
// gdr_chunk_state_grads.h, gdr_chunk_state_grads_tight): dO, h_in's half and Vn for the first pass;
// then dh_next in dO's room for the second; then dU in Vn's room for the third. Each pass waits for
// its operand, and the other blocks of the SM run meanwhile.
// kWholeRow (kTight with kDV only): one block per row for all of dk's columns (kNT = dk / 16 tiles a
// warp, four of dP_raw's), so dO, Vn and dU are staged once a row instead of once a half: 148 KB a
// row where the two halves staged 221 KB at hybrid base's sizes. dh_next's dk rows then need more
// room than dO's C rows, so dO's room takes the larger of the two; 104 KiB a block at dk 96, dv
// 192, two blocks an SM, up to 128 registers a thread.
template <class P, int kNT, bool kCompact, int kDV, bool kDOBf16 = false, bool kTight = false, bool kWholeRow = false>
__global__ void __launch_bounds__(kThreads, kWholeRow ? 2 : kCompact ? 3 : 2)
    state_grads_kernel(GdrChunkStateGradsArgs a, int pitch_arg) {
  extern __shared__ __align__(16) unsigned char smem[];
  static_assert(kDV == 0 || (std::is_same<P, Bf16Products>::value && kCompact), "fixed dv: the bf16 form's pitch");
  static_assert(!kDOBf16 || (std::is_same<P, Bf16Products>::value && kCompact), "a bf16 dO: the bf16 compact form");
  static_assert(kWholeRow || 16 * kNT <= kC, "kDOBf16: dh_next's half of dk rows fits the half of the fp32 room after dO");
  static_assert(!kWholeRow || (kTight && kDV > 0), "a whole row a block: the tight fixed-size form");
  static_assert(!kTight || kDOBf16, "the tight layout: a bf16 dO");
  // half_dk: the block's columns of dk (all of them with kWholeRow); kPT: a warp's tiles of dP_raw.
  constexpr int dk = kWholeRow ? 16 * kNT : 32 * kNT, half_dk = 16 * kNT, kPT = kWholeRow ? 4 : 2;
  // Rows of dO's room, which dh_next's half_dk rows take after the first pass in the tight layout.
  constexpr int kXRows = half_dk > kC ? half_dk : kC;
  const int dv = kDV > 0 ? kDV : a.dv;
  const int p = kDV > 0 ? bf16_form_pitch(kDV) : pitch_arg;
  const int64_t r = kWholeRow ? blockIdx.x : blockIdx.x / 2;
  const int half = kWholeRow ? 0 : blockIdx.x % 2;
  if (a.chunk_len != nullptr && a.chunk_len[r / a.heads] == 0) return;  // a spare chunk's row
  uint16_t* Hs = reinterpret_cast<uint16_t*>(smem);   // [half_dk][p] h_in's rows of this half
  uint16_t* Vs = Hs + half_dk * p;                    // [C][p] Vn
  float* Xs = reinterpret_cast<float*>(Vs + kC * p);  // [C][p] dO, then (kCompact off) dU
  uint16_t* dO16_s = reinterpret_cast<uint16_t*>(Xs);  // kDOBf16: [C][p] dO, then dU
  // [half_dk][p] dh_next's rows of this half, and (kCompact) [C][p] the bf16 dU after them; with
  // kDOBf16 dh_next after the bf16 dO, and dU in dO's place.
  // kTight: dh_next in dO's room, dU in Vn's, the warps' sums after dO's bf16 room.
  uint16_t* Ds = kTight     ? dO16_s
                 : kDOBf16  ? dO16_s + kC * p
                 : kCompact ? reinterpret_cast<uint16_t*>(Xs)
                            : reinterpret_cast<uint16_t*>(Xs + kC * p);
  uint16_t* dU_s = kTight ? Vs : kDOBf16 ? dO16_s : Ds + half_dk * p;
  float* warp_sums = kTight     ? reinterpret_cast<float*>(dO16_s + kXRows * p)
                     : kCompact ? Xs + kC * p
                                : reinterpret_cast<float*>(Ds + half_dk * p);  // [kWarps]

  const int64_t state_first = (r * dk + half * half_dk) * dv;
  if constexpr (kDOBf16) {
    stage_rows(dO16_s, static_cast<const uint16_t*>(a.dO), a.dO_rows, r * kC, dv, p);
  } else {
    stage_rows(Xs, static_cast<const float*>(a.dO), a.dO_rows, r * kC, dv, p);
  }
  stage_bf16(Hs, a.h_in + state_first, half_dk, dv, p);
  stage_bf16(Vs, a.v_new + r * kC * dv, kC, dv, p);
  cp_async_commit();
  if (!kCompact || (kDOBf16 && !kTight)) {
    stage_bf16(Ds, a.dh_next + state_first, half_dk, dv, p);
    cp_async_commit();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int m0 = 16 * (warp % 4);
  const int n_first = (warp / 4) * 8 * kNT;                 // this warp's first column within the half
  const int out_col = half * half_dk + n_first;             // ... within dk
  const int p_first = half * (kC / 2) + (warp / 4) * 8 * kPT;  // its first column of dP_raw (a row of Vn)
  const int64_t out_first = r * kC * dk;  // of dQg, dW and dKd
  float* dP = a.dP_raw + r * kC * kC;

  cp_async_wait<kCompact && (!kDOBf16 || kTight) ? 0 : 1>();
  __syncthreads();
  {  // pass 1: dQg = s dO h_inᵀ and dP_raw = dO Vnᵀ
    float q_acc[kNT][4] = {}, p_acc[kPT][4] = {};
    auto products = [&](const FragA& A, int k0) {
      mma_tiles<P>(q_acc, A, Hs, p, n_first, k0, g, t);
      mma_tiles<P>(p_acc, A, Vs, p, p_first, k0, g, t);
    };
    if constexpr (kDOBf16) {
      over_k<P, kDV>(static_cast<const uint16_t*>(dO16_s), p, dv, m0, g, t, products);
    } else {
      over_k<P, kDV>(static_cast<const float*>(Xs), p, dv, m0, g, t, products);
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) store_tile(a.dQg, a.bf16_out, out_first, dk, m0, out_col + 8 * j, q_acc[j], a.scale, g, t);
#pragma unroll
    for (int j = 0; j < kPT; ++j) store_tile(dP, kC, m0, p_first + 8 * j, p_acc[j], 1.f, g, t);
  }
  __syncthreads();  // every warp is done with dO
  if constexpr (kTight) {
    stage_bf16(Ds, a.dh_next + state_first, half_dk, dv, p);  // into dO's room; dU waits for Vn's
  } else if (kCompact) {
    if (!kDOBf16) {
      stage_bf16(Ds, a.dh_next + state_first, half_dk, dv, p);
      cp_async_commit();
    }
    stage_bf16(dU_s, static_cast<const uint16_t*>(a.dU) + r * kC * dv, kC, dv, p);
  } else {
    stage_rows(Xs, static_cast<const float*>(a.dU), nullptr, r * kC, dv, p);
  }
  cp_async_commit();
  cp_async_wait<kTight ? 0 : 1>();  // dh_next's group (the older one) has landed
  __syncthreads();
  {  // pass 2: dKd = Vn dh_nextᵀ, and this half's Σ h_in ⊙ dh_next
    float kd_acc[kNT][4] = {};
    over_k<P, kDV>(static_cast<const uint16_t*>(Vs), p, dv, m0, g, t,
           [&](const FragA& A, int k0) { mma_tiles<P>(kd_acc, A, Ds, p, n_first, k0, g, t); });
#pragma unroll
    for (int j = 0; j < kNT; ++j) store_tile(a.dKd, a.bf16_out, out_first, dk, m0, out_col + 8 * j, kd_acc[j], 1.f, g, t);

    const int words_per_row = dv / 2;
    float acc = 0.f;
    for (int i = threadIdx.x; i < half_dk * words_per_row; i += kThreads) {
      const int row = i / words_per_row, w = i % words_per_row;
      const uint32_t h = *reinterpret_cast<const uint32_t*>(Hs + row * p + 2 * w);
      const uint32_t d = *reinterpret_cast<const uint32_t*>(Ds + row * p + 2 * w);
      acc += __uint_as_float(h << 16) * __uint_as_float(d << 16) +
             __uint_as_float(h & 0xffff0000u) * __uint_as_float(d & 0xffff0000u);
    }
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) warp_sums[warp] = acc;
  }
  if constexpr (kTight) {
    __syncthreads();  // every warp is done with Vn
    stage_bf16(dU_s, static_cast<const uint16_t*>(a.dU) + r * kC * dv, kC, dv, p);
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[w];
    atomicAdd(a.ddecay + r, sum);
  }
  {  // pass 3: dW = −dU h_inᵀ
    float w_acc[kNT][4] = {};
    auto products = [&](const FragA& A, int k0) { mma_tiles<P>(w_acc, A, Hs, p, n_first, k0, g, t); };
    if constexpr (kCompact) {
      over_k<P, kDV>(static_cast<const uint16_t*>(dU_s), p, dv, m0, g, t, products);
    } else {
      over_k<P, kDV>(static_cast<const float*>(Xs), p, dv, m0, g, t, products);
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) store_tile(a.dW, a.bf16_out, out_first, dk, m0, out_col + 8 * j, w_acc[j], -1.f, g, t);
  }
}

template <class P, int kNT, bool kCompact, int kDV = 0, bool kDOBf16 = false, bool kTight = false,
          bool kWholeRow = false>
int launch_as(const GdrChunkStateGradsArgs& a, cudaStream_t stream) {
  const bool bf16_form = gdr_chunk_state_grads_bf16_form(a);
  const int pitch = static_cast<int>(gdr_chunk_state_grads_pitch(a.dv, bf16_form));
  // The tight layout: h_in's half, Vn (then dU) and dO (then dh_next), bf16 rows, and the warps' sums.
  constexpr int kBlockRows = 16 * kNT, kXRows = kBlockRows > kC ? kBlockRows : kC;
  const int bytes = kTight ? (kBlockRows + kC + kXRows) * 2 * pitch + 64
                           : static_cast<int>(gdr_chunk_state_grads_smem(a.C, a.dk, a.dv, a.dU_bf16, bf16_form));
  if (kDV > 0 && (a.dv != kDV || pitch != bf16_form_pitch(kDV))) return static_cast<int>(cudaErrorInvalidValue);
  const auto kernel = &state_grads_kernel<P, kNT, kCompact, kDV, kDOBf16, kTight, kWholeRow>;
  const int err = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
  if (err != 0) return err;
  kernel<<<static_cast<unsigned>(kWholeRow ? a.R : 2 * a.R), kThreads, bytes, stream>>>(a, pitch);
  if (kTight) ++g_tight_launches;
  if (kWholeRow) ++g_whole_row_launches;
  return static_cast<int>(cudaGetLastError());
}
// The 16-bit path's form (bf16 products and dU) at the model's value head sizes with dv known at
// compile time (128: bench gdr; 192: hybrid base and small; 256: moe-1b), else (or with
// gdr_fixed_head_sizes off) dv as an argument.
template <int kNT, bool kDOBf16, bool kTight = false>
int launch_compact_bf16(const GdrChunkStateGradsArgs& a, cudaStream_t stream) {
  if (!gdr_fixed_head_sizes() || (a.dv != 128 && a.dv != 192 && a.dv != 256)) {
    return launch_as<Bf16Products, kNT, true, 0, kDOBf16, kTight>(a, stream);
  }
  gdr_count_fixed_head_size_launch(GdrSizedKernel::kStateGrads);
  if constexpr (kTight) {
    if (g_whole_row.load()) {  // a whole row a block: kNT tiles a warp of each of dk's halves, 2 kNT of all
      if (a.dv == 128) return launch_as<Bf16Products, 2 * kNT, true, 128, true, true, true>(a, stream);
      if (a.dv == 192) return launch_as<Bf16Products, 2 * kNT, true, 192, true, true, true>(a, stream);
      return launch_as<Bf16Products, 2 * kNT, true, 256, true, true, true>(a, stream);
    }
  }
  if (a.dv == 128) return launch_as<Bf16Products, kNT, true, 128, kDOBf16, kTight>(a, stream);
  if (a.dv == 192) return launch_as<Bf16Products, kNT, true, 192, kDOBf16, kTight>(a, stream);
  return launch_as<Bf16Products, kNT, true, 256, kDOBf16, kTight>(a, stream);
}
template <int kNT>
int launch(const GdrChunkStateGradsArgs& a, cudaStream_t stream) {
  if (gdr_chunk_state_grads_bf16_form(a)) {
    if (!a.dU_bf16) return launch_as<Bf16Products, kNT, false>(a, stream);
    if (!a.dO_bf16) return launch_compact_bf16<kNT, false>(a, stream);
    return g_tight.load() ? launch_compact_bf16<kNT, true, true>(a, stream) : launch_compact_bf16<kNT, true>(a, stream);
  }
  return a.dU_bf16 ? launch_as<Tf32Products, kNT, true>(a, stream) : launch_as<Tf32Products, kNT, false>(a, stream);
}

}  // namespace

void gdr_chunk_state_grads_tight(bool on) { g_tight = on; }
int64_t gdr_chunk_state_grads_tight_launches() { return g_tight_launches.load(); }
void gdr_chunk_state_grads_whole_row(bool on) { g_whole_row = on; }
int64_t gdr_chunk_state_grads_whole_row_launches() { return g_whole_row_launches.load(); }

int gdr_chunk_state_grads(const GdrChunkStateGradsArgs& a, void* stream) {
  auto out_ok = [](const void* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!gdr_chunk_state_grads_supports(a) || !out_ok(a.dQg) || !out_ok(a.dP_raw) || !out_ok(a.dW) || !out_ok(a.dKd) ||
      a.ddecay == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t zeroed = cudaMemsetAsync(a.ddecay, 0, sizeof(float) * static_cast<size_t>(a.R), s);
  if (zeroed != cudaSuccess) return static_cast<int>(zeroed);
  switch (a.dk) {
    case 64:
      return launch<2>(a, s);
    case 96:
      return launch<3>(a, s);
    default:
      return launch<4>(a, s);
  }
}

}  // namespace kernels

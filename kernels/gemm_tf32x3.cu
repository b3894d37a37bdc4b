// Batched 3×TF32 GEMM (kernels/gemm_tf32x3.h), optionally the sum of two products over one output
// (the second pair's K slices follow the first's through the same stages). One block of 2 · kNW warps computes a 64 × 32·kNW
// tile of one batch item (kNW = 2 to 6: 64 to 192 columns); each warp a 32 × 32 part as 2 × 4
// tensor-core tiles (mma.sync m16n8k8, TF32 in, fp32 accumulate). K advances 32 at a time through
// two shared-memory stages filled by cp.async, so the next slice is in flight while this one is
// multiplied. Wide tiles matter because these products are bound by L2 traffic, not arithmetic:
// with 64 columns a [64, K] slice of A is read once per 64 columns of the output (three times for
// the delta rule's dv = 192), with the whole width once.
// Operands are staged in their global orientation (no transposing copy): a K-contiguous A tile is
// [64 m][32 k + 4], an M-contiguous one [32 k][64 m + 8], and B likewise ([32 k][BN + 8] or
// [BN n][32 k + 4]). The pads put the eight rows and four columns of a fragment load in 32
// different banks. Each fragment element is split into big + small in registers right before its
// three products. A bf16 operand is staged as bf16 (half the bytes through L2 and shared memory)
// in tiles of the same shape, padded by 16 bytes where fp32 is padded by 4 floats; its elements
// widen to fp32 exactly, and the fp32 operand beside it is rounded to TF32, so each product is one
// mma (TF32 accuracy, below the bf16 operand's own rounding; exact when both operands are bf16).
// Two bf16 operands (GemmTf32x3Args::bf16_mma, the delta rule's output product) are multiplied as
// they are staged, by bf16 m16n8k16 mma on ldmatrix fragments: per k-step of 16, two ldmatrix.x4
// for A and two for B feed eight mma, where the TF32 form loads and widens each element alone and
// takes twice the mma. The staged rows' pitches (40 elements for K-contiguous tiles, 32 · kNW + 8
// for N-contiguous ones) are odd numbers of 16-byte units: each ldmatrix matrix is one wavefront.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gdr_chunk_mma.cuh"
#include "kernels/gemm_tf32x3.h"
#include "kernels/ldmatrix.cuh"
#include "kernels/smem_opt_in.cuh"
#include "kernels/tf32_mma.cuh"

namespace kernels {

namespace {

constexpr int kBM = 64, kBK = 32;
constexpr int kPadK = kBK + 4;              // row length of an fp32 tile stored [rows][32 + 4]
constexpr int kTileA = kBK * (kBM + 8);     // = 64 · 36 = 2304: either orientation of A fits
static_assert(kBM * kPadK == kTileA, "both orientations of an A tile take the same shared memory");

// Operand element types: fp32, or bf16 as its raw bits (Bf16Bits).
struct Bf16Bits {
  uint16_t bits;
};
__device__ __forceinline__ float widen(Bf16Bits x) { return __uint_as_float(static_cast<uint32_t>(x.bits) << 16); }
template <typename T>
constexpr bool kIsBf16 = sizeof(T) == 2;
// Row length of a K-contiguous tile [rows][32 + pad]: 16 bytes of pad (4 fp32, 8 bf16) put a
// fragment's eight rows and four columns in different banks for either type.
template <typename T>
constexpr int pad_k() {
  return kBK + 16 / static_cast<int>(sizeof(T));
}

// Shared memory of a block with kNW warp strips: two stages of an A and a B tile.
__host__ __device__ constexpr int b_tile_floats(int kNW) {
  return kBK * (32 * kNW + 8) > 32 * kNW * kPadK ? kBK * (32 * kNW + 8) : 32 * kNW * kPadK;
}
__host__ __device__ constexpr int smem_bytes(int kNW) { return 2 * (kTileA + b_tile_floats(kNW)) * 4; }

// Copies the [rows × cols] slice at (r0, c0) of a matrix whose columns are contiguous (row stride
// ld) into dst [rows][pitch], 16 bytes (kV elements) per copy, kThreads threads; out-of-range
// pieces become zeros. cols_total is a multiple of kV, so a piece is wholly inside or outside.
// With map (the slice's rows gathered, GemmOperand::rows): slice row r is row map[r] of src, and
// zeros where that is negative.
template <typename T, int kRows, int kCols, int kPitch, int kThreads>
__device__ __forceinline__ void stage_slice(T* dst, const T* src, int64_t ld, int64_t r0, int64_t c0,
                                            int64_t rows_total, int64_t cols_total, const int32_t* map = nullptr) {
  constexpr int kV = 16 / static_cast<int>(sizeof(T));
  constexpr int kPieces = kRows * (kCols / kV);
  for (int p = threadIdx.x; p < kPieces; p += kThreads) {
    const int r = p / (kCols / kV), c = kV * (p % (kCols / kV));
    bool valid = r0 + r < rows_total && c0 + c < cols_total;
    int64_t row = r0 + r;
    if (map != nullptr && valid) {
      row = map[r];
      valid = row >= 0;
    }
    const T* s = valid ? src + row * ld + (c0 + c) : src;
    cp_async16_zfill(reinterpret_cast<float*>(dst + r * kPitch + c), reinterpret_cast<const float*>(s), valid);
  }
}

// A staged element as the products take it: split in two TF32 parts; or one part, exact for bf16,
// rounded to TF32 for fp32 beside a bf16 operand (kOnePart).
template <bool kOnePart, typename T>
__device__ __forceinline__ void split_operand(T x, uint32_t& big, uint32_t& small) {
  if constexpr (kIsBf16<T>) {
    big = __float_as_uint(widen(x));
  } else if constexpr (kOnePart) {
    big = round_tf32(x);
  } else {
    split_tf32(x, big, small);
  }
}

// kAK: A is K-contiguous (a.col == 1), else M-contiguous. kBNc: B is N-contiguous (b.col == 1),
// else K-contiguous. kNW: 32-column warp strips per block (the block tile is 64 × 32·kNW).
// At least 16 warps per SM (2 · kNW per block) to hide the staging's latency, as the 64-column
// version had with 4 blocks.
// Two bf16 operands in 128-column tiles (the delta rule's output at dv 128 and 256) take three
// blocks, 80 registers a thread, which they fit without spilling (the other widths spill there):
// more tiles in flight for these short-K, memory-bound products.
__host__ __device__ constexpr int min_blocks(int kNW, bool both_bf16 = false) {
  return both_bf16 && kNW == 4 ? 3 : (16 + 2 * kNW - 1) / (2 * kNW);
}

// TA, TB: the operands' element types (float or Bf16Bits); staged tiles keep the fp32 tiles'
// offsets, a bf16 tile using half of its room.
// kBf16Mma: two bf16 operands, A K-contiguous, multiplied by bf16 m16n8k16 mma (see the top).
template <bool kAK, bool kBNc, int kNW, typename TA, typename TB, bool kBf16Mma = false>
__global__ void __launch_bounds__(64 * kNW, min_blocks(kNW, kIsBf16<TA> && kIsBf16<TB>))
    gemm_tf32x3_kernel(GemmTf32x3Args g) {
  static_assert(!kBf16Mma || (kAK && kIsBf16<TA> && kIsBf16<TB>), "bf16 mma: two bf16 operands, A K-contiguous");
  constexpr int kThreads = 64 * kNW, kBN = 32 * kNW, kPadN = kBN + 8, kTileB = b_tile_floats(kNW);
  constexpr int kPadKA = pad_k<TA>(), kPadKB = pad_k<TB>();
  // Beside a bf16 operand the fp32 one is rounded to TF32 and each product is one mma: its 2⁻¹¹
  // relative error is below the 2⁻⁹ the bf16 operand carries from its own rounding.
  constexpr bool kOneProduct = kIsBf16<TA> || kIsBf16<TB>;
  extern __shared__ __align__(16) float smem[];
  float* a_s = smem;                 // [2][kTileA]
  float* b_s = smem + 2 * kTileA;    // [2][kTileB]
  const int64_t item = blockIdx.x;
  const int64_t n0 = int64_t{blockIdx.y} * kBN, m0 = int64_t{blockIdx.z} * kBM;
  // K steps 0 .. k1_steps - 1 take the first pair, the rest the second (K2 > 0).
  const int64_t k1_steps = (g.K + kBK - 1) / kBK;
  const int64_t k_steps = k1_steps + (g.K2 + kBK - 1) / kBK;

  // Gathered rows (GemmOperand::rows, first pair only): the block's 64 rows of A and the item's K
  // rows of B, read into shared memory once (a dependent global read per staged piece would hold
  // up every stage).
  // (The tests below read the kernel parameter each time rather than keep flags in registers: the
  // 80-register instances spilled with them.)
  __shared__ int32_t a_map_s[kAK ? kBM : 1], b_map_s[kBNc ? kGemmMappedRowsMax : 1];
  if (kAK && g.a.rows != nullptr) {
    for (int i = threadIdx.x; i < kBM; i += kThreads) a_map_s[i] = m0 + i < g.M ? __ldg(g.a.rows + item * g.M + m0 + i) : -1;
  }
  if (kBNc && g.b.rows != nullptr) {
    for (int i = threadIdx.x; i < g.K; i += kThreads) b_map_s[i] = __ldg(g.b.rows + item * g.K + i);
  }
  if ((kAK && g.a.rows != nullptr) || (kBNc && g.b.rows != nullptr)) __syncthreads();

  auto stage = [&](int buf, int64_t ks) {
    TA* at = reinterpret_cast<TA*>(a_s + buf * kTileA);
    TB* bt = reinterpret_cast<TB*>(b_s + buf * kTileB);
    const bool second = ks >= k1_steps;
    const TA* A = static_cast<const TA*>(second ? g.a2.ptr : g.a.ptr) + item * (second ? g.a2.batch : g.a.batch);
    const TB* B = static_cast<const TB*>(second ? g.b2.ptr : g.b.ptr) + item * (second ? g.b2.batch : g.b.batch);
    const int64_t K = second ? g.K2 : g.K, k0 = (second ? ks - k1_steps : ks) * kBK;
    const int32_t* a_map = kAK && g.a.rows != nullptr && !second ? a_map_s : nullptr;
    const int32_t* b_map = kBNc && g.b.rows != nullptr && !second ? b_map_s + k0 : nullptr;
    if (kAK) stage_slice<TA, kBM, kBK, kPadKA, kThreads>(at, A, second ? g.a2.row : g.a.row, m0, k0, g.M, K, a_map);
    else stage_slice<TA, kBK, kBM, kBM + 8, kThreads>(at, A, second ? g.a2.col : g.a.col, k0, m0, K, g.M);
    if (kBNc) stage_slice<TB, kBK, kBN, kPadN, kThreads>(bt, B, second ? g.b2.row : g.b.row, k0, n0, K, g.N, b_map);
    else stage_slice<TB, kBN, kBK, kPadKB, kThreads>(bt, B, second ? g.b2.col : g.b.col, n0, k0, g.N, K);
    cp_async_commit();
  };
  // Element (m, k) of the staged A tile and (k, n) of the staged B tile, tile-local indices.
  auto a_at = [](const TA* t, int m, int k) { return kAK ? t[m * kPadKA + k] : t[k * (kBM + 8) + m]; };
  auto b_at = [](const TB* t, int k, int n) { return kBNc ? t[k * kPadN + n] : t[n * kPadKB + k]; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grp = lane / 4, tig = lane % 4;                   // fragment row group, thread in group
  const int wm = (warp / kNW) * 32, wn = (warp % kNW) * 32;  // the warp's part of the tile
  float acc[2][4][4] = {};

  stage(0, 0);
  for (int64_t ks = 0; ks < k_steps; ++ks) {
    const int buf = static_cast<int>(ks & 1);
    if (ks + 1 < k_steps) {
      stage(buf ^ 1, ks + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const TA* at = reinterpret_cast<const TA*>(a_s + buf * kTileA);
    const TB* bt = reinterpret_cast<const TB*>(b_s + buf * kTileB);
    if constexpr (kBf16Mma) {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        gdr_chunk_mma::Frag16A a[2];
        gdr_chunk_mma::Frag16B b[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) ldsm_a(a[i].r, at, kPadKA, wm + 16 * i, kk, lane);
#pragma unroll
        for (int jp = 0; jp < 2; ++jp) {
          uint32_t r[4];
          if constexpr (kBNc) {
            ldsm_b_pair(r, bt, kPadN, kk, wn + 16 * jp, lane);
          } else {
            ldsm_b_pair_of_transposed(r, bt, kPadKB, kk, wn + 16 * jp, lane);
          }
          b[2 * jp] = {{r[0], r[1]}};
          b[2 * jp + 1] = {{r[2], r[3]}};
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) gdr_chunk_mma::mma16<__nv_bfloat16>(acc[i][j], a[i], b[j]);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 8) {
        uint32_t a_big[2][4], a_small[2][4], b_big[4][2], b_small[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int m = wm + 16 * i + grp;
          split_operand<kOneProduct>(a_at(at, m, kk + tig), a_big[i][0], a_small[i][0]);
          split_operand<kOneProduct>(a_at(at, m + 8, kk + tig), a_big[i][1], a_small[i][1]);
          split_operand<kOneProduct>(a_at(at, m, kk + tig + 4), a_big[i][2], a_small[i][2]);
          split_operand<kOneProduct>(a_at(at, m + 8, kk + tig + 4), a_big[i][3], a_small[i][3]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int n = wn + 8 * j + grp;
          split_operand<kOneProduct>(b_at(bt, kk + tig, n), b_big[j][0], b_small[j][0]);
          split_operand<kOneProduct>(b_at(bt, kk + tig + 4, n), b_big[j][1], b_small[j][1]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // The small terms first: they are added to the accumulator before the large one.
            if constexpr (!kOneProduct) {
              mma_tf32(acc[i][j], a_small[i], b_big[j]);
              mma_tf32(acc[i][j], a_big[i], b_small[j]);
            }
            mma_tf32(acc[i][j], a_big[i], b_big[j]);
          }
        }
      }
    }
    // The next iteration's copies overwrite the buffer just read.
    __syncthreads();
  }

  // Element offsets into out: item i's rows start at i · out_batch unless a row map places them.
  const int64_t item_first = g.out_rows != nullptr ? 0 : item * g.out_batch;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + wn + 8 * j + 2 * tig;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + wm + 16 * i + grp + 8 * h;
        if (m >= g.M) continue;
        int64_t row = m;
        if (g.out_rows != nullptr) {
          row = __ldg(g.out_rows + item * g.M + m);
          if (row < 0) continue;
        }
        const int64_t at = item_first + row * g.out_row + n;
        const float v0 = g.alpha * acc[i][j][2 * h], v1 = g.alpha * acc[i][j][2 * h + 1];
        if (g.out_bf16) {  // beta is 0 (gemm_tf32x3_supports)
          __nv_bfloat16* o = static_cast<__nv_bfloat16*>(g.out) + at;
          if (n + 1 < g.N) {
            *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(v0, v1);
          } else if (n < g.N) {
            o[0] = __float2bfloat16_rn(v0);
          }
          continue;
        }
        float* o = static_cast<float*>(g.out) + at;
        for (int e = 0; e < 2; ++e) {
          if (n + e >= g.N) break;
          const float v = e == 0 ? v0 : v1;
          o[e] = g.beta == 0.0f ? v : v + g.beta * o[e];
        }
      }
    }
  }
}

template <bool kAK, bool kBNc, int kNW, typename TA = float, typename TB = float, bool kBf16Mma = false>
int launch(const GemmTf32x3Args& args, cudaStream_t s) {
  auto kernel = gemm_tf32x3_kernel<kAK, kBNc, kNW, TA, TB, kBf16Mma>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(smem_bytes(kNW)));
  const dim3 grid(static_cast<unsigned>(args.batch), static_cast<unsigned>((args.N + 32 * kNW - 1) / (32 * kNW)),
                  static_cast<unsigned>((args.M + kBM - 1) / kBM));
  kernel<<<grid, 64 * kNW, smem_bytes(kNW), s>>>(args);
  return static_cast<int>(cudaGetLastError());
}

// A bf16 B comes with a K-contiguous A only (gemm_tf32x3_supports), which saves the
// instantiations nothing uses.
template <int kNW>
int launch_layout(const GemmTf32x3Args& args, cudaStream_t s) {
  const bool a_k = args.a.col == 1, b_n = args.b.col == 1;
  if (args.a.bf16 && args.b.bf16 && args.bf16_mma) {
    return b_n ? launch<true, true, kNW, Bf16Bits, Bf16Bits, true>(args, s)
               : launch<true, false, kNW, Bf16Bits, Bf16Bits, true>(args, s);
  }
  if (args.a.bf16 && args.b.bf16) {
    return b_n ? launch<true, true, kNW, Bf16Bits, Bf16Bits>(args, s)
               : launch<true, false, kNW, Bf16Bits, Bf16Bits>(args, s);
  }
  if (args.a.bf16) {
    if (!a_k) {
      return b_n ? launch<false, true, kNW, Bf16Bits, float>(args, s) : launch<false, false, kNW, Bf16Bits, float>(args, s);
    }
    return b_n ? launch<true, true, kNW, Bf16Bits, float>(args, s) : launch<true, false, kNW, Bf16Bits, float>(args, s);
  }
  if (args.b.bf16) {
    return b_n ? launch<true, true, kNW, float, Bf16Bits>(args, s) : launch<true, false, kNW, float, Bf16Bits>(args, s);
  }
  if (a_k && b_n) return launch<true, true, kNW>(args, s);
  if (a_k) return launch<true, false, kNW>(args, s);
  if (b_n) return launch<false, true, kNW>(args, s);
  return launch<false, false, kNW>(args, s);
}

}  // namespace

int gemm_tf32x3(const GemmTf32x3Args& args, void* stream) {
  if (!gemm_tf32x3_supports(args) || args.n_strips < 0 || args.n_strips == 1 || args.n_strips > 6) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  auto s = static_cast<cudaStream_t>(stream);
  switch (args.n_strips > 0 ? args.n_strips : gemm_tf32x3_strips_for(args.N)) {
    case 6: return launch_layout<6>(args, s);
    case 5: return launch_layout<5>(args, s);
    case 4: return launch_layout<4>(args, s);
    case 3: return launch_layout<3>(args, s);
    default: return launch_layout<2>(args, s);
  }
}

}  // namespace kernels

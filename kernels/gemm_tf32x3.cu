// Batched 3×TF32 GEMM (kernels/gemm_tf32x3.h). One block of 4 warps computes a 64 × 64 tile of one
// batch item; each warp a 32 × 32 quarter as 2 × 4 tensor-core tiles (mma.sync m16n8k8, TF32 in,
// fp32 accumulate). K advances 32 at a time through two shared-memory stages filled by cp.async,
// so the next slice is in flight while this one is multiplied.
// Operands are staged in their global orientation (no transposing copy): a K-contiguous A tile is
// [64 m][32 k + 4], an M-contiguous one [32 k][64 m + 8], and B likewise. The pads put the eight
// rows and four columns of a fragment load in 32 different banks. Each fragment element is split
// into big + small in registers right before its three products.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemm_tf32x3.h"
#include "kernels/tf32_mma.cuh"

namespace kernels {

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128;
constexpr int kPadK = kBK + 4;              // row length of a tile stored [64][32 + 4]
constexpr int kPadMN = kBM + 8;             // row length of a tile stored [32][64 + 8]
constexpr int kTileFloats = kBK * kPadMN;   // = 64 · 36 = 2304: either orientation fits
static_assert(kBM * kPadK == kTileFloats, "both tile orientations take the same shared memory");

// Copies the [rows × cols] slice at (r0, c0) of a matrix whose columns are contiguous (row stride
// ld) into dst [rows][pitch], 4 columns per copy; out-of-range pieces become zeros. cols_total is a
// multiple of 4, so a piece is wholly inside or wholly outside.
template <int kRows, int kCols, int kPitch>
__device__ __forceinline__ void stage_slice(float* dst, const float* src, int64_t ld, int64_t r0, int64_t c0,
                                            int64_t rows_total, int64_t cols_total) {
  constexpr int kPieces = kRows * (kCols / 4);
  for (int p = threadIdx.x; p < kPieces; p += kThreads) {
    const int r = p / (kCols / 4), c = 4 * (p % (kCols / 4));
    const bool valid = r0 + r < rows_total && c0 + c < cols_total;
    const float* s = valid ? src + (r0 + r) * ld + (c0 + c) : src;
    cp_async16_zfill(dst + r * kPitch + c, s, valid);
  }
}

// kAK: A is K-contiguous (a.col == 1), else M-contiguous. kBNc: B is N-contiguous (b.col == 1),
// else K-contiguous.
template <bool kAK, bool kBNc>
__global__ void __launch_bounds__(kThreads) gemm_tf32x3_kernel(GemmTf32x3Args g) {
  __shared__ __align__(16) float a_s[2][kTileFloats];
  __shared__ __align__(16) float b_s[2][kTileFloats];
  const int64_t item = blockIdx.x;
  const int64_t n0 = int64_t{blockIdx.y} * kBN, m0 = int64_t{blockIdx.z} * kBM;
  const float* A = g.a.ptr + item * g.a.batch;
  const float* B = g.b.ptr + item * g.b.batch;

  auto stage = [&](int buf, int64_t k0) {
    if (kAK) stage_slice<kBM, kBK, kPadK>(a_s[buf], A, g.a.row, m0, k0, g.M, g.K);
    else stage_slice<kBK, kBM, kPadMN>(a_s[buf], A, g.a.col, k0, m0, g.K, g.M);
    if (kBNc) stage_slice<kBK, kBN, kPadMN>(b_s[buf], B, g.b.row, k0, n0, g.K, g.N);
    else stage_slice<kBN, kBK, kPadK>(b_s[buf], B, g.b.col, n0, k0, g.N, g.K);
    cp_async_commit();
  };
  // Element (m, k) of the staged A tile and (k, n) of the staged B tile, tile-local indices.
  auto a_at = [](const float* t, int m, int k) { return kAK ? t[m * kPadK + k] : t[k * kPadMN + m]; };
  auto b_at = [](const float* t, int k, int n) { return kBNc ? t[k * kPadMN + n] : t[n * kPadK + k]; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grp = lane / 4, tig = lane % 4;                 // fragment row group, thread in group
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;     // the warp's quarter of the tile
  float acc[2][4][4] = {};

  const int64_t k_steps = (g.K + kBK - 1) / kBK;
  stage(0, 0);
  for (int64_t ks = 0; ks < k_steps; ++ks) {
    const int buf = static_cast<int>(ks & 1);
    if (ks + 1 < k_steps) {
      stage(buf ^ 1, (ks + 1) * kBK);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* at = a_s[buf];
    const float* bt = b_s[buf];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 8) {
      uint32_t a_big[2][4], a_small[2][4], b_big[4][2], b_small[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int m = wm + 16 * i + grp;
        split_tf32(a_at(at, m, kk + tig), a_big[i][0], a_small[i][0]);
        split_tf32(a_at(at, m + 8, kk + tig), a_big[i][1], a_small[i][1]);
        split_tf32(a_at(at, m, kk + tig + 4), a_big[i][2], a_small[i][2]);
        split_tf32(a_at(at, m + 8, kk + tig + 4), a_big[i][3], a_small[i][3]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn + 8 * j + grp;
        split_tf32(b_at(bt, kk + tig, n), b_big[j][0], b_small[j][0]);
        split_tf32(b_at(bt, kk + tig + 4, n), b_big[j][1], b_small[j][1]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          // The small terms first: they are added to the accumulator before the large one.
          mma_tf32(acc[i][j], a_small[i], b_big[j]);
          mma_tf32(acc[i][j], a_big[i], b_small[j]);
          mma_tf32(acc[i][j], a_big[i], b_big[j]);
        }
      }
    }
    // The next iteration's copies overwrite the buffer just read.
    __syncthreads();
  }

  float* out = g.out + item * g.out_batch;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + wn + 8 * j + 2 * tig;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + wm + 16 * i + grp + 8 * h;
        if (m >= g.M) continue;
        float* o = out + m * g.out_row + n;
        for (int e = 0; e < 2; ++e) {
          if (n + e >= g.N) break;
          const float v = g.alpha * acc[i][j][2 * h + e];
          o[e] = g.beta == 0.0f ? v : v + g.beta * o[e];
        }
      }
    }
  }
}

}  // namespace

int gemm_tf32x3(const GemmTf32x3Args& args, void* stream) {
  if (!gemm_tf32x3_supports(args)) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(args.batch), static_cast<unsigned>((args.N + kBN - 1) / kBN),
                  static_cast<unsigned>((args.M + kBM - 1) / kBM));
  auto s = static_cast<cudaStream_t>(stream);
  const bool a_k = args.a.col == 1, b_n = args.b.col == 1;
  if (a_k && b_n) gemm_tf32x3_kernel<true, true><<<grid, kThreads, 0, s>>>(args);
  else if (a_k) gemm_tf32x3_kernel<true, false><<<grid, kThreads, 0, s>>>(args);
  else if (b_n) gemm_tf32x3_kernel<false, true><<<grid, kThreads, 0, s>>>(args);
  else gemm_tf32x3_kernel<false, false><<<grid, kThreads, 0, s>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

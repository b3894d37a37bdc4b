// RMSNorm of narrow 16-bit rows without a residual add: kL lanes a row (32 / kL rows a warp), each
// lane kJ 16-byte pieces of its row (piece p of the row's C / 8 at lane p % kL, slot p / kL), so a
// row's sums take log2(kL) shuffles within its lanes and no block barrier. Rows grid-strided over
// the launch's warps, a group of 32 / kL at a time. The forward takes eight lanes a row (four rows
// a warp); the backward sixteen (two rows a warp), so that a lane's values and its share of dw fit
// 85 registers without spills (at eight lanes a row, 384 wide, it needed 128 and spilled).
//
// Why: the block kernels of kernels/rmsnorm_train.cu give each row a block of C / 4 threads (64 at
// C = 256) and two barriers, with one row in flight a block; at MLA's latent widths (hybrid base:
// 384 and 256, 12.6 and 8.4 MB a norm) they ran at a third to a half of the memory bandwidth (12 µs
// forward, 17 – 38 backward a norm; docs/perf.md, stop 88). Here a warp has four rows' loads in
// flight at once (two in the backward) and no barrier. The layout follows the gated RMSNorm's
// grouped kernels (kernels/gated_rmsnorm.cu).
//
// The backward keeps the lane's share of dw in registers across its rows (kJ · 8 of them: three
// blocks an SM); at the end the two rows' lanes of a column add theirs by a shuffle and the block's
// warps theirs through shared memory, in a fixed order, into the block's row of dw_partial.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/elem.cuh"
#include "kernels/rmsnorm_narrow.h"

namespace kernels {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kForwardLanes = 8, kBackwardLanes = 16;
// Three blocks an SM of an H100 or H200 (132 SMs): every backward warp walks several row groups, so
// the partial rows of dw stay few (396 where the block kernel wrote 1056).
constexpr int kBackwardBlocksPerSm = 3;
constexpr int kBackwardBlocks = kBackwardBlocksPerSm * 132;

// w (C ≤ 8 kL kJ; ones where w is null) into the block's w_s [8 kL kJ], zeros past C.
template <int kWidth>
__device__ __forceinline__ void stage_w(float* w_s, const float* w, int C) {
  for (int c = threadIdx.x; c < kWidth; c += kThreads) w_s[c] = c < C ? (w != nullptr ? w[c] : 1.f) : 0.f;
  __syncthreads();
}

// A lane's place: row `sub` of its warp's group, lane `sl` of that row's kL.
template <int kL>
struct RowLane {
  static constexpr int kRows = 32 / kL;  // rows a warp
  int sub, sl;
  __device__ RowLane() : sub(static_cast<int>(threadIdx.x % 32) / kL), sl(static_cast<int>(threadIdx.x % 32) % kL) {}
  __device__ static int64_t first_group() { return static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; }
  __device__ static int64_t group_stride() { return static_cast<int64_t>(gridDim.x) * kWarps; }
};

// This lane's pieces of one row (zeros past the row's C / 8 pieces, or for a row past the last).
template <typename T, int kL, int kJ>
__device__ __forceinline__ void load_pieces(Vec<T, 8> (&v)[kJ], const T* row, bool live, int sl, int pieces) {
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int p = sl + kL * j;
    if (live && p < pieces) {
      v[j].load(row + 8 * p);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j].set(e, 0.f);
    }
  }
}

// This lane's pieces of one row stored (those past the row's C / 8 pieces left out):
// value(j, p, e) gives element e of slot j, piece p.
template <typename T, int kL, int kJ, class Value>
__device__ __forceinline__ void store_pieces(T* row, int sl, int pieces, Value value) {
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int p = sl + kL * j;
    if (p < pieces) {
      Vec<T, 8> out;
#pragma unroll
      for (int e = 0; e < 8; ++e) out.set(e, value(j, p, e));
      out.store(row + 8 * p);
    }
  }
}

// The sum over the kL lanes of one row.
template <int kL>
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int off = kL / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

//   y = x · r · w,  r = 1/sqrt(mean(x²) + eps)
template <typename T, int kJ>
__global__ void __launch_bounds__(kThreads) narrow_norm_forward_kernel(T* y, float* rstd, const T* x, const float* w,
                                                                       int64_t N, int C, float eps, int64_t x_ld) {
  constexpr int kL = kForwardLanes;
  using Lane = RowLane<kL>;
  __shared__ __align__(16) float w_s[8 * kL * kJ];
  stage_w<8 * kL * kJ>(w_s, w, C);
  const Lane ln;
  const int sl = ln.sl, pieces = C / 8;
  const int64_t groups = (N + Lane::kRows - 1) / Lane::kRows;
  for (int64_t gi = Lane::first_group(); gi < groups; gi += Lane::group_stride()) {
    // gi is the warp's: every lane takes the shuffles.
    const int64_t n = Lane::kRows * gi + ln.sub;
    const bool live = n < N;
    Vec<T, 8> xv[kJ];
    load_pieces<T, kL, kJ>(xv, x + (live ? n : 0) * x_ld, live, sl, pieces);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += xv[j].get(e) * xv[j].get(e);
    }
    const float r = rsqrtf(row_sum<kL>(ss) / static_cast<float>(C) + eps);
    if (live) {
      if (sl == 0) rstd[n] = r;
      store_pieces<T, kL, kJ>(y + n * C, sl, pieces,
                              [&](int j, int p, int e) { return xv[j].get(e) * r * w_s[8 * p + e]; });
    }
  }
}

//   dx = r · (g − ĥ · mean(g · ĥ)),  g = dy · w,  ĥ = h · r;   dw = Σ_rows dy · ĥ
template <typename T, int kJ>
__global__ void __launch_bounds__(kThreads, kBackwardBlocksPerSm)
    narrow_norm_backward_kernel(T* dx, float* dw_partial, const T* dy, const T* h, const float* w, const float* rstd,
                                int64_t N, int C, int64_t h_ld) {
  constexpr int kL = kBackwardLanes;
  using Lane = RowLane<kL>;
  __shared__ __align__(16) float w_s[8 * kL * kJ];
  __shared__ float red[kWarps][8 * kL * kJ];
  stage_w<8 * kL * kJ>(w_s, w, C);
  const Lane ln;
  const int sl = ln.sl, pieces = C / 8;
  const int64_t groups = (N + Lane::kRows - 1) / Lane::kRows;
  float dw_acc[kJ][8];
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) dw_acc[j][e] = 0.f;
  }
  for (int64_t gi = Lane::first_group(); gi < groups; gi += Lane::group_stride()) {
    const int64_t n = Lane::kRows * gi + ln.sub;
    const bool live = n < N;
    const float r = live ? rstd[n] : 0.f;
    Vec<T, 8> hv[kJ], gv[kJ];
    load_pieces<T, kL, kJ>(hv, h + (live ? n : 0) * h_ld, live, sl, pieces);
    load_pieces<T, kL, kJ>(gv, dy + (live ? n : 0) * C, live, sl, pieces);
    float dot = 0.f;  // Σ g · ĥ over the lane's columns
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int p = sl + kL * j;  // w_s is zero past C, and so are a dead row's values
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float hh = hv[j].get(e) * r, d = gv[j].get(e);
        dw_acc[j][e] += d * hh;
        dot += d * w_s[8 * p + e] * hh;
      }
    }
    const float mean = row_sum<kL>(dot) / static_cast<float>(C);
    if (live) {
      store_pieces<T, kL, kJ>(dx + n * C, sl, pieces, [&](int j, int p, int e) {
        return r * (gv[j].get(e) * w_s[8 * p + e] - hv[j].get(e) * r * mean);
      });
    }
  }
  if (dw_partial == nullptr) return;  // the whole block returns: no barrier below is left waiting
  const int warp = static_cast<int>(threadIdx.x / 32);
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int p = sl + kL * j;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      // The warp's rows (lanes sl, sl + kL, ...) hold the same column.
      float v = dw_acc[j][e];
#pragma unroll
      for (int off = kL; off < 32; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (ln.sub == 0 && p < pieces) red[warp][8 * p + e] = v;
    }
  }
  __syncthreads();
  for (int c = static_cast<int>(threadIdx.x); c < C; c += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int wp = 0; wp < kWarps; ++wp) sum += red[wp][c];
    dw_partial[static_cast<int64_t>(blockIdx.x) * C + c] = sum;
  }
}

// f(integral_constant<kJ>) for the pieces a lane needs at C with kL lanes a row (C ≤ 8 kL kJ;
// kJ in 1, 2, 4, 6, 8 at eight lanes, 1 to 4 at sixteen).
template <int kL, typename F>
void with_pieces(int64_t C, F&& f) {
  const int64_t j = (C + 8 * kL - 1) / (8 * kL);
  if constexpr (kL == 16) {
    if (j <= 1) f(std::integral_constant<int, 1>{});
    else if (j <= 2) f(std::integral_constant<int, 2>{});
    else if (j <= 3) f(std::integral_constant<int, 3>{});
    else f(std::integral_constant<int, 4>{});
  } else {
    static_assert(kL == 8, "eight or sixteen lanes a row");
    if (j <= 1) f(std::integral_constant<int, 1>{});
    else if (j <= 2) f(std::integral_constant<int, 2>{});
    else if (j <= 4) f(std::integral_constant<int, 4>{});
    else if (j <= 6) f(std::integral_constant<int, 6>{});
    else f(std::integral_constant<int, 8>{});
  }
}

// f(T{}) for a 16-bit dtype.
template <typename F>
void with_type(DType dt, F&& f) {
  if (dt == DType::BF16) f(__nv_bfloat16{});
  else f(__half{});
}

// The backward's row groups: two rows each.
int64_t backward_row_groups(int64_t N) { return (N + 32 / kBackwardLanes - 1) / (32 / kBackwardLanes); }

}  // namespace

bool narrow_norm_shape(DType dt, int64_t C) {
  return (dt == DType::BF16 || dt == DType::F16) && C > 0 && C % 8 == 0 && C <= kNarrowNormMaxC;
}

bool narrow_norm_aligned(int64_t ld, const void* a, const void* b, const void* c) {
  return ld % 8 == 0 && aligned_to(16, a, b, c);
}

int narrow_norm_backward_blocks(int64_t N) {
  const int64_t blocks = (backward_row_groups(N) + kWarps - 1) / kWarps;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, kBackwardBlocks)));
}

int narrow_norm_forward(void* y, float* rstd, const void* x, DType dt, const float* w, int64_t N, int64_t C,
                        float eps, int64_t x_ld, void* stream) {
  if (!narrow_norm_shape(dt, C) || !narrow_norm_aligned(x_ld, y, x, nullptr)) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0) return 0;
  // One row group a warp where the grid allows; the rest grid-strided.
  const int64_t groups = (N + 32 / kForwardLanes - 1) / (32 / kForwardLanes);
  const int64_t blocks = std::min<int64_t>((groups + kWarps - 1) / kWarps, 65535);
  auto st = static_cast<cudaStream_t>(stream);
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    with_pieces<kForwardLanes>(C, [&](auto kj) {
      narrow_norm_forward_kernel<T, decltype(kj)::value><<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(
          static_cast<T*>(y), rstd, static_cast<const T*>(x), w, N, static_cast<int>(C), eps, x_ld);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int narrow_norm_backward(void* dx, float* dw_partial, const void* dy, const void* h, DType dt, const float* w,
                         const float* rstd, int64_t N, int64_t C, int64_t h_ld, void* stream) {
  if (!narrow_norm_shape(dt, C) || !narrow_norm_aligned(h_ld, dx, dy, h)) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(narrow_norm_backward_blocks(N));
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    with_pieces<kBackwardLanes>(C, [&](auto kj) {
      narrow_norm_backward_kernel<T, decltype(kj)::value><<<blocks, kThreads, 0, st>>>(
          static_cast<T*>(dx), w != nullptr ? dw_partial : nullptr, static_cast<const T*>(dy),
          static_cast<const T*>(h), w, rstd, N, static_cast<int>(C), h_ld);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

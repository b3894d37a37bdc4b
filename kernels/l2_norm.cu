// One warp per row, rows grid-strided over the launch's warps; a lane holds the row's columns
// lane + 32k in registers (PER_LANE of them), so x is read once each way. Rows are D ≤ 256 wide in
// the presets (96 and 128); wider rows take the looped kernel. 16-bit rows of 64, 96 or 128 take
// the pair kernels below instead (half a warp per row, more rows in flight).
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/l2_norm.h"

namespace kernels {

namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ int64_t x_row(const L2NormRows& r, int64_t n) { return (n / r.heads) * r.ld + (n % r.heads) * r.D; }

int64_t blocks_for(int64_t N) { return (N + kWarps - 1) / kWarps < 65535 ? (N + kWarps - 1) / kWarps : 65535; }

// PER_LANE: columns per lane, ⌈D / 32⌉ rounded up to a power of two; 0 for any D (looped, x read twice).
// TY: y's element type, fp32 or x's own (the sums and the scale are fp32 either way).
template <typename TX, typename TY, int PER_LANE>
__global__ void __launch_bounds__(kWarps * 32) l2_norm_forward_kernel(TY* y, float* rstd, const TX* x,
                                                                      L2NormRows rows, float eps) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TX* xr = x + x_row(rows, n);
    TY* yr = y + n * D;
    if constexpr (PER_LANE > 0) {
      float v[PER_LANE];
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {
        const int c = lane + 32 * k;
        v[k] = c < D ? to_f32(xr[c]) : 0.f;
        ss += v[k] * v[k];
      }
      const float r = rsqrtf(warp_sum(ss) + eps);
      if (lane == 0) rstd[n] = r;
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {
        const int c = lane + 32 * k;
        if (c < D) yr[c] = from_f32<TY>(v[k] * r);
      }
    } else {
      float ss = 0.f;
      for (int c = lane; c < D; c += 32) {
        const float v = to_f32(xr[c]);
        ss += v * v;
      }
      const float r = rsqrtf(warp_sum(ss) + eps);
      if (lane == 0) rstd[n] = r;
      for (int c = lane; c < D; c += 32) yr[c] = from_f32<TY>(to_f32(xr[c]) * r);
    }
  }
}

// TY: dy's element type (y's).
template <typename TX, typename TY, int PER_LANE>
__global__ void __launch_bounds__(kWarps * 32) l2_norm_backward_kernel(TX* dx, const TY* dy, const TX* x,
                                                                       const float* rstd, L2NormRows rows) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TX* xr = x + x_row(rows, n);
    const TY* dyr = dy + n * D;
    TX* dxr = dx + n * D;
    const float r = rstd[n];
    if constexpr (PER_LANE > 0) {
      float yv[PER_LANE], g[PER_LANE];
      float dot = 0.f;  // Σ y ⊙ dy
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {
        const int c = lane + 32 * k;
        yv[k] = c < D ? to_f32(xr[c]) * r : 0.f;
        g[k] = c < D ? to_f32(dyr[c]) : 0.f;
        dot += yv[k] * g[k];
      }
      dot = warp_sum(dot);
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {
        const int c = lane + 32 * k;
        if (c < D) dxr[c] = from_f32<TX>(r * (g[k] - yv[k] * dot));
      }
    } else {
      float dot = 0.f;
      for (int c = lane; c < D; c += 32) dot += to_f32(xr[c]) * r * to_f32(dyr[c]);
      dot = warp_sum(dot);
      for (int c = lane; c < D; c += 32) dxr[c] = from_f32<TX>(r * (to_f32(dyr[c]) - to_f32(xr[c]) * r * dot));
    }
  }
}

// The pair kernels, for 16-bit x and y (or dy) of one dtype and rows of 64, 96 or 128 (kPairs =
// D / 32 column pairs a lane): half a warp per row, each lane's columns kPairs pairs of adjacent
// columns at 2 (lane % 16 + 16 p), and each half-warp working on kRows rows at once. The
// warp-per-row kernels above have one row (192 bytes at D = 96) in flight a warp, which held hybrid
// base's q and k at about 1.8 TB/s on an H200; here a warp has 2 · kRows rows in flight. A row's
// sum is over its half-warp (shuffles at offsets 8 to 1). A pair moves as one 4-byte access.
constexpr int kRows = 2;


// The first of the kRows rows a half-warp takes in its pass `pass` (rows first, first + 1, ...);
// its column pairs start at 2 · (lane % 16).
__device__ __forceinline__ int64_t pair_rows_first(int64_t pass) {
  const int64_t half = (blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32) * 2 + (threadIdx.x % 32) / 16;
  return (half + pass * static_cast<int64_t>(gridDim.x) * kWarps * 2) * kRows;
}

// Two adjacent 16-bit values, aligned as one 4-byte access (the host checks every pair's address).
template <typename T>
struct alignas(2 * sizeof(T)) Pair {
  T v[2];
};

// Where rows first .. first + kRows − 1 of x start: one division a pass (64-bit division is slow).
__device__ __forceinline__ void pair_x_rows(const L2NormRows& rows, int64_t first, int64_t (&at)[kRows]) {
  int64_t token = first / rows.heads, head = first - token * rows.heads;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    at[i] = token * rows.ld + head * rows.D;
    if (++head == rows.heads) head = 0, ++token;
  }
}

template <typename T, int kPairs>
__global__ void __launch_bounds__(kWarps * 32) l2_norm_forward_pairs_kernel(T* y, float* rstd, const T* x,
                                                                            L2NormRows rows, float eps) {
  const int c0 = 2 * (threadIdx.x % 16);
  for (int64_t pass = 0;; ++pass) {
    const int64_t first = pair_rows_first(pass);
    if (first - (threadIdx.x % 32) / 16 * kRows >= rows.N) break;  // the warp's first half is past the end
    float v[kRows][2 * kPairs];
    int64_t at[kRows];
    pair_x_rows(rows, first, at);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t n = first + i;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        Pair<T> q{};
        if (n < rows.N) q = *reinterpret_cast<const Pair<T>*>(x + at[i] + c0 + 32 * p);
        v[i][2 * p] = to_f32(q.v[0]);
        v[i][2 * p + 1] = to_f32(q.v[1]);
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t n = first + i;
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < 2 * kPairs; ++e) ss += v[i][e] * v[i][e];
      const float r = rsqrtf(half_warp_sum(ss) + eps);
      if (n >= rows.N) continue;
      if (threadIdx.x % 16 == 0) rstd[n] = r;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        Pair<T> q;
        q.v[0] = from_f32<T>(v[i][2 * p] * r);
        q.v[1] = from_f32<T>(v[i][2 * p + 1] * r);
        *reinterpret_cast<Pair<T>*>(y + n * rows.D + c0 + 32 * p) = q;
      }
    }
  }
}

template <typename T, int kPairs>
__global__ void __launch_bounds__(kWarps * 32) l2_norm_backward_pairs_kernel(T* dx, const T* dy, const T* x,
                                                                             const float* rstd, L2NormRows rows) {
  const int c0 = 2 * (threadIdx.x % 16);
  for (int64_t pass = 0;; ++pass) {
    const int64_t first = pair_rows_first(pass);
    if (first - (threadIdx.x % 32) / 16 * kRows >= rows.N) break;
    float xv[kRows][2 * kPairs], g[kRows][2 * kPairs], r[kRows];
    int64_t at[kRows];
    pair_x_rows(rows, first, at);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t n = first + i;
      r[i] = n < rows.N ? rstd[n] : 0.f;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        Pair<T> a{}, b{};
        if (n < rows.N) {
          a = *reinterpret_cast<const Pair<T>*>(x + at[i] + c0 + 32 * p);
          b = *reinterpret_cast<const Pair<T>*>(dy + n * rows.D + c0 + 32 * p);
        }
        xv[i][2 * p] = to_f32(a.v[0]);
        xv[i][2 * p + 1] = to_f32(a.v[1]);
        g[i][2 * p] = to_f32(b.v[0]);
        g[i][2 * p + 1] = to_f32(b.v[1]);
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t n = first + i;
      float dot = 0.f;  // Σ y ⊙ dy
#pragma unroll
      for (int e = 0; e < 2 * kPairs; ++e) dot += xv[i][e] * r[i] * g[i][e];
      dot = half_warp_sum(dot);
      if (n >= rows.N) continue;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        Pair<T> q;
        q.v[0] = from_f32<T>(r[i] * (g[i][2 * p] - xv[i][2 * p] * r[i] * dot));
        q.v[1] = from_f32<T>(r[i] * (g[i][2 * p + 1] - xv[i][2 * p + 1] * r[i] * dot));
        *reinterpret_cast<Pair<T>*>(dx + n * rows.D + c0 + 32 * p) = q;
      }
    }
  }
}

bool g_pair_rows = true;  // l2_norm_pair_rows
std::atomic<int64_t> g_pair_launches{0};

// f(integral_constant<kPairs>) where the pair kernels take the rows: the switch on, 16-bit x with y
// of its dtype, D of 64, 96 or 128, and every row start and pointer on a 4-byte boundary (each pair
// on one, for a 4-byte access). Returns
// whether f ran.
template <typename F>
bool with_pairs(DType x_dt, DType y_dt, const L2NormRows& rows, const void* a, const void* b, const void* c, F&& f) {
  using std::integral_constant;
  if (!g_pair_rows || x_dt == DType::F32 || y_dt != x_dt || rows.ld % 2 != 0 || !aligned_to(4, a, b, c)) return false;
  if (rows.D == 64) f(integral_constant<int, 2>{});
  else if (rows.D == 96) f(integral_constant<int, 3>{});
  else if (rows.D == 128) f(integral_constant<int, 4>{});
  else return false;
  ++g_pair_launches;
  return true;
}

unsigned pair_blocks_for(int64_t N) {
  const int64_t rows_per_block = kWarps * 2 * kRows, blocks = (N + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

// Calls f(std::integral_constant<int, PER_LANE>) for D.
template <typename F>
void with_per_lane(int64_t D, F&& f) {
  if (D <= 32) f(std::integral_constant<int, 1>{});
  else if (D <= 64) f(std::integral_constant<int, 2>{});
  else if (D <= 128) f(std::integral_constant<int, 4>{});
  else if (D <= 256) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 0>{});
}

// Checks the rows, then calls launch(x's dtype tag, y's dtype tag, PER_LANE constant, grid, stream)
// for x_dt, y_dt (F32 or x_dt) and D; returns the launch's cudaError_t.
template <typename F>
int launch_rows(DType x_dt, DType y_dt, const L2NormRows& rows, void* stream, F&& launch) {
  if (rows.D < 1 || rows.heads < 1 || rows.N < 0 || (y_dt != DType::F32 && y_dt != x_dt)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (rows.N == 0) return 0;
  const unsigned grid = static_cast<unsigned>(blocks_for(rows.N));
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(x_dt, [&](auto x_tag) {
    with_per_lane(rows.D, [&](auto per) {
      if (y_dt == DType::F32) launch(x_tag, 0.f, per, grid, st);
      else launch(x_tag, x_tag, per, grid, st);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

void l2_norm_pair_rows(bool on) { g_pair_rows = on; }
int64_t l2_norm_pair_launches() { return g_pair_launches.load(); }

int l2_norm_forward(void* y, DType y_dt, float* rstd, const void* x, DType x_dt, const L2NormRows& rows, float eps,
                    void* stream) {
  if (rows.D >= 1 && rows.heads >= 1 && rows.N > 0) {
    auto st = static_cast<cudaStream_t>(stream);
    const bool pairs = with_pairs(x_dt, y_dt, rows, x, y, nullptr, [&](auto per) {
      dispatch_dtype(x_dt, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (sizeof(T) == 2) {
          l2_norm_forward_pairs_kernel<T, decltype(per)::value><<<pair_blocks_for(rows.N), kWarps * 32, 0, st>>>(
              static_cast<T*>(y), rstd, static_cast<const T*>(x), rows, eps);
        }
      });
    });
    if (pairs) return static_cast<int>(cudaGetLastError());
  }
  return launch_rows(x_dt, y_dt, rows, stream, [&](auto x_tag, auto y_tag, auto per, unsigned grid, cudaStream_t st) {
    using TX = decltype(x_tag);
    using TY = decltype(y_tag);
    l2_norm_forward_kernel<TX, TY, decltype(per)::value>
        <<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, static_cast<const TX*>(x), rows, eps);
  });
}

int l2_norm_backward(void* dx, const void* dy, DType y_dt, const void* x, DType x_dt, const float* rstd,
                     const L2NormRows& rows, void* stream) {
  if (rows.D >= 1 && rows.heads >= 1 && rows.N > 0) {
    auto st = static_cast<cudaStream_t>(stream);
    const bool pairs = with_pairs(x_dt, y_dt, rows, x, dy, dx, [&](auto per) {
      dispatch_dtype(x_dt, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (sizeof(T) == 2) {
          l2_norm_backward_pairs_kernel<T, decltype(per)::value><<<pair_blocks_for(rows.N), kWarps * 32, 0, st>>>(
              static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), rstd, rows);
        }
      });
    });
    if (pairs) return static_cast<int>(cudaGetLastError());
  }
  return launch_rows(x_dt, y_dt, rows, stream, [&](auto x_tag, auto y_tag, auto per, unsigned grid, cudaStream_t st) {
    using TX = decltype(x_tag);
    using TY = decltype(y_tag);
    l2_norm_backward_kernel<TX, TY, decltype(per)::value><<<grid, kWarps * 32, 0, st>>>(
        static_cast<TX*>(dx), static_cast<const TY*>(dy), static_cast<const TX*>(x), rstd, rows);
  });
}

}  // namespace kernels

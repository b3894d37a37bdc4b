// One warp per row, rows grid-strided over the launch's warps; a lane holds the row's columns
// lane + 32k in registers (PER_LANE of them), so x is read once each way. Rows are D ≤ 256 wide in
// the presets (96 and 128); wider rows take the looped kernel.
#include <cuda_runtime.h>

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

int l2_norm_forward(void* y, DType y_dt, float* rstd, const void* x, DType x_dt, const L2NormRows& rows, float eps,
                    void* stream) {
  return launch_rows(x_dt, y_dt, rows, stream, [&](auto x_tag, auto y_tag, auto per, unsigned grid, cudaStream_t st) {
    using TX = decltype(x_tag);
    using TY = decltype(y_tag);
    l2_norm_forward_kernel<TX, TY, decltype(per)::value>
        <<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, static_cast<const TX*>(x), rows, eps);
  });
}

int l2_norm_backward(void* dx, const void* dy, DType y_dt, const void* x, DType x_dt, const float* rstd,
                     const L2NormRows& rows, void* stream) {
  return launch_rows(x_dt, y_dt, rows, stream, [&](auto x_tag, auto y_tag, auto per, unsigned grid, cudaStream_t st) {
    using TX = decltype(x_tag);
    using TY = decltype(y_tag);
    l2_norm_backward_kernel<TX, TY, decltype(per)::value><<<grid, kWarps * 32, 0, st>>>(
        static_cast<TX*>(dx), static_cast<const TY*>(dy), static_cast<const TX*>(x), rstd, rows);
  });
}

}  // namespace kernels

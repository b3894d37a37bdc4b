// One warp per row, rows grid-strided over the launch's warps. The forward reads o twice (sum of
// squares, then the output; the row is in L1 the second time). The backward's weight gradient is
// kept per lane in registers for the lane's columns (lane + 32k) across the warp's rows and written
// once per warp as one row of dw_partial, summed by the caller.
#include <cuda_runtime.h>

#include "kernels/elem.cuh"
#include "kernels/gated_rmsnorm.h"

namespace kernels {

namespace {

constexpr int kWarps = 8;
constexpr int kBackwardBlocks = 512;

__device__ __forceinline__ int64_t z_row(const GatedNormRows& r, int64_t n) {
  return (n / r.z_heads) * r.z_ld + (n % r.z_heads) * r.D;
}

__device__ __forceinline__ int64_t o_offset(const GatedNormRows& r, int64_t n) {
  return (r.o_row != nullptr ? static_cast<int64_t>(r.o_row[n]) : n) * r.D;
}

template <typename TY, typename TZ>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_forward_kernel(TY* y, float* rstd, const float* o,
                                                                            const TZ* z, const float* w,
                                                                            GatedNormRows rows, float eps) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* orow = o + o_offset(rows, n);
    float ss = 0.f;
    for (int c = lane; c < D; c += 32) ss += orow[c] * orow[c];
    const float r = rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
    if (lane == 0) rstd[n] = r;
    const TZ* zrow = z + z_row(rows, n);
    for (int c = lane; c < D; c += 32) {
      const float zv = to_f32(zrow[c]);
      const float sg = 1.f / (1.f + expf(-zv));
      y[n * D + c] = from_f32<TY>(orow[c] * r * w[c] * (zv * sg));
    }
  }
}

// PER_LANE: columns per lane, ⌈D / 32⌉ rounded up to a power of two (the unrolled loop and the
// weight-gradient registers are sized by it, so a 128-wide head does not walk 32 idle slots).
template <typename TY, typename TZ, int PER_LANE>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_backward_kernel(float* d_o, TZ* dz, float* dw_partial,
                                                                             const TY* dy, const float* o, const TZ* z,
                                                                             const float* w, const float* rstd,
                                                                             GatedNormRows rows) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  const int64_t warp_id = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  float acc[PER_LANE];
#pragma unroll
  for (int k = 0; k < PER_LANE; ++k) acc[k] = 0.f;
  for (int64_t n = warp_id; n < rows.N; n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* orow = o + o_offset(rows, n);
    const TZ* zrow = z + z_row(rows, n);
    const TY* dyrow = dy + n * D;
    const float r = rstd[n];
    float dot = 0.f;  // Σ g ⊙ ô
    for (int c = lane; c < D; c += 32) {
      const float zv = to_f32(zrow[c]);
      const float s = zv / (1.f + expf(-zv));
      dot += to_f32(dyrow[c]) * s * w[c] * (orow[c] * r);
    }
    const float mean = warp_sum(dot) / static_cast<float>(D);
    float* d_orow = d_o + o_offset(rows, n);
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
      const int c = lane + 32 * k;
      if (c < D) {
        const float zv = to_f32(zrow[c]), dyv = to_f32(dyrow[c]), oh = orow[c] * r, wc = w[c];
        const float sg = 1.f / (1.f + expf(-zv)), s = zv * sg;
        d_orow[c] = r * (dyv * s * wc - oh * mean);
        dz[n * D + c] = from_f32<TZ>(dyv * oh * wc * sg * (1.f + zv * (1.f - sg)));
        acc[k] += dyv * s * oh;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < PER_LANE; ++k) {
    const int c = lane + 32 * k;
    if (c < D) dw_partial[warp_id * D + c] = acc[k];
  }
}

int64_t forward_blocks(int64_t N) { return (N + kWarps - 1) / kWarps < 65535 ? (N + kWarps - 1) / kWarps : 65535; }

}  // namespace

int64_t gated_rmsnorm_backward_partial_rows(int64_t N) {
  const int64_t blocks = (N + kWarps - 1) / kWarps < kBackwardBlocks ? (N + kWarps - 1) / kWarps : kBackwardBlocks;
  return blocks * kWarps;
}

int gated_rmsnorm_forward(void* y, DType y_dt, float* rstd, const float* o, const void* z, DType z_dt,
                          const float* w, const GatedNormRows& rows, float eps, void* stream) {
  if (!gated_rmsnorm_supports(rows.D) || rows.z_heads < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (rows.N == 0) return 0;
  const unsigned grid = static_cast<unsigned>(forward_blocks(rows.N));
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(y_dt, [&](auto y_tag) {
    dispatch_dtype(z_dt, [&](auto z_tag) {
      using TY = decltype(y_tag);
      using TZ = decltype(z_tag);
      gated_rmsnorm_forward_kernel<TY, TZ><<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, o,
                                                                         static_cast<const TZ*>(z), w, rows, eps);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int gated_rmsnorm_backward(float* d_o, void* dz, float* dw_partial, const void* dy, DType y_dt, const float* o,
                           const void* z, DType z_dt, const float* w, const float* rstd, const GatedNormRows& rows,
                           void* stream) {
  if (!gated_rmsnorm_supports(rows.D) || rows.z_heads < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (rows.N == 0) return 0;
  const unsigned grid = static_cast<unsigned>(gated_rmsnorm_backward_partial_rows(rows.N) / kWarps);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(y_dt, [&](auto y_tag) {
    dispatch_dtype(z_dt, [&](auto z_tag) {
      using TY = decltype(y_tag);
      using TZ = decltype(z_tag);
      const TY* dyp = static_cast<const TY*>(dy);
      const TZ* zp = static_cast<const TZ*>(z);
      TZ* dzp = static_cast<TZ*>(dz);
      const dim3 block(kWarps * 32);
      if (rows.D <= 32) {
        gated_rmsnorm_backward_kernel<TY, TZ, 1><<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd, rows);
      } else if (rows.D <= 64) {
        gated_rmsnorm_backward_kernel<TY, TZ, 2><<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd, rows);
      } else if (rows.D <= 128) {
        gated_rmsnorm_backward_kernel<TY, TZ, 4><<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd, rows);
      } else if (rows.D <= 256) {
        gated_rmsnorm_backward_kernel<TY, TZ, 8><<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd, rows);
      } else if (rows.D <= 512) {
        gated_rmsnorm_backward_kernel<TY, TZ, 16><<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd,
                                                                         rows);
      } else {
        gated_rmsnorm_backward_kernel<TY, TZ, 32><<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd,
                                                                         rows);
      }
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

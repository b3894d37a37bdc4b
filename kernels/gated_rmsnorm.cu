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

__device__ __forceinline__ float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__device__ __forceinline__ int64_t z_row(const GatedNormRows& r, int64_t n) {
  return (n / r.z_heads) * r.z_ld + (n % r.z_heads) * r.D;
}

template <typename TY, typename TZ>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_forward_kernel(TY* y, float* rstd, const float* o,
                                                                            const TZ* z, const float* w,
                                                                            GatedNormRows rows, float eps) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* orow = o + n * D;
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
    const float* orow = o + n * D;
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
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
      const int c = lane + 32 * k;
      if (c < D) {
        const float zv = to_f32(zrow[c]), dyv = to_f32(dyrow[c]), oh = orow[c] * r, wc = w[c];
        const float sg = 1.f / (1.f + expf(-zv)), s = zv * sg;
        d_o[n * D + c] = r * (dyv * s * wc - oh * mean);
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

// Runs CALL(TY, TZ) for the output and gate dtypes (each fp32, bf16 or fp16).
#define DD_GATED_NORM_DISPATCH_Z(TY, DT_Z, CALL)       \
  switch (DT_Z) {                                       \
    case DType::F32: CALL(TY, float); break;            \
    case DType::BF16: CALL(TY, __nv_bfloat16); break;   \
    case DType::F16: CALL(TY, __half); break;           \
  }
#define DD_GATED_NORM_DISPATCH(DT_Y, DT_Z, CALL)                                  \
  switch (DT_Y) {                                                                  \
    case DType::F32: DD_GATED_NORM_DISPATCH_Z(float, DT_Z, CALL) break;            \
    case DType::BF16: DD_GATED_NORM_DISPATCH_Z(__nv_bfloat16, DT_Z, CALL) break;   \
    case DType::F16: DD_GATED_NORM_DISPATCH_Z(__half, DT_Z, CALL) break;           \
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
#define DD_LAUNCH(TY, TZ)                                                                                  \
  gated_rmsnorm_forward_kernel<TY, TZ><<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, o,        \
                                                                     static_cast<const TZ*>(z), w, rows, eps)
  DD_GATED_NORM_DISPATCH(y_dt, z_dt, DD_LAUNCH)
#undef DD_LAUNCH
  return static_cast<int>(cudaGetLastError());
}

int gated_rmsnorm_backward(float* d_o, void* dz, float* dw_partial, const void* dy, DType y_dt, const float* o,
                           const void* z, DType z_dt, const float* w, const float* rstd, const GatedNormRows& rows,
                           void* stream) {
  if (!gated_rmsnorm_supports(rows.D) || rows.z_heads < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (rows.N == 0) return 0;
  const unsigned grid = static_cast<unsigned>(gated_rmsnorm_backward_partial_rows(rows.N) / kWarps);
  auto st = static_cast<cudaStream_t>(stream);
#define DD_LAUNCH_K(TY, TZ, K)                                                                        \
  gated_rmsnorm_backward_kernel<TY, TZ, K><<<grid, kWarps * 32, 0, st>>>(                            \
      d_o, static_cast<TZ*>(dz), dw_partial, static_cast<const TY*>(dy), o, static_cast<const TZ*>(z), w, rstd, rows)
#define DD_LAUNCH(TY, TZ)                    \
  if (rows.D <= 32) DD_LAUNCH_K(TY, TZ, 1);  \
  else if (rows.D <= 64) DD_LAUNCH_K(TY, TZ, 2);  \
  else if (rows.D <= 128) DD_LAUNCH_K(TY, TZ, 4); \
  else if (rows.D <= 256) DD_LAUNCH_K(TY, TZ, 8); \
  else if (rows.D <= 512) DD_LAUNCH_K(TY, TZ, 16); \
  else DD_LAUNCH_K(TY, TZ, 32)
  DD_GATED_NORM_DISPATCH(y_dt, z_dt, DD_LAUNCH)
#undef DD_LAUNCH
#undef DD_LAUNCH_K
  return static_cast<int>(cudaGetLastError());
}

#undef DD_GATED_NORM_DISPATCH
#undef DD_GATED_NORM_DISPATCH_Z

}  // namespace kernels

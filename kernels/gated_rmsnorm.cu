// One warp per row, rows grid-strided over the launch's warps. The backward's weight gradient is
// kept per lane in registers for the lane's columns across the warp's rows and written once per
// warp as one row of dw_partial, summed by the caller.
// Rows up to 512 wide: each lane loads its runs of kVec adjacent columns (lane + 32 j, as one
// vector when D is a multiple of 4 and the rows are aligned) into registers once, so every value
// is read once and all of a row's loads are in flight before its warp sum. Wider rows (and
// `gated_rmsnorm_register_rows(false)`) take the looped kernels, which read each value one column
// at a time and twice (about 1.4 TB/s on an H100, where the register kernels move 2.6 forward and
// 1.7 backward; docs/perf.md stop 27).
#include <cuda_runtime.h>

#include <type_traits>

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
        dz[z_row(rows, n) + c] = from_f32<TZ>(dyv * oh * wc * sg * (1.f + zv * (1.f - sg)));
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

// The register kernels: runs of kVec columns at kVec · (lane + 32 j), j < kRuns.
template <int kVec>
__device__ __forceinline__ int run_column(int lane, int j) {
  return kVec * (lane + 32 * j);
}

template <typename TY, typename TZ, int kRuns, int kVec>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_forward_regs_kernel(TY* y, float* rstd, const float* o,
                                                                                 const TZ* z, const float* w,
                                                                                 GatedNormRows rows, float eps) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* orow = o + o_offset(rows, n);
    const TZ* zrow = z + z_row(rows, n);
    float ov[kRuns][kVec], zv[kRuns][kVec];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) ov[j][e] = zv[j][e] = 0.f;
      if (c < D) {  // D % kVec == 0: a run is whole or past the row
        load_run<kVec>(orow, c, ov[j]);
        load_run<kVec>(zrow, c, zv[j]);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) ss += ov[j][e] * ov[j][e];
    }
    const float r = rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
    if (lane == 0) rstd[n] = r;
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
      if (c < D) {
        float out[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float sg = 1.f / (1.f + expf(-zv[j][e]));
          out[e] = ov[j][e] * r * w[c + e] * (zv[j][e] * sg);
        }
        store_run<kVec>(y + n * D, c, out);
      }
    }
  }
}

template <typename TY, typename TZ, int kRuns, int kVec>
__global__ void __launch_bounds__(kWarps * 32)
    gated_rmsnorm_backward_regs_kernel(float* d_o, TZ* dz, float* dw_partial, const TY* dy, const float* o,
                                       const TZ* z, const float* w, const float* rstd, GatedNormRows rows) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  const int64_t warp_id = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  float acc[kRuns][kVec], wv[kRuns][kVec];
#pragma unroll
  for (int j = 0; j < kRuns; ++j) {
    const int c = run_column<kVec>(lane, j);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      acc[j][e] = 0.f;
      wv[j][e] = c < D ? w[c + e] : 0.f;
    }
  }
  // A row's o, z and dy are loaded one row ahead (into the `next` registers while the current row
  // is reduced and written), so the warp's loads are in flight during its arithmetic and stores.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  float next_o[kRuns][kVec], next_z[kRuns][kVec], next_dy[kRuns][kVec];
  auto load_row = [&](int64_t n) {
    const float* orow = o + o_offset(rows, n);
    const TZ* zrow = z + z_row(rows, n);
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) next_o[j][e] = next_z[j][e] = next_dy[j][e] = 0.f;
      if (c < D) {
        load_run<kVec>(orow, c, next_o[j]);
        load_run<kVec>(zrow, c, next_z[j]);
        load_run<kVec>(dy + n * D, c, next_dy[j]);
      }
    }
  };
  if (warp_id < rows.N) load_row(warp_id);
  for (int64_t n = warp_id; n < rows.N; n += stride) {
    const float r = rstd[n];
    float oh[kRuns][kVec], zv[kRuns][kVec], dyv[kRuns][kVec];
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        oh[j][e] = next_o[j][e];
        zv[j][e] = next_z[j][e];
        dyv[j][e] = next_dy[j][e];
      }
    }
    if (n + stride < rows.N) load_row(n + stride);
    float dot = 0.f;  // Σ g ⊙ ô
    float sgv[kRuns][kVec];  // sigmoid(z)
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        oh[j][e] *= r;
        sgv[j][e] = 1.f / (1.f + expf(-zv[j][e]));
        dot += dyv[j][e] * (zv[j][e] * sgv[j][e]) * wv[j][e] * oh[j][e];
      }
    }
    const float mean = warp_sum(dot) / static_cast<float>(D);
    float* d_orow = d_o + o_offset(rows, n);
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
      if (c < D) {
        float g_o[kVec], g_z[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float zz = zv[j][e], sg = sgv[j][e], s = zz * sg;
          g_o[e] = r * (dyv[j][e] * s * wv[j][e] - oh[j][e] * mean);
          g_z[e] = dyv[j][e] * oh[j][e] * wv[j][e] * sg * (1.f + zz * (1.f - sg));
          acc[j][e] += dyv[j][e] * s * oh[j][e];
        }
        store_run<kVec>(d_orow, c, g_o);
        store_run<kVec>(dz + z_row(rows, n), c, g_z);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRuns; ++j) {
    const int c = run_column<kVec>(lane, j);
    if (c < D) store_run<kVec>(dw_partial + warp_id * D, c, acc[j]);
  }
}

bool g_register_rows = true;  // gated_rmsnorm_register_rows

// f(integral_constant<kRuns>, integral_constant<kVec>) for the register kernels when they take a
// row of D (D ≤ 512, the switch on); false otherwise. kVec = 4 needs D % 4 == 0 and every pointer
// and row start aligned to 4 elements (vec_ok).
template <typename F>
bool with_register_shape(int64_t D, bool vec_ok, F&& f) {
  using std::integral_constant;
  if (!g_register_rows || D > 512) return false;
  if (vec_ok && D % 4 == 0) {
    if (D <= 128) f(integral_constant<int, 1>{}, integral_constant<int, 4>{});
    else if (D <= 256) f(integral_constant<int, 2>{}, integral_constant<int, 4>{});
    else f(integral_constant<int, 4>{}, integral_constant<int, 4>{});
  } else {
    if (D <= 64) f(integral_constant<int, 2>{}, integral_constant<int, 1>{});
    else if (D <= 128) f(integral_constant<int, 4>{}, integral_constant<int, 1>{});
    else if (D <= 256) f(integral_constant<int, 8>{}, integral_constant<int, 1>{});
    else f(integral_constant<int, 16>{}, integral_constant<int, 1>{});
  }
  return true;
}

// Whether the rows' starts and the base pointers allow 4-column vectors (o, d_o fp32; z, dz in
// z's dtype; y, dy in y's).
bool rows_take_vectors(const GatedNormRows& rows, int y_bytes, int z_bytes, const void* y, const void* o,
                       const void* z, const void* d_o = nullptr, const void* dz = nullptr) {
  return rows.D % 4 == 0 && rows.z_ld % 4 == 0 && aligned_to(16, o, d_o) && aligned_to(4 * z_bytes, z, dz) &&
         aligned_to(4 * y_bytes, y);
}

int64_t forward_blocks(int64_t N) { return (N + kWarps - 1) / kWarps < 65535 ? (N + kWarps - 1) / kWarps : 65535; }

}  // namespace

void gated_rmsnorm_register_rows(bool on) { g_register_rows = on; }

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
      const bool vec_ok = rows_take_vectors(rows, sizeof(TY), sizeof(TZ), y, o, z);
      const bool regs = with_register_shape(rows.D, vec_ok, [&](auto runs, auto vec) {
        gated_rmsnorm_forward_regs_kernel<TY, TZ, decltype(runs)::value, decltype(vec)::value>
            <<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, o, static_cast<const TZ*>(z), w, rows, eps);
      });
      if (!regs) {
        gated_rmsnorm_forward_kernel<TY, TZ><<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, o,
                                                                           static_cast<const TZ*>(z), w, rows, eps);
      }
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
      const bool vec_ok = rows_take_vectors(rows, sizeof(TY), sizeof(TZ), dy, o, z, d_o, dz) && aligned_to(16, dw_partial);
      const bool regs = with_register_shape(rows.D, vec_ok, [&](auto runs, auto vec) {
        gated_rmsnorm_backward_regs_kernel<TY, TZ, decltype(runs)::value, decltype(vec)::value>
            <<<grid, block, 0, st>>>(d_o, dzp, dw_partial, dyp, o, zp, w, rstd, rows);
      });
      if (regs) return;
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

// One warp per row, rows grid-strided over the launch's warps. The backward's weight gradient is
// kept per lane in registers for the lane's columns across the warp's rows; at the end the block
// sums its warps' rows in shared memory and writes one row of dw_partial, which the caller sums
// (512 rows at hybrid base; one row a warp gave the caller 4096).
// Rows up to 512 wide: each lane loads its runs of kVec adjacent columns (lane + 32 j, as one
// vector when D is a multiple of 4 and the rows are aligned) into registers once, so every value
// is read once and all of a row's loads are in flight before its warp sum. Wider rows (and
// `gated_rmsnorm_register_rows(false)`) take the looped kernels, which read each value one column
// at a time and twice (about 1.4 TB/s on an H100, where the register kernels move 2.6 forward and
// 1.7 backward; docs/perf.md stop 27). With 16-bit y and z and rows up to 256, the backward
// stages its rows through shared memory instead (gated_rmsnorm_backward_staged_kernel), so that
// more rows are in flight than registers allow.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/elem.cuh"
#include "kernels/fast_sigmoid.cuh"
#include "kernels/gated_rmsnorm.h"
#include "kernels/smem_opt_in.cuh"

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

// The block's row of dw_partial: each warp's weight-gradient sums (for_each_column(f) calls f(c,
// value) for this lane's columns c < D, every column of the row among the warp's lanes) into
// red [kWarps][pitch] in shared memory, then summed over the warps in their order (the same bits
// whatever the timing) into row blockIdx.x. Every thread of the block calls it.
template <class ForEachColumn>
__device__ __forceinline__ void store_block_dw(float* dw_partial, float* red, int pitch, int D,
                                               ForEachColumn for_each_column) {
  const int warp = threadIdx.x / 32;
  for_each_column([&](int c, float v) { red[warp * pitch + c] = v; });
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += kWarps * 32) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w * pitch + c];
    dw_partial[static_cast<int64_t>(blockIdx.x) * D + c] = sum;
  }
}

template <typename TY, typename TZ, typename TO>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_forward_kernel(TY* y, float* rstd, const TO* o,
                                                                            const TZ* z, const float* w,
                                                                            GatedNormRows rows, float eps) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TO* orow = o + o_offset(rows, n);
    float ss = 0.f;
    for (int c = lane; c < D; c += 32) ss += to_f32(orow[c]) * to_f32(orow[c]);
    const float r = rsqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
    if (lane == 0) rstd[n] = r;
    const TZ* zrow = z + z_row(rows, n);
    for (int c = lane; c < D; c += 32) {
      const float zv = to_f32(zrow[c]);
      const float sg = 1.f / (1.f + expf(-zv));
      y[n * D + c] = from_f32<TY>(to_f32(orow[c]) * r * w[c] * (zv * sg));
    }
  }
}

// The backward at one element, in every backward kernel: from dy, ô = o · r, w, z, sigmoid(z),
// the row's r and mean = Σ dy ⊙ w ⊙ silu(z) ⊙ ô / D, the gradients of o and z and the element's
// term of w's gradient:
//   g_o = r (dy silu(z) w − ô mean),  g_z = dy ô w σ(z) (1 + z (1 − σ(z))),  dw += dy silu(z) ô.
struct GatedNormGrads {
  float o, z, w;
};
__device__ __forceinline__ GatedNormGrads gated_norm_grads(float dy, float oh, float w, float z, float sg, float r,
                                                         float mean) {
  const float s = z * sg;  // silu(z)
  return {r * (dy * s * w - oh * mean), dy * oh * w * sg * (1.f + z * (1.f - sg)), dy * s * oh};
}

// PER_LANE: columns per lane, ⌈D / 32⌉ rounded up to a power of two (the unrolled loop and the
// weight-gradient registers are sized by it, so a 128-wide head does not walk 32 idle slots).
template <typename TY, typename TZ, typename TO, int PER_LANE>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_backward_kernel(TO* d_o, TZ* dz, float* dw_partial,
                                                                             const TY* dy, const TO* o, const TZ* z,
                                                                             const float* w, const float* rstd,
                                                                             GatedNormRows rows) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  const int64_t warp_id = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  float acc[PER_LANE];
#pragma unroll
  for (int k = 0; k < PER_LANE; ++k) acc[k] = 0.f;
  for (int64_t n = warp_id; n < rows.N; n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TO* orow = o + o_offset(rows, n);
    const TZ* zrow = z + z_row(rows, n);
    const TY* dyrow = dy + n * D;
    const float r = rstd[n];
    float dot = 0.f;  // Σ g ⊙ ô
    for (int c = lane; c < D; c += 32) {
      const float zv = to_f32(zrow[c]);
      const float s = zv / (1.f + expf(-zv));
      dot += to_f32(dyrow[c]) * s * w[c] * (to_f32(orow[c]) * r);
    }
    const float mean = warp_sum(dot) / static_cast<float>(D);
    TO* d_orow = d_o + o_offset(rows, n);
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
      const int c = lane + 32 * k;
      if (c < D) {
        const float zv = to_f32(zrow[c]);
        const GatedNormGrads gr =
            gated_norm_grads(to_f32(dyrow[c]), to_f32(orow[c]) * r, w[c], zv, 1.f / (1.f + expf(-zv)), r, mean);
        d_orow[c] = from_f32<TO>(gr.o);
        dz[z_row(rows, n) + c] = from_f32<TZ>(gr.z);
        acc[k] += gr.w;
      }
    }
  }
  __shared__ float red[kWarps * 32 * PER_LANE];
  store_block_dw(dw_partial, red, 32 * PER_LANE, D, [&](auto f) {
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
      if (lane + 32 * k < D) f(lane + 32 * k, acc[k]);
    }
  });
}

// The register forward and the staged backward take fast_sigmoid (kernels/fast_sigmoid.cuh): they
// are bound by instruction issue more than by memory (the staged backward 0.77 -> 0.60 ms a step at
// hybrid base with __expf and __fdividef, docs/perf.md stop 49).

// The register kernels: runs of kVec columns at kVec · (lane + 32 j), j < kRuns.
template <int kVec>
__device__ __forceinline__ int run_column(int lane, int j) {
  return kVec * (lane + 32 * j);
}

template <typename TY, typename TZ, typename TO, int kRuns, int kVec>
__global__ void __launch_bounds__(kWarps * 32) gated_rmsnorm_forward_regs_kernel(TY* y, float* rstd, const TO* o,
                                                                                 const TZ* z, const float* w,
                                                                                 GatedNormRows rows, float eps) {
  const int lane = threadIdx.x % 32;
  const int D = static_cast<int>(rows.D);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; n < rows.N;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const TO* orow = o + o_offset(rows, n);
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
          out[e] = ov[j][e] * r * w[c + e] * (zv[j][e] * fast_sigmoid(zv[j][e]));
        }
        store_run<kVec>(y + n * D, c, out);
      }
    }
  }
}

// The grouped kernels' walk (gated_rmsnorm_forward_groups_kernel below): four rows a warp, the
// eight lanes 8·sub .. 8·sub + 7 on row 4·group + sub, lane sl of them holding the row's pieces sl,
// sl + 8, ...; groups grid-strided over the launch's warps. o_index(gi) is this lane's row of o in
// group gi (its o_row entry; 0 past the rows), read a group ahead by the kernels.
struct RowGroups {
  const GatedNormRows& rows;
  int sub, sl;
  int64_t groups, stride;
  __device__ explicit RowGroups(const GatedNormRows& r) : rows(r) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    sub = lane / 8;
    sl = lane % 8;
    groups = (r.N + 3) / 4;
    stride = static_cast<int64_t>(gridDim.x) * kWarps;
  }
  __device__ int64_t first_group() const { return static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; }
  __device__ int64_t o_index(int64_t gi) const {
    const int64_t n = 4 * gi + sub;
    return gi < groups && n < rows.N ? (rows.o_row != nullptr ? static_cast<int64_t>(__ldg(rows.o_row + n)) : n) : 0;
  }
};

// w (D ≤ 64 kJ) into the block's w_s [64 kJ], zeros past D; every thread of the block calls it.
template <int kJ>
__device__ __forceinline__ void stage_w(float* w_s, const float* w, int D) {
  for (int c = threadIdx.x; c < 64 * kJ; c += kWarps * 32) w_s[c] = c < D ? w[c] : 0.f;
  __syncthreads();
}

// The eight values of w at piece p (columns 8p .. 8p + 7) from w_s.
__device__ __forceinline__ void w_piece(const float* w_s, int p, float (&wv)[8]) {
  const float4 w0 = *reinterpret_cast<const float4*>(w_s + 8 * p);
  const float4 w1 = *reinterpret_cast<const float4*>(w_s + 8 * p + 4);
  wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w, wv[4] = w1.x, wv[5] = w1.y, wv[6] = w1.z, wv[7] = w1.w;
}

// The forward for 16-bit o, z and y of one type, D a multiple of 8 up to 256, every row start
// aligned to 16 bytes: four rows a warp, eight lanes a row, each lane kJ 16-byte pieces of its row
// (piece p of a row's D / 8 at lane p % 8, slot p / 8), so a row's sum of squares takes three
// shuffles within its eight lanes. The register kernel above holds one row a warp, its loads
// waiting on the row's o_row entry first: two memory latencies a row with one row in flight a
// warp. Here each warp has four rows' loads in flight at once, and the o_row entries of its next
// four rows are loaded a group ahead. w is read from shared memory (in registers it took 24 of
// them at D = 192 and spilled under four blocks an SM).
template <typename T, int kJ>
__global__ void __launch_bounds__(kWarps * 32, 4) gated_rmsnorm_forward_groups_kernel(T* y, float* rstd, const T* o,
                                                                                   const T* z, const float* w,
                                                                                   GatedNormRows rows, float eps) {
  const RowGroups rg(rows);
  const int sl = rg.sl, D = static_cast<int>(rows.D), pieces = D / 8;
  __shared__ __align__(16) float w_s[64 * kJ];
  stage_w<kJ>(w_s, w, D);
  int64_t gi = rg.first_group();
  int64_t o_at = rg.o_index(gi);
  for (; gi < rg.groups; gi += rg.stride) {  // warp-uniform: every lane takes the shuffles below
    const int64_t n = 4 * gi + rg.sub;
    const bool live = n < rows.N;
    const int64_t o_next = rg.o_index(gi + rg.stride);
    Vec<T, 8> ov[kJ], zv[kJ];
    const T* orow = o + o_at * D;
    const T* zrow = z + (live ? z_row(rows, n) : 0);
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int p = sl + 8 * j;
      if (live && p < pieces) {
        ov[j].load(orow + 8 * p);
        zv[j].load(zrow + 8 * p);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) ov[j].set(e, 0.f), zv[j].set(e, 0.f);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += ov[j].get(e) * ov[j].get(e);
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 4);
    ss += __shfl_xor_sync(0xffffffffu, ss, 2);
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    const float r = rsqrtf(ss / static_cast<float>(D) + eps);
    if (live) {
      if (sl == 0) rstd[n] = r;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int p = sl + 8 * j;
        if (p < pieces) {
          Vec<T, 8> out;
          float wv[8];
          w_piece(w_s, p, wv);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float zf = zv[j].get(e);
            out.set(e, ov[j].get(e) * r * wv[e] * (zf * fast_sigmoid(zf)));
          }
          out.store(y + n * D + 8 * p);
        }
      }
    }
    o_at = o_next;
  }
}

template <typename TY, typename TZ, typename TO, int kRuns, int kVec>
__global__ void __launch_bounds__(kWarps * 32)
    gated_rmsnorm_backward_regs_kernel(TO* d_o, TZ* dz, float* dw_partial, const TY* dy, const TO* o,
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
    const TO* orow = o + o_offset(rows, n);
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
    TO* d_orow = d_o + o_offset(rows, n);
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
      if (c < D) {
        float g_o[kVec], g_z[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const GatedNormGrads gr = gated_norm_grads(dyv[j][e], oh[j][e], wv[j][e], zv[j][e], sgv[j][e], r, mean);
          g_o[e] = gr.o;
          g_z[e] = gr.z;
          acc[j][e] += gr.w;
        }
        store_run<kVec>(d_orow, c, g_o);
        store_run<kVec>(dz + z_row(rows, n), c, g_z);
      }
    }
  }
  __shared__ float red[kWarps * 32 * kRuns * kVec];
  store_block_dw(dw_partial, red, 32 * kRuns * kVec, D, [&](auto f) {
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (c < D) f(c + e, acc[j][e]);
      }
    }
  });
}

// The backward for 16-bit y and z, its rows staged through shared memory. The register kernel
// above holds every in-flight value in registers, which limits it to two blocks an SM at a row of
// 192 and one row in flight a warp (about 2.2 TB/s on an H200). Here each lane copies its own runs
// of a row (o, z, dy and the row's rstd) by cp.async into a ring of kStages slots of its own and
// reads back only what it copied, so no barrier is needed: a warp has kStages − 1 rows in flight
// while it works on one, and only that one is in registers. With the loads off the critical path,
// the arithmetic bounds it (ncu: 67% SM throughput at 42% of the DRAM bandwidth with IEEE division
// and expf), so the sigmoid takes the fast intrinsics, as the short conv's does, and a row's
// offsets take 32-bit division (the host takes this kernel for fewer than 2³⁰ rows, so that a row
// index three grid strides ahead still fits an int).
constexpr int kStages = 3;

template <typename T, typename TO, int kRuns, int kVec>
struct StagedRowSlots {
  Vec<TO, kVec> o[kStages][kWarps][kRuns][32];
  Vec<T, kVec> z[kStages][kWarps][kRuns][32];
  Vec<T, kVec> dy[kStages][kWarps][kRuns][32];
  float r[kStages][kWarps][32];
  float w[kRuns * kVec * 32];
};

template <typename T, typename TO, int kRuns, int kVec>
__global__ void __launch_bounds__(kWarps * 32, 4)  // four blocks an SM: 64 registers (24 bytes spilled at (2, 4))
    gated_rmsnorm_backward_staged_kernel(TO* d_o, T* dz, float* dw_partial, const T* dy, const TO* o,
                                         const T* z, const float* w, const float* rstd, GatedNormRows rows) {
  extern __shared__ __align__(16) unsigned char staged_smem[];
  auto& slots = *reinterpret_cast<StagedRowSlots<T, TO, kRuns, kVec>*>(staged_smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int D = static_cast<int>(rows.D);
  const int N = static_cast<int>(rows.N), z_heads = static_cast<int>(rows.z_heads);
  const int warp_id = static_cast<int>(blockIdx.x) * kWarps + warp, stride = static_cast<int>(gridDim.x) * kWarps;
  // w in shared memory rather than registers (it is read twice a row): registers set how many
  // warps an SM holds.
  for (int c = threadIdx.x; c < kRuns * kVec * 32; c += kWarps * 32) slots.w[c] = c < D ? w[c] : 0.f;
  __syncthreads();
  float acc[kRuns][kVec];
#pragma unroll
  for (int j = 0; j < kRuns; ++j) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[j][e] = 0.f;
  }
  auto z_offset = [&](int n) { return static_cast<int64_t>(n / z_heads) * rows.z_ld + (n % z_heads) * D; };
  auto o_index = [&](int n) { return rows.o_row != nullptr ? rows.o_row[n] : n; };
  // Starts the copies of row n (none past the last row; its row of o is o_row) into ring slot
  // `slot`, as one group: a group is committed for every call, so that the waits below count rows.
  auto stage_row = [&](int n, int o_row, int slot) {
    if (n < N) {
      const TO* orow = o + static_cast<int64_t>(o_row) * D;
      const T* zrow = z + z_offset(n);
      const T* dyrow = dy + static_cast<int64_t>(n) * D;
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
        const int c = run_column<kVec>(lane, j);
        if (c < D) {  // D % kVec == 0: a run is whole or past the row
          cp_async<sizeof(Vec<TO, kVec>)>(&slots.o[slot][warp][j][lane], orow + c);
          cp_async<sizeof(Vec<T, kVec>)>(&slots.z[slot][warp][j][lane], zrow + c);
          cp_async<sizeof(Vec<T, kVec>)>(&slots.dy[slot][warp][j][lane], dyrow + c);
        }
      }
      cp_async<4>(&slots.r[slot][warp][lane], rstd + n);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int n = warp_id + s * stride;
    stage_row(n, n < N ? o_index(n) : 0, s);
  }
  // The o row of the row kStages − 1 ahead, read a row before its copies start (o_row's load is
  // then in flight while this row is worked on, not waited for when they start).
  int ahead = warp_id + (kStages - 1) * stride, o_ahead = ahead < N ? o_index(ahead) : 0;
  int slot = 0;
  for (int n = warp_id; n < N; n += stride, ahead += stride) {
    cp_async_wait<kStages - 2>();  // row n's group is in; the kStages − 2 after it may not be
    float ov[kRuns][kVec], zv[kRuns][kVec], dyv[kRuns][kVec];
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const bool in_row = run_column<kVec>(lane, j) < D;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        ov[j][e] = in_row ? slots.o[slot][warp][j][lane].get(e) : 0.f;
        zv[j][e] = in_row ? slots.z[slot][warp][j][lane].get(e) : 0.f;
        dyv[j][e] = in_row ? slots.dy[slot][warp][j][lane].get(e) : 0.f;
      }
    }
    const float r = slots.r[slot][warp][lane];
    // The slot this lane read in the row before takes the row kStages − 1 ahead (the copies are
    // started after those reads, in program order).
    stage_row(ahead, o_ahead, slot == 0 ? kStages - 1 : slot - 1);
    if (ahead + stride < N) o_ahead = o_index(ahead + stride);
    slot = slot == kStages - 1 ? 0 : slot + 1;
    const int o_n = o_index(n);  // a cached read: this row's copies read it kStages − 1 rows ago
    float dot = 0.f;             // Σ g ⊙ ô
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const float* wj = slots.w + run_column<kVec>(lane, j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        ov[j][e] *= r;  // ô
        dot += dyv[j][e] * (zv[j][e] * fast_sigmoid(zv[j][e])) * wj[e] * ov[j][e];
      }
    }
    const float mean = warp_sum(dot) / static_cast<float>(D);
    TO* d_orow = d_o + static_cast<int64_t>(o_n) * D;
    T* dzrow = dz + z_offset(n);
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
      if (c < D) {
        float g_o[kVec], g_z[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          // The sigmoid again rather than kept from the sum above, for the same reason as w.
          const GatedNormGrads gr =
              gated_norm_grads(dyv[j][e], ov[j][e], slots.w[c + e], zv[j][e], fast_sigmoid(zv[j][e]), r, mean);
          g_o[e] = gr.o;
          g_z[e] = gr.z;
          acc[j][e] += gr.w;
        }
        store_run<kVec>(d_orow, c, g_o);
        store_run<kVec>(dzrow, c, g_z);
      }
    }
  }
  cp_async_wait_all();  // no copy outlives the block (the ring's last groups are empty or unread)
  // The ring's o slots take the warps' rows (kStages · kWarps · kRuns · 32 pieces hold kWarps · D
  // floats) once every warp is done reading them.
  __syncthreads();
  static_assert(sizeof(slots.o) >= sizeof(float) * kWarps * kRuns * kVec * 32, "the o slots hold the warps' rows");
  store_block_dw(dw_partial, reinterpret_cast<float*>(&slots.o[0][0][0][0]), 32 * kRuns * kVec, D, [&](auto f) {
#pragma unroll
    for (int j = 0; j < kRuns; ++j) {
      const int c = run_column<kVec>(lane, j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (c < D) f(c + e, acc[j][e]);
      }
    }
  });
}

constexpr int kGroupedBackwardBlocks = 2;  // an SM's: its registers hold a row group's values and dw's parts

// The backward in the grouped forward's layout (16-bit o, z, y of one type, D a multiple of 8 up to
// 256, rows aligned): four rows a warp, eight lanes a row, kJ 16-byte pieces a lane, each row's o,
// z, dy and r loaded at once (the o_row entries of the warp's next group a group ahead), the row's
// Σ g ⊙ ô by three shuffles in its eight lanes. The lane's columns are the same in every row, so
// its share of dw stays in registers (kJ · 8 of them: two blocks an SM); at the end the four
// rows' lanes of a column add theirs by shuffles and the block's warps through shared memory
// (store_block_dw). The grid may be smaller than the caller's dw_partial rows: block b also zeroes
// rows b + grid, b + 2 grid, ... of it.
template <typename T, int kJ>
__global__ void __launch_bounds__(kWarps * 32, kGroupedBackwardBlocks)
    gated_rmsnorm_backward_groups_kernel(T* d_o, T* dz, float* dw_partial, int partial_rows, const T* dy, const T* o,
                                         const T* z, const float* w, const float* rstd, GatedNormRows rows) {
  const RowGroups rg(rows);
  const int sub = rg.sub, sl = rg.sl, D = static_cast<int>(rows.D), pieces = D / 8;
  __shared__ __align__(16) float w_s[64 * kJ];
  __shared__ float red[kWarps * 64 * kJ];
  stage_w<kJ>(w_s, w, D);
  float acc[kJ][8];
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.f;
  }
  int64_t gi = rg.first_group();
  int64_t o_at = rg.o_index(gi);
  for (; gi < rg.groups; gi += rg.stride) {  // warp-uniform: every lane takes the shuffles below
    const int64_t n = 4 * gi + sub;
    const bool live = n < rows.N;
    const int64_t o_next = rg.o_index(gi + rg.stride);
    const int64_t z_at = live ? z_row(rows, n) : 0;
    Vec<T, 8> ov[kJ], zv[kJ], dyv[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int p = sl + 8 * j;
      if (live && p < pieces) {
        ov[j].load(o + o_at * D + 8 * p);
        zv[j].load(z + z_at + 8 * p);
        dyv[j].load(dy + n * D + 8 * p);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) ov[j].set(e, 0.f), zv[j].set(e, 0.f), dyv[j].set(e, 0.f);
      }
    }
    const float r = live ? rstd[n] : 0.f;
    float dot = 0.f;  // Σ g ⊙ ô over the lane's columns
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int p = sl + 8 * j;
      float wv[8];
      w_piece(w_s, p, wv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float zf = zv[j].get(e);
        dot += dyv[j].get(e) * (zf * fast_sigmoid(zf)) * wv[e] * (ov[j].get(e) * r);
      }
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 4);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    const float mean = dot / static_cast<float>(D);
    if (live) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int p = sl + 8 * j;
        if (p < pieces) {
          float wv[8];
          w_piece(w_s, p, wv);
          Vec<T, 8> g_o, g_z;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float zf = zv[j].get(e);
            const GatedNormGrads gr =
                gated_norm_grads(dyv[j].get(e), ov[j].get(e) * r, wv[e], zf, fast_sigmoid(zf), r, mean);
            g_o.set(e, gr.o);
            g_z.set(e, gr.z);
            acc[j][e] += gr.w;
          }
          g_o.store(d_o + o_at * D + 8 * p);
          g_z.store(dz + z_at + 8 * p);
        }
      }
    }
    o_at = o_next;
  }
  // The warp's four rows' lanes of a column hold its parts: lanes sl, sl + 8, sl + 16, sl + 24.
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      acc[j][e] += __shfl_xor_sync(0xffffffffu, acc[j][e], 8);
      acc[j][e] += __shfl_xor_sync(0xffffffffu, acc[j][e], 16);
    }
  }
  store_block_dw(dw_partial, red, 64 * kJ, D, [&](auto f) {
    if (sub != 0) return;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int p = sl + 8 * j;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (p < pieces) f(8 * p + e, acc[j][e]);
      }
    }
  });
  for (int64_t row = blockIdx.x + gridDim.x; row < partial_rows; row += gridDim.x) {
    for (int c = threadIdx.x; c < D; c += kWarps * 32) dw_partial[row * D + c] = 0.f;
  }
}

bool g_register_rows = true;  // gated_rmsnorm_register_rows
bool g_staged_rows = true;    // gated_rmsnorm_staged_rows
bool g_grouped_rows = true;   // gated_rmsnorm_grouped_rows
std::atomic<int64_t> g_staged_launches{0};
std::atomic<int64_t> g_grouped_launches{0};

// f(integral_constant<kJ>) for the grouped kernels when they take the rows: 16-bit o, z, y of one
// type (the caller's), D a multiple of 8 up to 64 · max_pieces (at most 256), z's rows and every
// pointer 16-byte aligned.
template <typename F>
bool with_grouped_shape(const GatedNormRows& rows, const void* y, const void* o, const void* z, int max_pieces,
                        F&& f) {
  using std::integral_constant;
  if (!g_register_rows || !g_grouped_rows || rows.D % 8 != 0 || rows.D > 64 * max_pieces || rows.D > 256 ||
      rows.z_ld % 8 != 0 || !aligned_to(16, y, o, z)) {
    return false;
  }
  const int64_t per_lane = (rows.D / 8 + 7) / 8;
  if (per_lane == 1) f(integral_constant<int, 1>{});
  else if (per_lane == 2) f(integral_constant<int, 2>{});
  else if (per_lane == 3) f(integral_constant<int, 3>{});
  else f(integral_constant<int, 4>{});
  return true;
}

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

// The forward's register kernel shape: with_register_shape's, but a row of 192 as three runs of 2
// columns, every lane busy (as the staged backward takes it), where two runs of 4 leave half the
// lanes idle in the second (hybrid base: 0.39 -> 0.35 ms a step).
template <typename F>
bool with_forward_shape(int64_t D, bool vec_ok, F&& f) {
  if (g_register_rows && vec_ok && D == 192) {
    f(std::integral_constant<int, 3>{}, std::integral_constant<int, 2>{});
    return true;
  }
  return with_register_shape(D, vec_ok, f);
}

// f(integral_constant<kRuns>, integral_constant<kVec>) for the staged backward when it takes a row
// of D (the register kernels' conditions, D ≤ 256 and N < 2³⁰); false otherwise. A row of 192 takes three
// runs of 2 columns, every lane busy, where the register backward's two runs of 4 leave half the
// lanes idle in the second.
template <typename F>
bool with_staged_shape(int64_t N, int64_t D, bool vec_ok, F&& f) {
  using std::integral_constant;
  if (!g_register_rows || !g_staged_rows || !vec_ok || D % 4 != 0 || D > 256 || N >= (int64_t{1} << 30)) return false;
  if (D == 192) f(integral_constant<int, 3>{}, integral_constant<int, 2>{});
  else if (D <= 128) f(integral_constant<int, 1>{}, integral_constant<int, 4>{});
  else f(integral_constant<int, 2>{}, integral_constant<int, 4>{});
  return true;
}

// Whether the rows' starts and the base pointers allow 4-column vectors (o, d_o in o's dtype; z, dz in
// z's; y, dy in y's).
bool rows_take_vectors(const GatedNormRows& rows, int y_bytes, int z_bytes, int o_bytes, const void* y, const void* o,
                       const void* z, const void* d_o = nullptr, const void* dz = nullptr) {
  return rows.D % 4 == 0 && rows.z_ld % 4 == 0 && aligned_to(4 * o_bytes, o, d_o) && aligned_to(4 * z_bytes, z, dz) &&
         aligned_to(4 * y_bytes, y);
}

// f(o_tag) with o_tag of o's element type: fp32, or bf16 beside bf16 y and z (the 16-bit training
// path; no other mix is compiled). Returns false where o_dt is not one of those.
template <typename TY, typename TZ, typename F>
bool dispatch_o(DType o_dt, F&& f) {
  if (o_dt == DType::F32) {
    f(float{});
    return true;
  }
  if constexpr (std::is_same<TY, __nv_bfloat16>::value && std::is_same<TZ, __nv_bfloat16>::value) {
    if (o_dt == DType::BF16) {
      f(__nv_bfloat16{});
      return true;
    }
  }
  return false;
}

int64_t forward_blocks(int64_t N) { return (N + kWarps - 1) / kWarps < 65535 ? (N + kWarps - 1) / kWarps : 65535; }

}  // namespace

void gated_rmsnorm_register_rows(bool on) { g_register_rows = on; }
void gated_rmsnorm_staged_rows(bool on) { g_staged_rows = on; }
int64_t gated_rmsnorm_staged_launches() { return g_staged_launches.load(); }
void gated_rmsnorm_grouped_rows(bool on) { g_grouped_rows = on; }
int64_t gated_rmsnorm_grouped_launches() { return g_grouped_launches.load(); }

int64_t gated_rmsnorm_backward_partial_rows(int64_t N) {
  // One row a block (store_block_dw).
  return (N + kWarps - 1) / kWarps < kBackwardBlocks ? (N + kWarps - 1) / kWarps : kBackwardBlocks;
}

int gated_rmsnorm_forward(void* y, DType y_dt, float* rstd, const void* o, DType o_dt, const void* z, DType z_dt,
                          const float* w, const GatedNormRows& rows, float eps, void* stream) {
  if (!gated_rmsnorm_supports(rows.D) || rows.z_heads < 1 || !gated_rmsnorm_takes_o(o_dt, y_dt, z_dt)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (rows.N == 0) return 0;
  const unsigned grid = static_cast<unsigned>(forward_blocks(rows.N));
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(y_dt, [&](auto y_tag) {
    dispatch_dtype(z_dt, [&](auto z_tag) {
      using TY = decltype(y_tag);
      using TZ = decltype(z_tag);
      dispatch_o<TY, TZ>(o_dt, [&](auto o_tag) {
        using TO = decltype(o_tag);
        const TO* op = static_cast<const TO*>(o);
        if constexpr (sizeof(TY) == 2 && sizeof(TZ) == 2 && sizeof(TO) == 2) {  // bf16 o comes with bf16 y and z only
          const bool grouped = with_grouped_shape(rows, y, o, z, 4, [&](auto per_lane) {
            // Four blocks an SM at most, so that each warp walks several groups and the o_row
            // entries it loads a group ahead are in hand when their rows' loads start.
            const int64_t groups = (rows.N + 3) / 4;
            int device = 0, sms = 132;
            if (cudaGetDevice(&device) != cudaSuccess ||
                cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
              sms = 132;
            }
            const unsigned g_grid =
                static_cast<unsigned>(std::min<int64_t>((groups + kWarps - 1) / kWarps, int64_t{4} * sms));
            gated_rmsnorm_forward_groups_kernel<TY, decltype(per_lane)::value>
                <<<g_grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, op, static_cast<const TZ*>(z), w, rows,
                                                 eps);
            ++g_grouped_launches;
          });
          if (grouped) return;
        }
        const bool vec_ok = rows_take_vectors(rows, sizeof(TY), sizeof(TZ), sizeof(TO), y, o, z);
        const bool regs = with_forward_shape(rows.D, vec_ok, [&](auto runs, auto vec) {
          gated_rmsnorm_forward_regs_kernel<TY, TZ, TO, decltype(runs)::value, decltype(vec)::value>
              <<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, op, static_cast<const TZ*>(z), w, rows, eps);
        });
        if (!regs) {
          gated_rmsnorm_forward_kernel<TY, TZ, TO>
              <<<grid, kWarps * 32, 0, st>>>(static_cast<TY*>(y), rstd, op, static_cast<const TZ*>(z), w, rows, eps);
        }
      });
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int gated_rmsnorm_backward(void* d_o, void* dz, float* dw_partial, const void* dy, DType y_dt, const void* o,
                           DType o_dt, const void* z, DType z_dt, const float* w, const float* rstd,
                           const GatedNormRows& rows, void* stream) {
  if (!gated_rmsnorm_supports(rows.D) || rows.z_heads < 1 || !gated_rmsnorm_takes_o(o_dt, y_dt, z_dt)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (rows.N == 0) return 0;
  const unsigned grid = static_cast<unsigned>(gated_rmsnorm_backward_partial_rows(rows.N));
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(y_dt, [&](auto y_tag) {
    dispatch_dtype(z_dt, [&](auto z_tag) {
      using TY = decltype(y_tag);
      using TZ = decltype(z_tag);
      dispatch_o<TY, TZ>(o_dt, [&](auto o_tag) {
        using TO = decltype(o_tag);
        const TY* dyp = static_cast<const TY*>(dy);
        const TZ* zp = static_cast<const TZ*>(z);
        const TO* op = static_cast<const TO*>(o);
        TO* d_op = static_cast<TO*>(d_o);
        TZ* dzp = static_cast<TZ*>(dz);
        const dim3 block(kWarps * 32);
        const bool vec_ok =
            rows_take_vectors(rows, sizeof(TY), sizeof(TZ), sizeof(TO), dy, o, z, d_o, dz);
        if constexpr (sizeof(TY) == 2 && sizeof(TZ) == 2 && sizeof(TO) == 2) {  // bf16 o comes with bf16 y and z only
          // Rows up to 192 wide: at 256 the kernel's values spill from its registers (the staged
          // kernel takes those).
          const bool grouped = aligned_to(16, d_o, dz) && with_grouped_shape(rows, dy, o, z, 3, [&](auto per_lane) {
            // The blocks an SM holds (the kernel's bound), in one wave; the dw_partial rows past the grid zeroed.
            int device = 0, sms = 132;
            if (cudaGetDevice(&device) != cudaSuccess ||
                cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
              sms = 132;
            }
            const unsigned g_grid = std::min<unsigned>(grid, static_cast<unsigned>(kGroupedBackwardBlocks * sms));
            gated_rmsnorm_backward_groups_kernel<TY, decltype(per_lane)::value><<<g_grid, block, 0, st>>>(
                d_op, dzp, dw_partial, static_cast<int>(grid), dyp, op, zp, w, rstd, rows);
            ++g_grouped_launches;
          });
          if (grouped) return;
        }
        if constexpr (std::is_same<TY, TZ>::value && sizeof(TY) == 2) {
          int err = -1;  // -1: no staged kernel for these rows
          with_staged_shape(rows.N, rows.D, vec_ok, [&](auto runs, auto vec) {
            constexpr int kRuns = decltype(runs)::value, kVec = decltype(vec)::value;
            const auto kernel = gated_rmsnorm_backward_staged_kernel<TY, TO, kRuns, kVec>;
            const int smem = static_cast<int>(sizeof(StagedRowSlots<TY, TO, kRuns, kVec>));
            err = smem > 48 * 1024 ? allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem) : 0;
            if (err != 0) return;
            kernel<<<grid, block, smem, st>>>(d_op, dzp, dw_partial, dyp, op, zp, w, rstd, rows);
            ++g_staged_launches;
          });
          if (err == 0) return;  // launched (a refused opt-in falls back to the register kernels)
        }
        const bool regs = with_register_shape(rows.D, vec_ok, [&](auto runs, auto vec) {
          gated_rmsnorm_backward_regs_kernel<TY, TZ, TO, decltype(runs)::value, decltype(vec)::value>
              <<<grid, block, 0, st>>>(d_op, dzp, dw_partial, dyp, op, zp, w, rstd, rows);
        });
        if (regs) return;
        auto looped = [&](auto per_lane) {
          gated_rmsnorm_backward_kernel<TY, TZ, TO, decltype(per_lane)::value>
              <<<grid, block, 0, st>>>(d_op, dzp, dw_partial, dyp, op, zp, w, rstd, rows);
        };
        using std::integral_constant;
        if (rows.D <= 32) looped(integral_constant<int, 1>{});
        else if (rows.D <= 64) looped(integral_constant<int, 2>{});
        else if (rows.D <= 128) looped(integral_constant<int, 4>{});
        else if (rows.D <= 256) looped(integral_constant<int, 8>{});
        else if (rows.D <= 512) looped(integral_constant<int, 16>{});
        else looped(integral_constant<int, 32>{});
      });
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

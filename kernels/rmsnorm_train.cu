// Fused residual add + RMSNorm, forward and backward. Forward: one block per row, each thread keeps
// its kPer elements of h in registers between the sum of squares and the write of y. Backward: a
// grid-stride loop over rows so each block keeps its dw partial sums in registers and writes them
// once (instead of a read-modify-write of global memory per row).
// kVec: a thread's elements come in runs of kVec adjacent columns, moved as one vector (4 fp32 in
// 16 bytes, 4 bf16 in 8) when C is a multiple of 4 and the rows are aligned; element k of a thread
// is column kVec · (threadIdx.x + (k / kVec) · blockDim.x) + k % kVec. With one element per load
// (kVec = 1) a warp's bf16 access is 64 bytes, and the kernels moved about 2.45 TB/s; with 4 about
// 3.0 (forward) and 2.8 (backward) on an H100 (docs/perf.md, stop 27).
#include <atomic>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "kernels/elem.cuh"
#include "kernels/rmsnorm_narrow.h"
#include "kernels/rmsnorm_train.h"

namespace kernels {

namespace {

// Enough rows in flight to hide each row's two block-wide syncs (8 blocks per SM on an H100); the
// partial dw rows this leaves (≤ 1056 × C fp32) are summed by one small reduction.
constexpr int kMaxBackwardBlocks = 132 * 8;

// Whether add_rmsnorm_forward/backward move kVec = 4 columns per load where they can (a switch for
// measuring; on by default).
bool g_vector_loads = true;

// Whether narrow 16-bit rows without an add take kernels/rmsnorm_narrow.cu's kernels (on by
// default), and how many launches did (the tests' check that they ran).
bool g_narrow_rows = true;
std::atomic<int64_t> g_narrow_launches{0};

// Whether rows of C (x in x_dt, y in y_dt) without an add are the narrow kernels' by dtype and
// width (the pointers' alignment is the launch's to check).
bool narrow_rows(DType x_dt, DType y_dt, int64_t C) {
  return g_narrow_rows && x_dt == y_dt && narrow_norm_shape(x_dt, C);
}

// The column of this thread's element k (see the file comment).
template <int kVec>
__device__ __forceinline__ int64_t column_of(int k) {
  return static_cast<int64_t>(kVec) * (threadIdx.x + static_cast<int64_t>(k / kVec) * blockDim.x) + k % kVec;
}

template <typename TX, typename TY, typename TB, int kPer, int kVec>
__global__ void __launch_bounds__(512) add_norm_forward_kernel(TY* y, TX* h, float* rstd, const TX* x, const TB* b,
                                                               const float* w, int64_t C, float eps, int64_t x_ld) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const TX* xr = x + row * x_ld;
  const TB* br = b ? b + row * C : nullptr;
  TX* hr = h + row * C;
  float v[kPer];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; k += kVec) {
    const int64_t c = column_of<kVec>(k);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[k + e] = 0.f;
    if (c < C) {  // C % kVec == 0: a run is whole or past the row
      load_run<kVec>(xr, c, v + k);
      if (br) {
        float bv[kVec];
        load_run<kVec>(br, c, bv);
        // The stored residual is rounded to x's dtype; normalise exactly what is stored.
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[k + e] = to_f32(from_f32<TX>(v[k + e] + bv[e]));
        store_run<kVec>(hr, c, v + k);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) ss += v[k + e] * v[k + e];
    }
  }
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  TY* yr = y + row * C;
#pragma unroll
  for (int k = 0; k < kPer; k += kVec) {
    const int64_t c = column_of<kVec>(k);
    if (c < C) {
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = v[k + e] * r * (w ? w[c + e] : 1.f);
      store_run<kVec>(yr, c, out);
    }
  }
}

// The sums of a and of b over the block, one reduction for both; every thread gets them.
// `scratch` holds 64 floats; blockDim.x is a multiple of 32.
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  a = lane < n_warps ? scratch[lane] : 0.f;
  b = lane < n_warps ? scratch[32 + lane] : 0.f;
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  return make_float2(a, b);
}

// Two rows per iteration (one for the widest rows, whose registers would spill): their loads are in
// flight together and they share one block reduction. One row at a time, each block waited on a
// memory round trip and two barriers per row, and the kernel ran at under half the memory bandwidth.
template <typename TX, typename TY, typename TB, int kPer, int kVec>
__global__ void __launch_bounds__(512)
    add_norm_backward_kernel(TX* dx, TB* db, float* dw_partial, const TY* dy, const TX* dh, const TX* h, const float* w,
                             const float* rstd, int64_t N, int64_t C, int64_t h_ld) {
  constexpr int kRows = kPer <= 8 ? 2 : 1;
  __shared__ float scratch[64];
  float dw_acc[kPer];
  float wv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t c = column_of<kVec>(k);
    dw_acc[k] = 0.f;
    wv[k] = (w && c < C) ? w[c] : 1.f;
  }
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows; row0 < N; row0 += static_cast<int64_t>(gridDim.x) * kRows) {
    float r[kRows], hh[kRows][kPer], g[kRows][kPer], dhv[kRows][kPer], dot[kRows];
    // Every load of both rows first (dh too: it is only added at the end).
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      const int64_t row = row0 + q;
      const bool valid = row < N;
      r[q] = valid ? rstd[row] : 0.f;
      dot[q] = 0.f;  // Σ g · ĥ
#pragma unroll
      for (int k = 0; k < kPer; k += kVec) {
        const int64_t c = column_of<kVec>(k);
#pragma unroll
        for (int e = 0; e < kVec; ++e) hh[q][k + e] = g[q][k + e] = dhv[q][k + e] = 0.f;
        if (valid && c < C) {
          load_run<kVec>(h + row * h_ld, c, hh[q] + k);
          load_run<kVec>(dy + row * C, c, g[q] + k);
          if (dh) load_run<kVec>(dh + row * C, c, dhv[q] + k);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        hh[q][k] *= r[q];
        dw_acc[k] += g[q][k] * hh[q][k];
        g[q][k] *= wv[k];
        dot[q] += g[q][k] * hh[q][k];
      }
    }
    const float2 sums = block_sum2(dot[0], kRows > 1 ? dot[kRows - 1] : 0.f, scratch);
    const float mean_dot[2] = {sums.x / static_cast<float>(C), sums.y / static_cast<float>(C)};
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      const int64_t row = row0 + q;
      if (row >= N) break;
#pragma unroll
      for (int k = 0; k < kPer; k += kVec) {
        const int64_t c = column_of<kVec>(k);
        if (c < C) {
          float out[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) out[e] = r[q] * (g[q][k + e] - hh[q][k + e] * mean_dot[q]) + dhv[q][k + e];
          store_run<kVec>(dx + row * C, c, out);
          if (db) store_run<kVec>(db + row * C, c, out);
        }
      }
    }
  }
  if (w) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t c = column_of<kVec>(k);
      if (c < C) dw_partial[static_cast<int64_t>(blockIdx.x) * C + c] = dw_acc[k];
    }
  }
}

// Threads per block and elements per thread for a row of C: the fewest registers that cover C.
struct RowShape {
  int threads, per;
};
bool row_shape(int64_t C, RowShape& s) {
  if (C <= 256 * 4) s = {256, 4};
  else if (C <= 256 * 8) s = {256, 8};
  else if (C <= 256 * 16) s = {256, 16};
  else if (C <= 512 * 16) s = {512, 16};
  else return false;  // wider rows: the ATen reference (1024 threads × 16 would run out of registers)
  // No idle warps: just enough threads for `per` values each (C = 768 -> 192 threads).
  s.threads = static_cast<int>(((C + s.per - 1) / s.per + 31) / 32 * 32);
  return true;
}

template <typename F>
void with_per(int per, F&& f) {
  if (per == 4) f(std::integral_constant<int, 4>{});
  else if (per == 8) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 16>{});
}

// f(integral_constant<4>) when rows of C move in 4-column vectors: C % 4 == 0 (and a strided
// input's row stride ld), and every pointer aligned to 4 of its elements (bytes_per_4: 16 for fp32,
// 8 for 16-bit types); else f(<1>).
template <typename F>
void with_vec(int64_t C, std::initializer_list<std::pair<const void*, int>> ptrs, F&& f, int64_t ld = 0) {
  bool vec = g_vector_loads && C % 4 == 0 && ld % 4 == 0;
  for (const auto& [p, bytes_per_4] : ptrs) vec = vec && aligned_to(bytes_per_4, p);
  if (vec) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 1>{});
}

// Calls f(TX{}, TY{}, TB{}) for the supported dtype combinations; returns false for the others.
template <typename F>
bool dispatch_combo(DType x, DType y, DType b, F&& f) {
  using bf = __nv_bfloat16;
  using hf = __half;
  constexpr DType F32 = DType::F32, BF16 = DType::BF16, F16 = DType::F16;
  if (x == F32) {
    if (y == F32 && b == F32) f(float{}, float{}, float{});
    else if (y == BF16 && b == BF16) f(float{}, bf{}, bf{});
    else if (y == BF16 && b == F32) f(float{}, bf{}, float{});
    else if (y == F32 && b == BF16) f(float{}, float{}, bf{});
    else if (y == F16 && b == F16) f(float{}, hf{}, hf{});
    else if (y == F16 && b == F32) f(float{}, hf{}, float{});
    else if (y == F32 && b == F16) f(float{}, float{}, hf{});
    else return false;
    return true;
  }
  if (x == BF16 && y == BF16 && b == BF16) return f(bf{}, bf{}, bf{}), true;
  if (x == F16 && y == F16 && b == F16) return f(hf{}, hf{}, hf{}), true;
  return false;
}

}  // namespace

void add_rmsnorm_vector_loads(bool on) { g_vector_loads = on; }
void add_rmsnorm_narrow_rows(bool on) { g_narrow_rows = on; }
int64_t add_rmsnorm_narrow_launches() { return g_narrow_launches.load(); }

bool add_rmsnorm_supported(DType x_dt, DType y_dt, DType b_dt, int64_t C) {
  RowShape s;
  return row_shape(C, s) && dispatch_combo(x_dt, y_dt, b_dt, [](auto, auto, auto) {});
}

int add_rmsnorm_forward(void* y, DType y_dt, void* h, float* rstd, const void* x, DType x_dt, const void* b,
                        DType b_dt, const float* w, int64_t N, int64_t C, float eps, void* stream, int64_t x_ld) {
  RowShape s;
  if (x_ld == 0) x_ld = C;
  if (!row_shape(C, s) || x_ld < C || (b != nullptr && x_ld != C)) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0) return 0;
  if (b == nullptr && narrow_rows(x_dt, y_dt, C) && narrow_norm_aligned(x_ld, y, x, nullptr)) {
    ++g_narrow_launches;
    return narrow_norm_forward(y, rstd, x, x_dt, w, N, C, eps, x_ld, stream);
  }
  auto st = static_cast<cudaStream_t>(stream);
  const bool ok = dispatch_combo(x_dt, y_dt, b_dt, [&](auto tx, auto ty, auto tb) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    using TB = decltype(tb);
    with_per(s.per, [&](auto per) {
      with_vec(
          C, {{y, 4 * sizeof(TY)}, {h, 4 * sizeof(TX)}, {x, 4 * sizeof(TX)}, {b, 4 * sizeof(TB)}},
          [&](auto vec) {
            add_norm_forward_kernel<TX, TY, TB, decltype(per)::value, decltype(vec)::value>
                <<<static_cast<unsigned>(N), s.threads, 0, st>>>(static_cast<TY*>(y), static_cast<TX*>(h), rstd,
                                                                 static_cast<const TX*>(x), static_cast<const TB*>(b),
                                                                 w, C, eps, x_ld);
          },
          x_ld);
    });
  });
  if (!ok) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

int rmsnorm_backward_partial_rows(int64_t N, int64_t C, DType x_dt, DType y_dt, bool has_b) {
  if (!has_b && narrow_rows(x_dt, y_dt, C)) return narrow_norm_backward_blocks(N);
  return static_cast<int>(N < kMaxBackwardBlocks ? (N > 0 ? N : 1) : kMaxBackwardBlocks);
}

int add_rmsnorm_backward(void* dx, void* db, float* dw_partial, const void* dy, const void* dh, const void* h,
                         DType x_dt, DType y_dt, DType b_dt, const float* w, const float* rstd, int64_t N, int64_t C,
                         int partial_rows, void* stream, int64_t h_ld) {
  RowShape s;
  if (h_ld == 0) h_ld = C;
  if (!row_shape(C, s) || h_ld < C || partial_rows < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (N == 0) return 0;
  // The narrow kernel writes narrow_norm_backward_blocks(N) rows of dw_partial: it runs only where
  // the caller sized dw_partial for it (else the block kernel takes the rows it was given).
  if (db == nullptr && dh == nullptr && narrow_rows(x_dt, y_dt, C) && narrow_norm_aligned(h_ld, dx, dy, h) &&
      partial_rows == narrow_norm_backward_blocks(N)) {
    ++g_narrow_launches;
    return narrow_norm_backward(dx, dw_partial, dy, h, x_dt, w, rstd, N, C, h_ld, stream);
  }
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(partial_rows);
  const bool ok = dispatch_combo(x_dt, y_dt, b_dt, [&](auto tx, auto ty, auto tb) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    using TB = decltype(tb);
    with_per(s.per, [&](auto per) {
      with_vec(C,
               {{dx, 4 * sizeof(TX)}, {db, 4 * sizeof(TB)}, {dy, 4 * sizeof(TY)}, {dh, 4 * sizeof(TX)},
                {h, 4 * sizeof(TX)}},
               [&](auto vec) {
                 add_norm_backward_kernel<TX, TY, TB, decltype(per)::value, decltype(vec)::value>
                     <<<blocks, s.threads, 0, st>>>(static_cast<TX*>(dx), static_cast<TB*>(db), dw_partial,
                                                    static_cast<const TY*>(dy), static_cast<const TX*>(dh),
                                                    static_cast<const TX*>(h), w, rstd, N, C, h_ld);
               },
               h_ld);
    });
  });
  if (!ok) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

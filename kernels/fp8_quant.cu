// FP8 quantisation. amax: a grid-stride max of |x| (16-byte loads), one atomicMax per block on the
// float's bits (non-negative floats order like their bit patterns, and a NaN's bits exceed +inf's,
// so a NaN wins and is reported). quantise: 64 × 64 tiles, 8 elements per thread; each element is
// divided by the scale exactly as the reference does (x / scale in fp32, then a saturating
// round-to-nearest cast), written to q and kept in shared memory, from which the transposed tile
// goes out in coalesced 8-byte pieces. Delayed scaling runs the quantising kernel alone: its
// threads also take the max of |x| they read, and the grid's last block files it in the record.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/elem.cuh"
#include "kernels/fp8_quant.h"

namespace kernels {

namespace {

constexpr int kTile = 64;      // a block quantises a 64 × 64 tile of x
constexpr int kVec = 8;        // x elements per thread and load (16 bytes of bf16, two loads of fp32)
constexpr int kThreads = 256;  // 8 threads per 64-wide row: 32 rows per pass, two passes per tile
constexpr int kBlocksPerSm = 8;  // quantising blocks per SM (2048 threads), each walking tiles

template <typename T>
__device__ __forceinline__ float amax_step(float m, float v) {
  v = fabsf(v);
  // fmaxf would drop a NaN; keep it so the caller sees a non-finite amax.
  return (v > m || v != v) ? v : m;
}

template <typename T>
__global__ void amax_kernel(float* amax, const T* x, int64_t rows, int64_t cols, int64_t ld, bool vec) {
  __shared__ float scratch[32];
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (vec) {  // contiguous and aligned: kVec elements per load
    const int64_t n = rows * cols / kVec;
    for (int64_t i = first; i < n; i += stride) {
      Vec<T, kVec> v;
      v.load(x + i * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) m = amax_step<T>(m, v.get(e));
    }
  } else {
    const int64_t n = rows * cols;
    for (int64_t i = first; i < n; i += stride) m = amax_step<T>(m, to_f32(x[(i / cols) * ld + i % cols]));
  }
  for (int off = 16; off > 0; off >>= 1) m = amax_step<T>(m, __shfl_xor_sync(0xffffffffu, m, off));
  // One atomic per block: thousands of warps hitting one address serialise in L2.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) m = amax_step<T>(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
  }
}

__device__ __forceinline__ unsigned char to_fp8(float v, bool e5m2) {
  return static_cast<unsigned char>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3));
}

// Where a quantize_kernel launch takes its scale from, and where it files the amax.
struct ScaleSource {
  const float* amax = nullptr;  // the current amax (computed before), or nullptr: delayed, from the history
  float* record = nullptr;      // the role's record (delayed scaling, fp8_quant.h), or nullptr
  float scale_per_amax = 0.f;   // delayed: margin / fmax
};

// Block-wide max of |x| with amax_step's NaN rule; the result is valid in thread 0.
__device__ float block_amax(float m) {
  __shared__ float per_warp[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) m = amax_step<float>(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kThreads / 32; ++w) m = amax_step<float>(m, per_warp[w]);
  return m;
}

// Delayed scaling's bookkeeping after a block's quantisation: the block's amax goes into the
// record's pending word, and the last block of the grid to finish (when every other block has read
// the history) files the pending amax as the newest history entry and clears the pending words.
__device__ void file_amax(const ScaleSource& src, float m, float scale, float fmax, unsigned long long* saturations) {
  __shared__ bool last;
  unsigned int* words = reinterpret_cast<unsigned int*>(src.record);
  const bool delayed = src.amax == nullptr;
  m = block_amax(delayed ? m : 0.f);
  if (threadIdx.x == 0) {
    if (delayed) atomicMax(&words[kFp8History], __float_as_uint(m));
    __threadfence();
    last = atomicAdd(&words[kFp8History + 1], 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  __threadfence();
  const float amax = __uint_as_float(atomicOr(&words[kFp8History], 0u));
  // A first quantisation's scale is its own amax: only a non-finite one is a saturation there.
  if (!isfinite(amax) || (delayed && amax / scale > fmax)) atomicAdd(saturations, 1ull);
  if (isfinite(amax)) {
    for (int i = kFp8History - 1; i > 0; --i) src.record[i] = src.record[i - 1];
    src.record[0] = amax;
  }
  words[kFp8History] = 0u;
  words[kFp8History + 1] = 0u;
}

// Thread t of the block covers tile row (t / 8) + 32·pass, columns (t % 8)·kVec .. +kVec.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(unsigned char* q, unsigned char* qt, float* scale_out, unsigned long long* saturations,
                    ScaleSource src, const T* x, int64_t rows, int64_t cols, int64_t ld, float fmax, bool e5m2,
                    bool vec) {
  __shared__ __align__(16) unsigned char tile[kTile][kTile + 8];
  const bool delayed = src.amax == nullptr;
  float scale;
  if (delayed) {
    float h = 0.f;
#pragma unroll
    for (int i = 0; i < kFp8History; ++i) h = fmaxf(h, src.record[i]);
    scale = h > 0.f ? h * src.scale_per_amax : 1.f;
  } else {
    const float amax = *src.amax;
    // The reference's arithmetic: ATen divides by a scalar as a multiplication by its fp32 reciprocal.
    const float inv_fmax = 1.f / fmax;
    scale = amax > 0.f ? amax * inv_fmax : 1.f;  // NaN amax: 1; inf amax: inf, as in the reference
    if (src.record == nullptr && blockIdx.x == 0 && threadIdx.x == 0 && !isfinite(amax))
      atomicAdd(saturations, 1ull);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  const int tc = (threadIdx.x % (kTile / kVec)) * kVec;  // column within the tile
  const int trow = threadIdx.x / (kTile / kVec);           // 0..31
  const int tr = (threadIdx.x % (kTile / kVec)) * kVec;  // transposed pass: row offset within the tile
  const int64_t tiles_x = (cols + kTile - 1) / kTile, tiles = tiles_x * ((rows + kTile - 1) / kTile);
  float m = 0.f;  // delayed scaling: this thread's max |x|
  // A grid of a few blocks per SM walks the tiles, so delayed scaling's per-block atomics on the
  // record's two words stay few (one block per tile: 45k atomics per call on [16384 × 5632]).
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_x) * kTile, c0 = (t % tiles_x) * kTile;
    const bool full_cols = vec && c0 + kTile <= cols;
    for (int k = trow; k < kTile; k += kThreads / (kTile / kVec)) {
      const int64_t r = r0 + k;
      if (r >= rows) break;
      unsigned char b[kVec];
      if (full_cols) {
        Vec<T, kVec> v;
        v.load(x + r * ld + c0 + tc);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float f = v.get(e);
          m = amax_step<T>(m, f);
          b[e] = to_fp8(f / scale, e5m2);
        }
        // 8 bytes of q in one store (q rows are 16-byte aligned when vec is set).
        uint2 packed;
        memcpy(&packed, b, sizeof packed);
        *reinterpret_cast<uint2*>(q + r * cols + c0 + tc) = packed;
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int64_t c = c0 + tc + e;
          b[e] = 0;
          if (c < cols) {
            const float f = to_f32(x[r * ld + c]);
            m = amax_step<T>(m, f);
            b[e] = to_fp8(f / scale, e5m2);
            q[r * cols + c] = b[e];
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) tile[k][tc + e] = b[e];
    }
    if (qt != nullptr) {
      __syncthreads();
      // qᵀ row c0 + k (column k of the tile) holds rows r0.. of x: 8 threads × 8 bytes per row.
      const bool full_rows = vec && r0 + kTile <= rows;
      for (int k = trow; k < kTile; k += kThreads / (kTile / kVec)) {
        const int64_t cc = c0 + k;
        if (cc >= cols) break;
        unsigned char b[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) b[e] = tile[tr + e][k];
        if (full_rows) {
          uint2 packed;
          memcpy(&packed, b, sizeof packed);
          *reinterpret_cast<uint2*>(qt + cc * rows + r0 + tr) = packed;
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            if (r0 + tr + e < rows) qt[cc * rows + r0 + tr + e] = b[e];
        }
      }
    }
    __syncthreads();  // the next tile overwrites `tile`
  }
  if (src.record != nullptr) file_amax(src, m, scale, fmax, saturations);
}

}  // namespace

namespace {

// Both entry points: the amax pass when `amax_out` is set (the scale from this x), then the
// quantising pass with the scale `src` names.
int launch_quantize(void* q, void* qt, float* scale, float* amax_out, ScaleSource src,
                    unsigned long long* saturations, const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld,
                    bool e5m2, cudaStream_t st) {
  const float fmax = e5m2 ? 57344.f : 448.f;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return static_cast<int>(cudaGetLastError());
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    // Vector paths: rows of whole 16-byte x loads and 8-byte q/qᵀ stores.
    const bool vec = cols % kVec == 0 && ld % kVec == 0 && rows % kVec == 0 &&
                     aligned_to(static_cast<int>(sizeof(T)) * kVec, x) && aligned_to(16, q, qt);
    if (amax_out != nullptr) {
      const bool flat = vec && ld == cols;
      const int64_t n = rows * cols / (flat ? kVec : 1);
      const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 8);
      amax_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, st>>>(amax_out, static_cast<const T*>(x), rows, cols,
                                                                   ld, flat);
    }
    const int64_t tiles = ((cols + kTile - 1) / kTile) * ((rows + kTile - 1) / kTile);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, static_cast<int64_t>(sms) * kBlocksPerSm));
    quantize_kernel<T><<<grid, kThreads, 0, st>>>(static_cast<unsigned char*>(q), static_cast<unsigned char*>(qt),
                                                  scale, saturations, src, static_cast<const T*>(x), rows, cols, ld,
                                                  fmax, e5m2, vec);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int fp8_quantize(void* q, void* qt, float* scale, float* amax_scratch, unsigned long long* saturations,
                 const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(amax_scratch, 0, sizeof(float), st);
  if (err != cudaSuccess) return static_cast<int>(err);
  ScaleSource src;
  src.amax = amax_scratch;
  return launch_quantize(q, qt, scale, amax_scratch, src, saturations, x, dt, rows, cols, ld, e5m2, st);
}

int fp8_quantize_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                         const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2,
                         float scale_per_amax, bool from_current, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  ScaleSource src;
  src.record = record;
  src.scale_per_amax = scale_per_amax;
  // The first quantisation's amax pass writes the pending word (0 between calls), which is also
  // where the quantising kernel files it from.
  float* pending = record + kFp8History;
  if (from_current) src.amax = pending;
  return launch_quantize(q, qt, scale, from_current ? pending : nullptr, src, saturations, x, dt, rows, cols, ld,
                         e5m2, static_cast<cudaStream_t>(stream));
}

}  // namespace kernels

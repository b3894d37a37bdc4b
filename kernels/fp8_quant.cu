// FP8 quantisation. amax: a grid-stride max of |x| (16-byte loads), one atomicMax per block on the
// float's bits (non-negative floats order like their bit patterns, and a NaN's bits exceed +inf's,
// so a NaN wins and is reported). quantise: 64 × 64 tiles, 8 elements per thread and row, both rows
// of a thread loaded before either is converted; each element is divided by the scale exactly as
// the reference does (x / scale in fp32, then a saturating round-to-nearest cast), written to q and
// kept in shared memory, from which the transposed tile goes out in 4 × 4 byte blocks.
// Delayed scaling runs the quantising kernel alone: its threads also take the max of |x| they
// read, and the grid's last block files it in the record.
// The kernel was bound by instruction issue (ncu, docs/perf.md stop 66: 32 instructions an element,
// 37% of DRAM bandwidth): per element it now divides by the scale through the scale's reciprocal
// with one correcting FMA (ReciprocalDivide: the same fp32 quotient as x / scale), converts values
// two at a time, and takes |x|'s max on its bits.
//
// What is quantised comes from a source (kernels/fp8_quant_sources.cuh): a plain tensor, blocks of
// one operand read in place, or SwiGLU's activation or gradient computed on the way in (so neither
// is ever written in bf16).
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/elem.cuh"
#include "kernels/fp8_quant.h"
#include "kernels/fp8_quant_sources.cuh"

namespace kernels {

namespace {

using fp8_sources::ColsSource;
using fp8_sources::kVec;
using fp8_sources::PlainSource;
using fp8_sources::RowsSource;
using fp8_sources::SwigluGradSource;
using fp8_sources::SwigluSource;

constexpr int kTile = 64;                                // a block quantises 64 × 64 tiles of the source
constexpr int kThreads = 256;                            // 8 threads per 64-wide row
constexpr int kRowsPerPass = kThreads / (kTile / kVec);  // 32
constexpr int kPasses = kTile / kRowsPerPass;            // 2 rows per thread and tile
constexpr int kTileWords = kTile / 4 + 1;                // a tile row in shared memory, padded

__device__ __forceinline__ float amax_step(float m, float v) {
  v = fabsf(v);
  // fmaxf would drop a NaN; keep it so the caller sees a non-finite amax.
  return (v > m || v != v) ? v : m;
}

template <typename Src>
__global__ void amax_kernel(float* amax, Src src, int64_t rows, int64_t cols, bool vec) {
  __shared__ float scratch[32];
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (vec) {  // kVec columns per load
    const int64_t per_row = cols / kVec, n = rows * per_row;
    for (int64_t i = first; i < n; i += stride) {
      float v[Src::kOut][kVec];
      src.load(i / per_row, (i % per_row) * kVec, v);
#pragma unroll
      for (int o = 0; o < Src::kOut; ++o)
#pragma unroll
        for (int e = 0; e < kVec; ++e) m = amax_step(m, v[o][e]);
    }
  } else {
    const int64_t n = rows * cols;
    for (int64_t i = first; i < n; i += stride) {
      float v[Src::kOut];
      src.at(i / cols, i % cols, v);
#pragma unroll
      for (int o = 0; o < Src::kOut; ++o) m = amax_step(m, v[o]);
    }
  }
  for (int off = 16; off > 0; off >>= 1) m = amax_step(m, __shfl_xor_sync(0xffffffffu, m, off));
  // One atomic per block: thousands of warps hitting one address serialise in L2.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) m = amax_step(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
  }
}

// Two values in one conversion: a in the low byte, b in the high one.
__device__ __forceinline__ unsigned short to_fp8x2(float a, float b, bool e5m2) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// x / s as fp32 division rounds it, the reference's arithmetic.
struct ExactDivide {
  float s;
  __device__ __forceinline__ float operator()(float x) const { return x / s; }
};

// x / s through y = 1 / s (correctly rounded, once per thread): q = x·y, then one correction
// q + (x − q·s)·y, whose residual the FMA computes exactly. With y correctly rounded and q within an
// ulp of x / s this is x / s correctly rounded (Markstein's theorem), so the same bits as
// ExactDivide, where no step leaves fp32's normal range: reciprocal_divides() keeps s within
// [2^-80, 2^100], so a quotient fp8 can tell from zero (at least 2^-17) has a normal residual; an
// infinite or NaN q (x infinite or NaN, or the quotient past fp32's range) is returned as it is.
// (A check against fp32 division over 2·10^8 random pairs, docs/perf.md stop 66: no difference.)
struct ReciprocalDivide {
  float s, y;
  __device__ __forceinline__ float operator()(float x) const {
    const float q = x * y;
    const float q1 = fmaf(fmaf(-q, s, x), y, q);
    return fabsf(q) <= 3.402823466e38f ? q1 : q;
  }
};

__device__ __forceinline__ bool reciprocal_divides(float s) { return s >= 0x1p-80f && s <= 0x1p100f; }

// The running max of |v| kept as bits: non-negative floats order like their bit patterns, and a
// NaN's (sign cleared) exceed +inf's, so a NaN wins as in amax_step.
__device__ __forceinline__ unsigned int amax_bits_step(unsigned int m, float v) {
  return max(m, __float_as_uint(v) & 0x7fffffffu);
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
  for (int off = 16; off > 0; off >>= 1) m = amax_step(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kThreads / 32; ++w) m = amax_step(m, per_warp[w]);
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

__device__ float scale_of(const ScaleSource& src, float fmax, unsigned long long* saturations) {
  if (src.amax == nullptr) {  // delayed
    float h = 0.f;
#pragma unroll
    for (int i = 0; i < kFp8History; ++i) h = fmaxf(h, src.record[i]);
    return h > 0.f ? h * src.scale_per_amax : 1.f;
  }
  const float amax = *src.amax;
  // The reference's arithmetic: ATen divides by a scalar as a multiplication by its fp32 reciprocal.
  const float inv_fmax = 1.f / fmax;
  if (src.record == nullptr && blockIdx.x == 0 && threadIdx.x == 0 && !isfinite(amax)) atomicAdd(saturations, 1ull);
  return amax > 0.f ? amax * inv_fmax : 1.f;  // NaN amax: 1; inf amax: inf, as in the reference
}

// A grid of as many blocks as fit on the GPU at once walks the tiles (so delayed scaling's
// per-block atomics on the record stay few, and no partial second wave trails). Thread t covers
// tile rows t / 8 + 32·p (p < kPasses) and columns (t % 8)·kVec .. +kVec.
template <typename Src>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(unsigned char* q, unsigned char* qt, float* scale_out, unsigned long long* saturations,
                    ScaleSource scale_src, Src src, int64_t rows, int64_t cols, float fmax, bool e5m2, bool vec) {
  constexpr int kOut = Src::kOut;
  // Rows of 17 words: the transposed pass's word reads then hit 32 distinct banks per warp.
  __shared__ unsigned int tile[kOut][kTile][kTileWords];
  const float scale = scale_of(scale_src, fmax, saturations);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  const int64_t q_cols = kOut * cols;
  const int tc = (threadIdx.x % (kTile / kVec)) * kVec;  // column within the tile
  const int trow = threadIdx.x / (kTile / kVec);         // 0..31
  // Transposed pass: thread t moves the 4 × 4 bytes at rows 4·rb.., columns 4·cb.. of the tile.
  const int rb = threadIdx.x % 8 + 8 * (threadIdx.x / 128), cb = (threadIdx.x / 8) % 16;
  const int64_t tiles_x = (cols + kTile - 1) / kTile, tiles = tiles_x * ((rows + kTile - 1) / kTile);
  unsigned int m_bits = 0;  // delayed scaling: this thread's max |value| (amax_bits_step)
  // The tiles, dividing by the scale as `divide` does (the choice is the same for the whole grid).
  auto quantize_tiles = [&](auto divide) {
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int64_t r0 = (t / tiles_x) * kTile, c0 = (t % tiles_x) * kTile;
      const bool full_cols = vec && c0 + kTile <= cols;
      // Both rows' loads first, so each thread has two in flight.
      float v[kPasses][kOut][kVec];
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int64_t r = r0 + trow + p * kRowsPerPass;
        if (r < rows && full_cols) {
          src.load(r, c0 + tc, v[p]);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            float one[kOut] = {};
            const bool in = r < rows && c0 + tc + e < cols;
            if (in) src.at(r, c0 + tc + e, one);
#pragma unroll
            for (int o = 0; o < kOut; ++o) v[p][o][e] = in ? one[o] : 0.f;
          }
        }
      }
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int k = trow + p * kRowsPerPass;
        const int64_t r = r0 + k;
#pragma unroll
        for (int o = 0; o < kOut; ++o) {
          // Element e in byte e % 4 of words[e / 4].
          unsigned int words[2];
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            const float* x = v[p][o] + 4 * w;
#pragma unroll
            for (int e = 0; e < 4; ++e) m_bits = amax_bits_step(m_bits, x[e]);  // positions outside x hold 0
            const unsigned int lo = to_fp8x2(divide(x[0]), divide(x[1]), e5m2);
            const unsigned int hi = to_fp8x2(divide(x[2]), divide(x[3]), e5m2);
            words[w] = lo | (hi << 16);
          }
          unsigned char* q_row = q + r * q_cols + o * cols + c0 + tc;
          if (r < rows && full_cols) {
            // 8 bytes of q in one store (q rows are 8-byte aligned when vec is set).
            *reinterpret_cast<uint2*>(q_row) = make_uint2(words[0], words[1]);
          } else if (r < rows) {
#pragma unroll
            for (int e = 0; e < kVec; ++e)
              if (c0 + tc + e < cols) q_row[e] = static_cast<unsigned char>(words[e / 4] >> (8 * (e % 4)));
          }
          tile[o][k][tc / 4] = words[0];
          tile[o][k][tc / 4 + 1] = words[1];
        }
      }
      if (qt != nullptr) {
        __syncthreads();
        // qᵀ rows o·cols + c0 + 4·cb + j (j < 4) take the tile's column 4·cb + j at rows 4·rb..+3: four
        // words read, transposed as 4 × 4 bytes in registers, written as four 4-byte pieces.
        const bool full_rows = vec && r0 + kTile <= rows;
#pragma unroll
        for (int o = 0; o < kOut; ++o) {
          unsigned int w[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) w[i] = tile[o][4 * rb + i][cb];
          const unsigned int lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[2], w[3], 0x5140);
          const unsigned int hi01 = __byte_perm(w[0], w[1], 0x7362), hi23 = __byte_perm(w[2], w[3], 0x7362);
          const unsigned int col[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                       __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t cc = c0 + 4 * cb + j;
            if (cc >= cols) break;
            unsigned char* qt_row = qt + (o * cols + cc) * rows + r0 + 4 * rb;
            if (full_rows) {
              *reinterpret_cast<unsigned int*>(qt_row) = col[j];
            } else {
#pragma unroll
              for (int i = 0; i < 4; ++i)
                if (r0 + 4 * rb + i < rows) qt_row[i] = static_cast<unsigned char>(col[j] >> (8 * i));
            }
          }
        }
      }
      __syncthreads();  // the next tile overwrites `tile`
    }
  };
  if (reciprocal_divides(scale)) quantize_tiles(ReciprocalDivide{scale, 1.f / scale});
  else quantize_tiles(ExactDivide{scale});
  if (scale_src.record != nullptr) file_amax(scale_src, __uint_as_float(m_bits), scale, fmax, saturations);
}

// Blocks of quantize_kernel<Src> resident per SM, asked once per source type.
template <typename Src>
int resident_blocks_per_sm() {
  static const int n = [] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quantize_kernel<Src>, kThreads, 0) != cudaSuccess)
      blocks = 0;
    return std::max(blocks, 1);
  }();
  return n;
}

// The amax pass when `amax_out` is set (the scale from this source's values), then the quantising
// pass with the scale `scale_src` names. `vec`: whole kVec-element loads and 8-byte q/qᵀ stores.
template <typename Src>
int launch_quantize(void* q, void* qt, float* scale, float* amax_out, ScaleSource scale_src,
                    unsigned long long* saturations, const Src& src, int64_t rows, int64_t cols, bool vec, bool e5m2,
                    cudaStream_t st) {
  const float fmax = e5m2 ? 57344.f : 448.f;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return static_cast<int>(cudaGetLastError());
  if (amax_out != nullptr) {
    const int64_t n = rows * cols / (vec ? kVec : 1);
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, static_cast<int64_t>(sms) * 8);
    amax_kernel<Src><<<static_cast<unsigned>(blocks), 256, 0, st>>>(amax_out, src, rows, cols, vec);
  }
  const int64_t tiles = ((cols + kTile - 1) / kTile) * ((rows + kTile - 1) / kTile);
  const int64_t resident = static_cast<int64_t>(sms) * resident_blocks_per_sm<Src>();
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, resident));
  quantize_kernel<Src><<<grid, kThreads, 0, st>>>(static_cast<unsigned char*>(q), static_cast<unsigned char*>(qt),
                                                  scale, saturations, scale_src, src, rows, cols, fmax, e5m2, vec);
  return static_cast<int>(cudaGetLastError());
}

// Delayed scaling on `record`: the first quantisation's amax pass writes the pending word (0
// between calls), which is also where the quantising kernel files it from.
template <typename Src>
int launch_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations, const Src& src,
                   int64_t rows, int64_t cols, bool vec, bool e5m2, float scale_per_amax, bool from_current,
                   cudaStream_t st) {
  ScaleSource scale_src;
  scale_src.record = record;
  scale_src.scale_per_amax = scale_per_amax;
  float* pending = record + kFp8History;
  if (from_current) scale_src.amax = pending;
  return launch_quantize(q, qt, scale, from_current ? pending : nullptr, scale_src, saturations, src, rows, cols, vec,
                         e5m2, st);
}

}  // namespace

int fp8_quantize(void* q, void* qt, float* scale, float* amax_scratch, unsigned long long* saturations,
                 const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(amax_scratch, 0, sizeof(float), st);
  if (err != cudaSuccess) return static_cast<int>(err);
  ScaleSource scale_src;
  scale_src.amax = amax_scratch;
  int status = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = cols % kVec == 0 && ld % kVec == 0 && rows % kVec == 0 &&
                     aligned_to(static_cast<int>(sizeof(T)) * kVec, x) && aligned_to(8, q, qt);
    status = launch_quantize(q, qt, scale, amax_scratch, scale_src, saturations,
                             PlainSource<T>{static_cast<const T*>(x), ld}, rows, cols, vec, e5m2, st);
  });
  return status;
}

int fp8_quantize_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                         const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2,
                         float scale_per_amax, bool from_current, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  int status = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = cols % kVec == 0 && ld % kVec == 0 && rows % kVec == 0 &&
                     aligned_to(static_cast<int>(sizeof(T)) * kVec, x) && aligned_to(8, q, qt);
    status = launch_delayed(q, qt, scale, record, saturations, PlainSource<T>{static_cast<const T*>(x), ld}, rows, cols,
                            vec, e5m2, scale_per_amax, from_current, static_cast<cudaStream_t>(stream));
  });
  return status;
}

int fp8_quantize_rows_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                              const void* const* parts, const int64_t* part_rows, int n_parts, DType dt, int64_t cols,
                              bool e5m2, float scale_per_amax, bool from_current, void* stream) {
  if (n_parts < 1 || n_parts > kFp8MaxParts) return static_cast<int>(cudaErrorInvalidValue);
  int64_t rows = 0;
  for (int i = 0; i < n_parts; ++i) rows += part_rows[i];
  if (rows == 0 || cols == 0) return 0;
  int status = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    RowsSource<T> src{};
    bool aligned = aligned_to(8, q, qt);
    int64_t end = 0;
    for (int i = 0; i < n_parts; ++i) {
      src.part[i] = static_cast<const T*>(parts[i]);
      src.end[i] = end += part_rows[i];
      aligned = aligned && aligned_to(static_cast<int>(sizeof(T)) * kVec, parts[i]);
    }
    src.n = n_parts;
    src.cols = cols;
    // A vector load never straddles two parts: cols is a multiple of kVec.
    const bool vec = cols % kVec == 0 && rows % kVec == 0 && aligned;
    status = launch_delayed(q, qt, scale, record, saturations, src, rows, cols, vec, e5m2, scale_per_amax,
                            from_current, static_cast<cudaStream_t>(stream));
  });
  return status;
}

int fp8_quantize_cols_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                              const void* const* parts, const int64_t* part_cols, const int64_t* part_ld, int n_parts,
                              DType dt, int64_t rows, bool e5m2, float scale_per_amax, bool from_current,
                              void* stream) {
  if (n_parts < 1 || n_parts > kFp8MaxParts) return static_cast<int>(cudaErrorInvalidValue);
  int64_t cols = 0;
  for (int i = 0; i < n_parts; ++i) cols += part_cols[i];
  if (rows == 0 || cols == 0) return 0;
  int status = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    ColsSource<T> src{};
    // Vector loads need every part's columns and row stride in whole vectors (so none straddles two
    // parts) and aligned parts.
    bool vec = rows % kVec == 0 && aligned_to(8, q, qt);
    int64_t end = 0;
    for (int i = 0; i < n_parts; ++i) {
      src.part[i] = static_cast<const T*>(parts[i]);
      src.ld[i] = part_ld[i];
      src.end[i] = end += part_cols[i];
      vec = vec && part_cols[i] % kVec == 0 && part_ld[i] % kVec == 0 &&
            aligned_to(static_cast<int>(sizeof(T)) * kVec, parts[i]);
    }
    src.n = n_parts;
    status = launch_delayed(q, qt, scale, record, saturations, src, rows, cols, vec, e5m2, scale_per_amax,
                            from_current, static_cast<cudaStream_t>(stream));
  });
  return status;
}

int fp8_quantize_swiglu_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                                const void* gu, DType dt, int64_t rows, int64_t F, int64_t ld, bool e5m2,
                                float scale_per_amax, bool from_current, void* stream) {
  if (rows == 0 || F == 0) return 0;
  int status = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = F % kVec == 0 && ld % kVec == 0 && rows % kVec == 0 &&
                     aligned_to(static_cast<int>(sizeof(T)) * kVec, gu) && aligned_to(8, q, qt);
    status = launch_delayed(q, qt, scale, record, saturations, SwigluSource<T>{static_cast<const T*>(gu), ld, F}, rows,
                            F, vec, e5m2, scale_per_amax, from_current, static_cast<cudaStream_t>(stream));
  });
  return status;
}

int fp8_quantize_swiglu_grad_delayed(void* q, void* qt, float* scale, float* record, unsigned long long* saturations,
                                     const void* gu, const void* dh, DType dt, int64_t rows, int64_t F, int64_t ld,
                                     bool e5m2, float scale_per_amax, bool from_current, void* stream) {
  if (rows == 0 || F == 0) return 0;
  int status = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = F % kVec == 0 && ld % kVec == 0 && rows % kVec == 0 &&
                     aligned_to(static_cast<int>(sizeof(T)) * kVec, gu, dh) && aligned_to(8, q, qt);
    status = launch_delayed(q, qt, scale, record, saturations,
                            SwigluGradSource<T>{static_cast<const T*>(gu), static_cast<const T*>(dh), ld, F}, rows, F,
                            vec, e5m2, scale_per_amax, from_current, static_cast<cudaStream_t>(stream));
  });
  return status;
}

}  // namespace kernels

// FP8 quantisation. amax: a grid-stride max of |x| merged with atomicMax on the float's bits
// (non-negative floats order like their bit patterns, and a NaN's bits exceed +inf's, so a NaN
// wins and is reported). quantise: 64 × 64 tiles; each element is divided by the scale exactly as
// the reference does (x / scale in fp32, then a saturating round-to-nearest cast), written to q,
// and kept in shared memory so the transposed tile goes out with coalesced rows.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/elem.cuh"
#include "kernels/fp8_quant.h"

namespace kernels {

namespace {

constexpr int kTile = 64;
constexpr int kTileRowsPerPass = 4;  // blockDim = (kTile, kTileRowsPerPass)

template <typename T>
__global__ void amax_kernel(float* amax, const T* x, int64_t rows, int64_t cols, int64_t ld) {
  float m = 0.f;
  const int64_t n = rows * cols;
  const bool dense = ld == cols;  // the usual case: no per-element row arithmetic
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = fabsf(to_f32(x[dense ? i : (i / cols) * ld + i % cols]));
    // fmaxf would drop a NaN; keep it so the caller sees a non-finite amax.
    m = (v > m || v != v) ? v : m;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, m, off);
    m = (o > m || o != o) ? o : m;
  }
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}

__device__ __forceinline__ unsigned char to_fp8(float v, bool e5m2) {
  return static_cast<unsigned char>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3));
}

template <typename T>
__global__ void quantize_kernel(unsigned char* q, unsigned char* qt, float* scale_out, unsigned long long* saturations,
                                const float* amax_p, const T* x, int64_t rows, int64_t cols, int64_t ld, float fmax,
                                bool e5m2) {
  __shared__ unsigned char tile[kTile][kTile + 4];
  const float amax = *amax_p;
  const float scale = amax > 0.f ? amax / fmax : 1.f;  // NaN/inf amax: a NaN/inf scale, as in the reference
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
    *scale_out = scale;
    if (!isfinite(amax)) atomicAdd(saturations, 1ull);
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t c = c0 + threadIdx.x;
  for (int k = threadIdx.y; k < kTile; k += kTileRowsPerPass) {
    const int64_t r = r0 + k;
    if (r < rows && c < cols) {
      const unsigned char b = to_fp8(to_f32(x[r * ld + c]) / scale, e5m2);
      q[r * cols + c] = b;
      tile[k][threadIdx.x] = b;
    }
  }
  if (qt == nullptr) return;
  __syncthreads();
  // Row k of this qᵀ tile is column c0 + k of x; its columns are rows r0 + threadIdx.x.
  const int64_t r = r0 + threadIdx.x;
  for (int k = threadIdx.y; k < kTile; k += kTileRowsPerPass) {
    const int64_t cc = c0 + k;
    if (cc < cols && r < rows) qt[cc * rows + r] = tile[threadIdx.x][k];
  }
}

}  // namespace

int fp8_quantize(void* q, void* qt, float* scale, float* amax_scratch, unsigned long long* saturations,
                 const void* x, DType dt, int64_t rows, int64_t cols, int64_t ld, bool e5m2, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(amax_scratch, 0, sizeof(float), st);
  if (err != cudaSuccess) return static_cast<int>(err);
  const float fmax = e5m2 ? 57344.f : 448.f;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = rows * cols;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 132 * 16);
    amax_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, st>>>(amax_scratch, static_cast<const T*>(x), rows,
                                                                      cols, ld);
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
    quantize_kernel<T><<<grid, dim3(kTile, kTileRowsPerPass), 0, st>>>(
        static_cast<unsigned char*>(q), static_cast<unsigned char*>(qt), scale, saturations, amax_scratch,
        static_cast<const T*>(x), rows, cols, ld, fmax, e5m2);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

// zero_unnamed_rows_f32 / _16bit: a byte per row marks the named ones; then each warp reads 32 rows' marks at
// once and zeroes only the unnamed rows among them, the whole warp on one row at a time (most warps
// find none and leave after one load). zero_listed_rows_*: a warp a row of the caller's list.
#include <cuda_runtime.h>

#include "kernels/zero_rows.h"

namespace kernels {

namespace {

constexpr int kThreads = 256;

__global__ void mark_named_rows_kernel(uint8_t* named, const int32_t* row_of, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    named[row_of[i]] = 1;
}

// T: float or uint16_t (bf16 bits); zero bits are 0 in both. kVec16: 16-byte stores (D a multiple
// of 16 bytes' elements, x aligned to 16 bytes).
template <typename T, bool kVec16>
__global__ void zero_unnamed_rows_kernel(T* x, int64_t M, int64_t D, const uint8_t* named) {
  constexpr int kPer16 = 16 / static_cast<int>(sizeof(T));
  const int lane = threadIdx.x % 32;
  const int64_t first = (int64_t{blockIdx.x} * (kThreads / 32) + threadIdx.x / 32) * 32;
  if (first >= M) return;
  const bool unnamed = first + lane < M && named[first + lane] == 0;
  unsigned todo = __ballot_sync(0xffffffffu, unnamed);
  while (todo != 0) {
    const int j = __ffs(todo) - 1;
    todo &= todo - 1;
    T* row = x + (first + j) * D;
    if (kVec16) {
      for (int64_t c = int64_t{lane} * kPer16; c < D; c += 32 * kPer16)
        *reinterpret_cast<uint4*>(row + c) = make_uint4(0u, 0u, 0u, 0u);
    } else {
      for (int64_t c = lane; c < D; c += 32) row[c] = T{0};
    }
  }
}

// A warp a listed row, kVec16 as above.
template <typename T, bool kVec16>
__global__ void zero_listed_rows_kernel(T* x, int64_t D, const int32_t* rows, int64_t n) {
  constexpr int kPer16 = 16 / static_cast<int>(sizeof(T));
  const int lane = threadIdx.x % 32;
  const int64_t i = int64_t{blockIdx.x} * (kThreads / 32) + threadIdx.x / 32;
  if (i >= n) return;
  T* row = x + int64_t{rows[i]} * D;
  if (kVec16) {
    for (int64_t c = int64_t{lane} * kPer16; c < D; c += 32 * kPer16)
      *reinterpret_cast<uint4*>(row + c) = make_uint4(0u, 0u, 0u, 0u);
  } else {
    for (int64_t c = lane; c < D; c += 32) row[c] = T{0};
  }
}

template <typename T>
int zero_listed_rows(T* x, int64_t D, const int32_t* rows, int64_t n, void* stream) {
  if (n == 0 || D == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned grid = static_cast<unsigned>((n + kThreads / 32 - 1) / (kThreads / 32));
  const bool vec16 = D % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (vec16) zero_listed_rows_kernel<T, true><<<grid, kThreads, 0, st>>>(x, D, rows, n);
  else zero_listed_rows_kernel<T, false><<<grid, kThreads, 0, st>>>(x, D, rows, n);
  return static_cast<int>(cudaGetLastError());
}

unsigned blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 132 * 16 ? b : 132 * 16);
}

template <typename T>
int zero_unnamed_rows(T* x, int64_t M, int64_t D, const int32_t* row_of, int64_t n, uint8_t* named, void* stream) {
  if (M == 0 || D == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(named, 0, static_cast<size_t>(M), st);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (n > 0) mark_named_rows_kernel<<<blocks_for(n), kThreads, 0, st>>>(named, row_of, n);
  // One warp per 32 rows.
  const unsigned grid = static_cast<unsigned>((M + kThreads - 1) / kThreads);
  const bool vec16 = D % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (vec16) zero_unnamed_rows_kernel<T, true><<<grid, kThreads, 0, st>>>(x, M, D, named);
  else zero_unnamed_rows_kernel<T, false><<<grid, kThreads, 0, st>>>(x, M, D, named);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int zero_unnamed_rows_f32(float* x, int64_t M, int64_t D, const int32_t* row_of, int64_t n, uint8_t* named,
                          void* stream) {
  return zero_unnamed_rows(x, M, D, row_of, n, named, stream);
}

int zero_unnamed_rows_16bit(void* x, int64_t M, int64_t D, const int32_t* row_of, int64_t n, uint8_t* named,
                            void* stream) {
  return zero_unnamed_rows(static_cast<uint16_t*>(x), M, D, row_of, n, named, stream);
}

int zero_listed_rows_f32(float* x, int64_t D, const int32_t* rows, int64_t n, void* stream) {
  return zero_listed_rows(x, D, rows, n, stream);
}

int zero_listed_rows_16bit(void* x, int64_t D, const int32_t* rows, int64_t n, void* stream) {
  return zero_listed_rows(static_cast<uint16_t*>(x), D, rows, n, stream);
}

}  // namespace kernels

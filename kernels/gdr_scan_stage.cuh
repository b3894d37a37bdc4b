// Staging of the chunk-state scan kernels' per-step tiles into shared memory by cp.async, shared by
// the TF32 scan (gdr_scan_mma.cu) and the bf16-product backward (gdr_scan_bf16.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/tf32_mma.cuh"

namespace kernels {

// Copies rows × cols elements (fp32, or bf16 as raw bits) from global memory (row stride ld) into
// shared memory (row length pitch), 16 bytes per copy; cols is a multiple of 16 bytes' elements.
// The block's threads take turns: kThreads of them, or blockDim.x for 0 (a compile-time count, where
// the caller has one, saves the bf16 scan registers).
template <int kThreads = 0, typename T>
__device__ __forceinline__ void stage_rows(T* dst, int pitch, const T* src, int64_t ld, int rows, int cols) {
  constexpr int kV = 16 / static_cast<int>(sizeof(T));
  const int n_pieces = cols / kV;
  auto copy = [&](int p) {
    const int r = p / n_pieces, c = kV * (p % n_pieces);
    cp_async16_zfill(reinterpret_cast<float*>(dst + r * pitch + c), reinterpret_cast<const float*>(src + r * ld + c),
                     true);
  };
  if constexpr (kThreads > 0) {
    for (int p = threadIdx.x; p < rows * n_pieces; p += kThreads) copy(p);
  } else {
    for (int p = threadIdx.x; p < rows * n_pieces; p += blockDim.x) copy(p);
  }
}

}  // namespace kernels

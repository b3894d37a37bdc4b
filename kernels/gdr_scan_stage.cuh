// Staging of the chunk-state scan kernels' per-step tiles into shared memory by cp.async: stage_rows
// for the TF32 scan (gdr_scan_mma.cu), the walks for the bf16-product forms (gdr_scan_bf16.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/tf32_mma.cuh"

namespace kernels {

// Copies rows × cols elements (fp32, or bf16 as raw bits) from global memory (row stride ld) into
// shared memory (row length pitch), 16 bytes per copy; cols is a multiple of 16 bytes' elements.
// The block's threads take turns.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, int pitch, const T* src, int64_t ld, int rows, int cols) {
  constexpr int kV = 16 / static_cast<int>(sizeof(T));
  const int n_pieces = cols / kV;
  auto copy = [&](int p) {
    const int r = p / n_pieces, c = kV * (p % n_pieces);
    cp_async16_zfill(reinterpret_cast<float*>(dst + r * pitch + c), reinterpret_cast<const float*>(src + r * ld + c),
                     true);
  };
  for (int p = threadIdx.x; p < rows * n_pieces; p += blockDim.x) copy(p);
}

// The threads' walk over the 16-byte pieces of a [rows][n · 16 bytes] tile, so that staging the
// tile each step takes no division: piece p = threadIdx.x + k · threads lies in row p / n, piece
// column p % n, and from one of a thread's pieces to the next the row moves by threads / n and the
// column by threads % n (carrying into the row). Worked out on the host for the launch's block
// (a kernel parameter, so it costs no registers); each thread adds its first piece's place. The
// host's `threads` must be the kernel's block size (walk_tile's kThreads).
struct TileWalk {
  int n = 1, total = 0, drow = 0, dcol = 0;
};
inline TileWalk tile_walk(int rows, int pieces_per_row, int threads) {
  return TileWalk{pieces_per_row, rows * pieces_per_row, threads / pieces_per_row, threads % pieces_per_row};
}

// f(row, piece column) for each of this thread's pieces of the tile; row0, col0 its first
// piece's (threadIdx.x / n, threadIdx.x % n).
template <int kThreads, typename F>
__device__ __forceinline__ void walk_tile(const TileWalk& w, int row0, int col0, F&& f) {
  int row = row0, col = col0;
  for (int p = static_cast<int>(threadIdx.x); p < w.total; p += kThreads) {
    f(row, col);
    row += w.drow;
    col += w.dcol;
    if (col >= w.n) {
      col -= w.n;
      ++row;
    }
  }
}

}  // namespace kernels

// The multi-tensor launches (kernels/adamw.cu, kernels/muon_update.cu) cut their tensors into
// chunks of a fixed number of elements, one block a chunk; the launch's table holds each tensor's
// cumulative chunk count, chunk_end[i] for tensors 0..i. A block finds its tensor by a binary search
// over that table. Kernels take the table in their parameter space (__grid_constant__), so reading
// it through this pointer copies nothing to local memory.
#pragma once

#include <cstdint>

namespace kernels {

struct BlockChunk {
  int tensor;     // which of the launch's tensors
  int64_t first;  // the chunk's first element in it
};

__device__ __forceinline__ BlockChunk chunk_of_block(const int* chunk_end, int count, int64_t chunk_elems) {
  const int chunk = blockIdx.x;
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (chunk < chunk_end[mid]) hi = mid;
    else lo = mid + 1;
  }
  return {lo, static_cast<int64_t>(chunk - (lo == 0 ? 0 : chunk_end[lo - 1])) * chunk_elems};
}

}  // namespace kernels

// One block, one thread an expert: its piece count, a block-wide exclusive scan for where its pieces
// start, then its pieces' end rows.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/expert_grad_pieces.h"

namespace kernels {

namespace {

__global__ void expert_grad_pieces_kernel(const int32_t* __restrict__ ends, int E, int32_t piece_rows, int G,
                                          int32_t* __restrict__ piece_ends, int32_t* __restrict__ first,
                                          int32_t* __restrict__ count) {
  __shared__ int32_t scan[kExpertPiecesMaxExperts];
  const int e = threadIdx.x;
  int32_t start = 0, n = 0, c = 0;
  if (e < E) {
    start = e == 0 ? 0 : ends[e - 1];
    n = ends[e] - start;
    c = n > 0 ? (n + piece_rows - 1) / piece_rows : 0;
  }
  scan[e] = c;
  __syncthreads();
  for (int off = 1; off < blockDim.x; off <<= 1) {  // inclusive scan (Hillis–Steele)
    const int32_t v = e >= off ? scan[e - off] : 0;
    __syncthreads();
    scan[e] += v;
    __syncthreads();
  }
  const int32_t f = scan[e] - c, total = scan[blockDim.x - 1];
  if (e < E) {
    first[e] = f;
    count[e] = c;
    for (int32_t j = 0; j < c && f + j < G; ++j) piece_ends[f + j] = start + min((j + 1) * piece_rows, n);
  }
  const int32_t last = ends[E - 1];
  for (int g = total + e; g < G; g += blockDim.x) piece_ends[g] = last;
}

}  // namespace

int expert_grad_pieces(const int32_t* ends, int64_t E, int64_t piece_rows, int64_t G, int32_t* piece_ends,
                       int32_t* first, int32_t* count, void* stream) {
  if (E < 1 || E > kExpertPiecesMaxExperts || piece_rows < 1 || piece_rows > INT32_MAX || G < E ||
      G > INT32_MAX)
    return static_cast<int>(cudaErrorInvalidValue);
  const int threads = static_cast<int>((E + 31) / 32 * 32);
  expert_grad_pieces_kernel<<<1, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      ends, static_cast<int>(E), static_cast<int32_t>(piece_rows), static_cast<int>(G), piece_ends, first, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

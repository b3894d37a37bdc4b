// One grid-stride pass over the concatenated elements: a thread finds its expert (stacked weights)
// and then its block by comparing its element index within the expert with the blocks' cumulative ends (at most 4, by branches so the kernel's parameter
// array is never indexed dynamically, which would copy it to local memory), loads 4 fp32 values
// as one 16-byte vector where every block is aligned to it, and stores 4 rounded values.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/weight_cast.h"

namespace kernels {

namespace {

struct BlockEnds {
  const float* src[WeightBlocks::kMax];
  int64_t end[WeightBlocks::kMax];  // cumulative element counts of one expert; unused blocks repeat its total
};

// Element e (within one expert's [Σ rows_i, C]) of expert x: its block's source element.
__device__ __forceinline__ const float* block_source(const BlockEnds& b, int64_t x, int64_t e) {
  if (e < b.end[0]) return b.src[0] + x * b.end[0] + e;
  if (e < b.end[1]) return b.src[1] + x * (b.end[1] - b.end[0]) + (e - b.end[0]);
  if (e < b.end[2]) return b.src[2] + x * (b.end[2] - b.end[1]) + (e - b.end[1]);
  return b.src[3] + x * (b.end[3] - b.end[2]) + (e - b.end[2]);
}

template <typename T, int V>
__global__ void cast_weight_blocks_kernel(T* out, BlockEnds b, int64_t total) {
  const int64_t runs = total / V, per_expert = b.end[WeightBlocks::kMax - 1];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < runs; r += stride) {
    const int64_t e = r * V;
    float v[V];
    load_run<V>(block_source(b, e / per_expert, e % per_expert), 0, v);
    store_run<V>(out, e, v);
  }
}

}  // namespace

int cast_weight_blocks(void* out, DType out_dt, const WeightBlocks& w, void* stream) {
  if (w.n < 1 || w.n > WeightBlocks::kMax || w.experts < 1 || out_dt == DType::F32)
    return static_cast<int>(cudaErrorInvalidValue);
  BlockEnds b{};
  int64_t total = 0;
  bool vec = w.cols % 4 == 0 && aligned_to(8, out);
  for (int i = 0; i < WeightBlocks::kMax; ++i) {
    if (i < w.n) {
      total += w.rows[i] * w.cols;
      b.src[i] = w.src[i];
      vec = vec && aligned_to(16, w.src[i]);
    } else {
      b.src[i] = w.src[w.n - 1];
    }
    b.end[i] = total;
  }
  total *= w.experts;
  if (total == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(out_dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      const int V = vec ? 4 : 1;
      const int64_t runs = total / V;
      // Grid-stride: at most 2048 blocks of 256, several waves on any current GPU.
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>((runs + 255) / 256, 2048));
      if (vec) cast_weight_blocks_kernel<T, 4><<<grid, 256, 0, st>>>(static_cast<T*>(out), b, total);
      else cast_weight_blocks_kernel<T, 1><<<grid, 256, 0, st>>>(static_cast<T*>(out), b, total);
    }
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

// One grid-stride pass over the experts' gradients: each thread takes a run of 8 elements (one
// 16-byte load of bf16, or one from each of the expert's pieces, summed in fp32), finds its expert
// and block as kernels/weight_cast.cu does, and writes or adds 8 fp32 values.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kernels/block_grads.h"
#include "kernels/elem.cuh"

namespace kernels {

namespace {

struct BlockEnds {
  float* dst[GradBlocks::kMax];
  int64_t end[GradBlocks::kMax];  // cumulative element counts of one expert; unused blocks repeat its total
  bool add[GradBlocks::kMax];
};

template <int V>
__device__ __forceinline__ void put(float* dst, bool add, const float* v) {
  if (add) {
    float old[V];
    load_run<V>(dst, 0, old);
    float sum[V];
#pragma unroll
    for (int i = 0; i < V; ++i) sum[i] = old[i] + v[i];
    store_run<V>(dst, 0, sum);
  } else {
    store_run<V>(dst, 0, v);
  }
}

template <typename T, int V>
__global__ void scatter_block_grads_kernel(const T* src, BlockEnds b, int64_t total, const int32_t* piece_first,
                                           const int32_t* piece_count) {
  const int64_t runs = total / V, per_expert = b.end[GradBlocks::kMax - 1];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < runs; r += stride) {
    const int64_t e = r * V, x = e / per_expert, i = e % per_expert;
    float v[V];
    if (piece_first == nullptr) {
      load_run<V>(src, e, v);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = 0.f;
      const int64_t p0 = piece_first[x], p1 = p0 + piece_count[x];
      for (int64_t p = p0; p < p1; ++p) {
        float part[V];
        load_run<V>(src, p * per_expert + i, part);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] += part[j];
      }
    }
    // Branches, not an indexed search: indexing the parameter arrays would copy them to local memory.
    if (i < b.end[0]) put<V>(b.dst[0] + x * b.end[0] + i, b.add[0], v);
    else if (i < b.end[1]) put<V>(b.dst[1] + x * (b.end[1] - b.end[0]) + (i - b.end[0]), b.add[1], v);
    else if (i < b.end[2]) put<V>(b.dst[2] + x * (b.end[2] - b.end[1]) + (i - b.end[1]), b.add[2], v);
    else put<V>(b.dst[3] + x * (b.end[3] - b.end[2]) + (i - b.end[2]), b.add[3], v);
  }
}

}  // namespace

int scatter_block_grads(const void* src, DType src_dt, const GradBlocks& g, void* stream) {
  if (g.n < 1 || g.n > GradBlocks::kMax || g.experts < 1 || src_dt == DType::F32 ||
      (g.piece_first == nullptr) != (g.piece_count == nullptr))
    return static_cast<int>(cudaErrorInvalidValue);
  BlockEnds b{};
  int64_t total = 0;
  // 8-element runs (16 bytes of bf16, 32 of fp32) where every row and pointer allows them.
  bool vec = g.cols % 8 == 0 && aligned_to(16, src);
  for (int i = 0; i < GradBlocks::kMax; ++i) {
    const int k = std::min(i, g.n - 1);
    if (i < g.n) {
      total += g.rows[i] * g.cols;
      vec = vec && aligned_to(32, g.dst[i]);
    }
    b.dst[i] = g.dst[k];
    b.add[i] = g.add[k];
    b.end[i] = total;
  }
  total *= g.experts;
  if (total == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(src_dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      const int V = vec ? 8 : 1;
      const int64_t runs = total / V;
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>((runs + 255) / 256, 4096));
      const auto* s = static_cast<const T*>(src);
      if (vec) scatter_block_grads_kernel<T, 8><<<grid, 256, 0, st>>>(s, b, total, g.piece_first, g.piece_count);
      else scatter_block_grads_kernel<T, 1><<<grid, 256, 0, st>>>(s, b, total, g.piece_first, g.piece_count);
    }
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

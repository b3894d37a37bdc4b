// One grid-stride pass over the experts' gradients: each thread takes a run of 8 elements (one
// 16-byte load of bf16, or one from each of the expert's pieces, summed in fp32), finds its expert
// and block as kernels/weight_cast.cu does, and writes or adds 8 fp32 values. With square partials
// each thread also sums the squares of what it wrote, per destination, in fp32 (a few runs each),
// and each block adds its threads' sums in fp64 into its own row: no atomics, so the sums come out
// the same every run.
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

// Writes v to dst, or adds it there; v becomes the values written. kWrite false: nothing (only
// the squares of v are wanted).
template <int V, bool kWrite>
__device__ __forceinline__ void put(float* dst, bool add, float* v) {
  if (!kWrite) return;
  if (add) {
    float old[V];
    load_run<V>(dst, 0, old);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += old[i];
  }
  store_run<V>(dst, 0, v);
}

template <int V>
__device__ __forceinline__ float squares(const float* v) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) s = fmaf(v[i], v[i], s);
  return s;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Row blockIdx.x of partials [gridDim.x, n]: the block's sum of each thread's sq[k], in fp64 and a
// fixed order. blockDim.x is a multiple of 32, at most 1024.
__device__ void write_square_partials(const float (&sq)[GradBlocks::kMax], int n, double* partials) {
  __shared__ double warp_sums[32][GradBlocks::kMax];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int k = 0; k < GradBlocks::kMax; ++k) {
    const double w = warp_sum_f64(static_cast<double>(sq[k]));
    if (lane == 0) warp_sums[warp][k] = w;
  }
  __syncthreads();
  if (threadIdx.x < n) {
    double s = 0;
    for (int w = 0; w < warps; ++w) s += warp_sums[w][threadIdx.x];
    partials[static_cast<int64_t>(blockIdx.x) * n + threadIdx.x] = s;
  }
}

template <typename T, int V, bool kSquares, bool kWrite>
__global__ void scatter_block_grads_kernel(const T* src, BlockEnds b, int64_t total, const int32_t* piece_first,
                                           const int32_t* piece_count, int n, double* square_partials) {
  float sq[GradBlocks::kMax] = {0.f, 0.f, 0.f, 0.f};
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
    // Branches, not an indexed search: indexing the parameter arrays (or sq) would put them in
    // local memory.
    if (i < b.end[0]) {
      put<V, kWrite>(b.dst[0] + x * b.end[0] + i, b.add[0], v);
      if (kSquares) sq[0] += squares<V>(v);
    } else if (i < b.end[1]) {
      put<V, kWrite>(b.dst[1] + x * (b.end[1] - b.end[0]) + (i - b.end[0]), b.add[1], v);
      if (kSquares) sq[1] += squares<V>(v);
    } else if (i < b.end[2]) {
      put<V, kWrite>(b.dst[2] + x * (b.end[2] - b.end[1]) + (i - b.end[1]), b.add[2], v);
      if (kSquares) sq[2] += squares<V>(v);
    } else {
      put<V, kWrite>(b.dst[3] + x * (b.end[3] - b.end[2]) + (i - b.end[2]), b.add[3], v);
      if (kSquares) sq[3] += squares<V>(v);
    }
  }
  if (kSquares) write_square_partials(sq, n, square_partials);
}

template <typename T, int V>
void launch(const T* src, const BlockEnds& b, int64_t total, const GradBlocks& g, unsigned grid, cudaStream_t st) {
  if (g.dst[0] == nullptr)
    scatter_block_grads_kernel<T, V, true, false>
        <<<grid, 256, 0, st>>>(src, b, total, g.piece_first, g.piece_count, g.n, g.square_partials);
  else if (g.square_partials != nullptr)
    scatter_block_grads_kernel<T, V, true, true>
        <<<grid, 256, 0, st>>>(src, b, total, g.piece_first, g.piece_count, g.n, g.square_partials);
  else
    scatter_block_grads_kernel<T, V, false, true>
        <<<grid, 256, 0, st>>>(src, b, total, g.piece_first, g.piece_count, g.n, nullptr);
}

}  // namespace

int scatter_block_grads(const void* src, DType src_dt, const GradBlocks& g, void* stream) {
  bool measure_only = true, some_null = false;
  for (int i = 0; i < g.n && i < GradBlocks::kMax; ++i) {
    measure_only = measure_only && g.dst[i] == nullptr;
    some_null = some_null || g.dst[i] == nullptr;
  }
  if (g.n < 1 || g.n > GradBlocks::kMax || g.experts < 1 || src_dt == DType::F32 ||
      (g.piece_first == nullptr) != (g.piece_count == nullptr) || (some_null && !measure_only) ||
      (measure_only && g.square_partials == nullptr))
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
  auto st = static_cast<cudaStream_t>(stream);
  if (total == 0) {
    // Nothing to write, but the caller's partials still say so.
    if (g.square_partials != nullptr)
      return static_cast<int>(cudaMemsetAsync(g.square_partials, 0, sizeof(double) * g.n, st));
    return 0;
  }
  // 8-element runs, one per thread for the grid's 2048 elements a block; the 1-element path loops.
  const unsigned grid = static_cast<unsigned>(scatter_block_grads_grid(g));
  dispatch_dtype(src_dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      const auto* s = static_cast<const T*>(src);
      if (vec) launch<T, 8>(s, b, total, g, grid, st);
      else launch<T, 1>(s, b, total, g, grid, st);
    }
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

// One block per sorted position; only the first position of each run of equal tokens works: its
// threads own columns (4 adjacent ones as one vector where C allows), sum the run's rows of dy in
// sorted order in fp32, and add the sum to the token's gradient row. No atomics, so the result is
// the same bits on every run (checkpoints resume exactly).
#include <cuda_runtime.h>

#include "kernels/elem.cuh"
#include "kernels/embedding_backward.h"

namespace kernels {

namespace {

template <int V>
__global__ void embedding_backward_add_kernel(float* grad, const float* dy, const int64_t* sorted, const int64_t* order,
                                              int64_t N, int64_t C) {
  const int64_t first = blockIdx.x;
  const int64_t token = sorted[first];
  if (first > 0 && sorted[first - 1] == token) return;
  int64_t end = first + 1;
  while (end < N && sorted[end] == token) ++end;
  float* g = grad + token * C;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < C; c += static_cast<int64_t>(blockDim.x) * V) {
    float acc[V] = {};
    for (int64_t i = first; i < end; ++i) {
      float v[V];
      load_run<V>(dy + order[i] * C, c, v);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += v[e];
    }
    float cur[V];
    load_run<V>(g, c, cur);
#pragma unroll
    for (int e = 0; e < V; ++e) cur[e] += acc[e];
    store_run<V>(g, c, cur);
  }
}

}  // namespace

int embedding_backward_add(float* grad, const float* dy, const int64_t* sorted, const int64_t* order, int64_t N,
                           int64_t C, void* stream) {
  if (N == 0 || C == 0) return 0;
  auto st = static_cast<cudaStream_t>(stream);
  const bool vec = C % 4 == 0 && aligned_to(16, grad, dy);
  const int64_t lanes = vec ? C / 4 : C;
  const int threads = lanes >= 256 ? 256 : static_cast<int>((lanes + 31) / 32 * 32);
  const unsigned grid = static_cast<unsigned>(N);
  if (vec) embedding_backward_add_kernel<4><<<grid, threads, 0, st>>>(grad, dy, sorted, order, N, C);
  else embedding_backward_add_kernel<1><<<grid, threads, 0, st>>>(grad, dy, sorted, order, N, C);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

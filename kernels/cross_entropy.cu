// Cross-entropy + its gradient in place: one block per row.
// - Rows of bf16 logits that fit twice in an SM's shared memory (up to 57344 values: GPT-2's
//   50304) are staged there by asynchronous copies, then the block's max, Σexp and the gradient
//   read shared memory: the row is read from global memory once and written once, and two blocks
//   share each SM, so one block's copies overlap the other's reductions and writes.
// - Wider bf16 rows up to 65536 stay in registers: one 16-byte load per 8 values, then the same
//   three steps from the registers. One 1024-thread block per SM: its loads wait on its own
//   reductions (about 1.7 TB/s on an H100, against 2.8 for the staged rows; docs/perf.md stop 27).
// - Otherwise (fp32, wider or unaligned rows): pass 1 keeps an online (max, Σexp) pair per thread
//   and merges them across the block; pass 2 overwrites the row with the gradient (two reads).
// Statistics stay fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/elem.cuh"
#include "kernels/smem_opt_in.cuh"

namespace kernels {

namespace {

__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

constexpr int kRegThreads = 1024;
constexpr int kMaxRegLoads = 8;  // 16-byte loads per thread: rows up to 1024 · 8 · 8 = 65536 bf16 values

template <typename T, int kLoads>
__global__ void __launch_bounds__(kRegThreads)
    ce_grad_regs_kernel(T* logits, int64_t ld, float* loss, const int64_t* targets, int64_t V, float grad_scale) {
  constexpr int E = 16 / sizeof(T);
  __shared__ float scratch[32];
  __shared__ float zt_shared;
  const int64_t row = blockIdx.x;
  T* z = logits + row * ld;
  const int64_t t = targets[row];
  const int64_t nvec = V / E;
  if (t < 0) {  // the whole block leaves together: t is the row's
    Vec<T, E> zero;
#pragma unroll
    for (int e = 0; e < E; ++e) zero.set(e, 0.f);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) zero.store(z + i * E);
    if (threadIdx.x == 0) loss[row] = 0.f;
    return;
  }
  Vec<T, E> r[kLoads];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (i < nvec) {
      r[k].load(z + i * E);
#pragma unroll
      for (int e = 0; e < E; ++e) m = fmaxf(m, r[k].get(e));
      // The target's logit, kept before the row is overwritten (published by block_max's sync).
      // Compared element by element: a computed index would move r[] to local memory.
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (i * E + e == t) zt_shared = r[k].get(e);
    }
  }
  m = block_max(m, scratch);
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (i < nvec) {
#pragma unroll
      for (int e = 0; e < E; ++e) s += __expf(r[k].get(e) - m);
    }
  }
  const float lse = m + logf(block_sum(s, scratch));
  if (threadIdx.x == 0) loss[row] = lse - zt_shared;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (i < nvec) {
      Vec<T, E> g;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float p = __expf(r[k].get(e) - lse);
        g.set(e, (p - (i * E + e == t ? 1.f : 0.f)) * grad_scale);
      }
      g.store(z + i * E);
    }
  }
}

// Launches the register kernel when the row fits and is 16-byte aligned; false otherwise.
template <typename T>
bool launch_regs(T* logits, int64_t ld, float* loss, const int64_t* targets, int64_t N, int64_t V, float grad_scale,
                 cudaStream_t st) {
  constexpr int E = 16 / sizeof(T);
  const int64_t loads = (V / E + kRegThreads - 1) / kRegThreads;
  if (V % E != 0 || ld % E != 0 || !aligned_to(16, logits) || loads > kMaxRegLoads) return false;
  const unsigned grid = static_cast<unsigned>(N);
  switch (loads) {
#define DD_CE_CASE(K) \
  case K: ce_grad_regs_kernel<T, K><<<grid, kRegThreads, 0, st>>>(logits, ld, loss, targets, V, grad_scale); break;
    DD_CE_CASE(1) DD_CE_CASE(2) DD_CE_CASE(3) DD_CE_CASE(4) DD_CE_CASE(5) DD_CE_CASE(6) DD_CE_CASE(7) DD_CE_CASE(8)
#undef DD_CE_CASE
    default: return false;
  }
  return true;
}

bool g_staged_rows = true;  // cross_entropy_staged_rows

constexpr int kSmemThreads = 512;
constexpr int64_t kMaxSmemRowBytes = 112 * 1024;  // two rows per SM within the H100's 227 KB

template <typename T>
__global__ void __launch_bounds__(kSmemThreads, 2)
    ce_grad_smem_kernel(T* logits, int64_t ld, float* loss, const int64_t* targets, int64_t V, float grad_scale) {
  constexpr int E = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char ce_row_smem[];
  T* zs = reinterpret_cast<T*>(ce_row_smem);
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  T* z = logits + row * ld;
  const int64_t t = targets[row];
  const int nvec = static_cast<int>(V / E);
  if (t < 0) {  // the whole block leaves together: t is the row's
    Vec<T, E> zero;
#pragma unroll
    for (int e = 0; e < E; ++e) zero.set(e, 0.f);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) zero.store(z + static_cast<int64_t>(i) * E);
    if (threadIdx.x == 0) loss[row] = 0.f;
    return;
  }
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) cp_async16(zs + i * E, z + static_cast<int64_t>(i) * E);
  cp_async_wait_all();
  __syncthreads();
  float m = -INFINITY;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    Vec<T, E> v;
    v.load(zs + i * E);
#pragma unroll
    for (int e = 0; e < E; ++e) m = fmaxf(m, v.get(e));
  }
  m = block_max(m, scratch);
  float s = 0.f;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    Vec<T, E> v;
    v.load(zs + i * E);
#pragma unroll
    for (int e = 0; e < E; ++e) s += __expf(v.get(e) - m);
  }
  const float lse = m + logf(block_sum(s, scratch));
  // A target past the vocabulary (a tokenizer/model mismatch) gives a NaN loss, not a read past the row.
  if (threadIdx.x == 0) loss[row] = t < V ? lse - to_f32(zs[t]) : NAN;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    Vec<T, E> v, g;
    v.load(zs + i * E);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float p = __expf(v.get(e) - lse);
      g.set(e, (p - (i * E + e == t ? 1.f : 0.f)) * grad_scale);
    }
    g.store(z + static_cast<int64_t>(i) * E);
  }
}

// Launches the shared-memory kernel when two rows fit in an SM and the row is 16-byte aligned;
// false otherwise.
template <typename T>
bool launch_smem(T* logits, int64_t ld, float* loss, const int64_t* targets, int64_t N, int64_t V, float grad_scale,
                 cudaStream_t st) {
  constexpr int E = 16 / sizeof(T);
  const int64_t bytes = V * static_cast<int64_t>(sizeof(T));
  if (!g_staged_rows || V % E != 0 || ld % E != 0 || !aligned_to(16, logits) || bytes > kMaxSmemRowBytes) return false;
  if (allow_dynamic_smem(reinterpret_cast<const void*>(ce_grad_smem_kernel<T>), static_cast<int>(bytes)) != 0) {
    return false;  // this GPU cannot give a block the row: the register or two-pass kernel takes it
  }
  ce_grad_smem_kernel<T><<<static_cast<unsigned>(N), kSmemThreads, static_cast<size_t>(bytes), st>>>(
      logits, ld, loss, targets, V, grad_scale);
  return true;
}

// Merges two (max, sum of exp(x - max)) pairs.
__device__ inline void merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

template <typename T>
__global__ void ce_grad_kernel(T* logits, int64_t ld, float* loss, const int64_t* targets, int64_t V,
                               float grad_scale) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * ld;
  const int64_t t = targets[row];
  if (t < 0) {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store(z + j, 0.f);
    if (threadIdx.x == 0) loss[row] = 0.f;
    return;
  }
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = load(z + j);
    if (x > m) {
      s = (m == -INFINITY ? 0.f : s * __expf(m - x)) + 1.f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
    merge(m, s, m2, s2);
  }
  __shared__ float wm[32], ws[32];
  __shared__ float lse_shared, zt_shared;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    wm[warp] = m;
    ws[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = (blockDim.x + 31) / 32;
    m = lane < n_warps ? wm[lane] : -INFINITY;
    s = lane < n_warps ? ws[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      lse_shared = m + logf(s);
      zt_shared = load(z + t);
    }
  }
  __syncthreads();
  const float lse = lse_shared;
  if (threadIdx.x == 0) loss[row] = lse - zt_shared;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = __expf(load(z + j) - lse);
    store(z + j, (p - (j == t ? 1.f : 0.f)) * grad_scale);
  }
}

}  // namespace

void cross_entropy_staged_rows(bool on) { g_staged_rows = on; }

int cross_entropy_grad_inplace(void* logits, bool is_bf16, int64_t ld, float* loss, const int64_t* targets,
                               int64_t N, int64_t V, float grad_scale, void* stream) {
  if (N == 0) return 0;
  const int threads = 512;
  auto st = static_cast<cudaStream_t>(stream);
  if (is_bf16 && launch_smem(static_cast<__nv_bfloat16*>(logits), ld, loss, targets, N, V, grad_scale, st))
    return static_cast<int>(cudaGetLastError());
  if (is_bf16 && launch_regs(static_cast<__nv_bfloat16*>(logits), ld, loss, targets, N, V, grad_scale, st))
    return static_cast<int>(cudaGetLastError());
  if (is_bf16) {
    ce_grad_kernel<<<static_cast<unsigned>(N), threads, 0, st>>>(static_cast<__nv_bfloat16*>(logits), ld, loss,
                                                                 targets, V, grad_scale);
  } else {
    ce_grad_kernel<<<static_cast<unsigned>(N), threads, 0, st>>>(static_cast<float*>(logits), ld, loss, targets, V,
                                                                 grad_scale);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

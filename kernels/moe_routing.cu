// MoE routing kernels (kernels/moe_routing.h): the router's softmax and top-k with one warp per
// token, the pairs' stable order by expert as a three-launch counting sort, and the dispatch's row
// gather with one warp per row.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "kernels/elem.cuh"
#include "kernels/moe_routing.h"

namespace kernels {

namespace {

constexpr int kWarpsPerBlock = 8;  // router and gather: one token (row) a warp

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// A probability's rank key: probabilities are ≥ 0, so their bits order like the values; NaN ranks
// above everything (as torch.topk ranks it), so the k picks are always k distinct valid experts.
__device__ __forceinline__ unsigned prob_key(float p) { return isnan(p) ? 0xffffffffu : __float_as_uint(p); }

// Lane `lane` holds experts lane, lane + 32, ... (PER of them, PER · 32 ≥ E).
template <int PER>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    router_topk_forward_kernel(const float* __restrict__ logits, float* __restrict__ probs, int64_t* __restrict__ idx,
                               float* __restrict__ w, float* __restrict__ prob_sums, int64_t N, int E, int k,
                               bool norm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[PER];  // this lane's experts' probabilities summed over the warp's tokens
#pragma unroll
  for (int i = 0; i < PER; ++i) acc[i] = 0.f;
  for (int64_t t = int64_t{blockIdx.x} * kWarpsPerBlock + warp; t < N; t += int64_t{gridDim.x} * kWarpsPerBlock) {
    const float* row = logits + t * E;
    float p[PER];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      p[i] = e < E ? row[e] : -INFINITY;
      m = fmaxf(m, p[i]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      p[i] = e < E ? expf(p[i] - m) : 0.f;
      s += p[i];
    }
    const float inv = 1.f / warp_sum(s);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      p[i] *= inv;
      acc[i] += p[i];
      if (e < E) probs[t * E + e] = p[i];
    }
    // The k largest, one by one: each lane offers its best untaken expert, the warp keeps the
    // largest (ties to the lower expert), its owner marks it taken. Lane j keeps pick j.
    unsigned taken = 0;
    float total = 0.f, mine_p = 0.f;
    int mine_e = 0;
    for (int j = 0; j < k; ++j) {
      unsigned best = 0;
      int be = INT_MAX;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        const unsigned key = prob_key(p[i]);
        if (e < E && !((taken >> i) & 1u) && (key > best || (key == best && e < be))) {
          best = key;
          be = e;
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        const unsigned ob = __shfl_xor_sync(0xffffffffu, best, off);
        const int oe = __shfl_xor_sync(0xffffffffu, be, off);
        if (ob > best || (ob == best && oe < be)) {
          best = ob;
          be = oe;
        }
      }
      // k ≤ E, so some untaken expert exists and be < E.
      if (be % 32 == lane) taken |= 1u << (be / 32);
      const float pb = __uint_as_float(best);  // the key's bits are the probability (NaN stays NaN)
      total += pb;
      if (lane == j) {
        mine_p = pb;
        mine_e = be;
      }
    }
    if (lane < k) {
      idx[t * k + lane] = mine_e;
      w[t * k + lane] = norm ? mine_p / total : mine_p;
    }
  }
  if (prob_sums == nullptr) return;
  // The block's sum per expert, its warps added in order (no atomics: the same bits every run).
  __shared__ float part[kWarpsPerBlock][PER * 32];
#pragma unroll
  for (int i = 0; i < PER; ++i) part[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float sum = 0.f;
    for (int j = 0; j < kWarpsPerBlock; ++j) sum += part[j][e];
    prob_sums[int64_t{blockIdx.x} * E + e] = sum;
  }
}

template <int PER>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    router_topk_backward_kernel(float* __restrict__ dlogits, const float* __restrict__ probs,
                                const int64_t* __restrict__ idx, const float* __restrict__ dw,
                                const float* __restrict__ dprobs, int64_t dprobs_row_stride, int64_t N, int E, int k,
                                bool norm) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= N) return;
  const float* prow = probs + t * E;
  // Lane j < k: slot j's expert, probability and weight gradient.
  int ej = -1;
  float pj = 0.f, dwj = 0.f;
  if (lane < k) {
    ej = static_cast<int>(idx[t * k + lane]);
    pj = prow[ej];
    dwj = dw ? dw[t * k + lane] : 0.f;
  }
  // Through the renormalisation w_j = p_j / S: dp_j = (dw_j − Σ_i dw_i w_i) / S.
  float dpj = dwj;
  if (norm) {
    const float S = warp_sum(pj);
    const float c = warp_sum(dwj * (pj / S));
    dpj = (dwj - c) / S;
  }
  float p[PER], g[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? prow[e] : 0.f;
    g[i] = (e < E && dprobs) ? dprobs[t * dprobs_row_stride + e] : 0.f;
  }
  for (int j = 0; j < k; ++j) {
    const int e = __shfl_sync(0xffffffffu, ej, j);
    const float d = __shfl_sync(0xffffffffu, dpj, j);
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (e == lane + 32 * i) g[i] += d;
  }
  // Through the softmax: dlogit_e = p_e (g_e − Σ p g).
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) dot += p[i] * g[i];
  dot = warp_sum(dot);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    if (e < E) dlogits[t * E + e] = p[i] * (g[i] - dot);
  }
}

template <typename Launch>
void dispatch_per_lane(int64_t E, Launch&& launch) {
  if (E <= 32) launch(std::integral_constant<int, 1>{});
  else if (E <= 64) launch(std::integral_constant<int, 2>{});
  else if (E <= 128) launch(std::integral_constant<int, 4>{});
  else launch(std::integral_constant<int, 8>{});
}

// Counting sort, pass 1: each block's chunk of pairs counted per expert (scratch [blocks, E]).
__global__ void order_count_kernel(const int64_t* __restrict__ flat, int64_t P, int E, int32_t* __restrict__ scratch) {
  extern __shared__ int count_s[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) count_s[e] = 0;
  __syncthreads();
  const int64_t begin = int64_t{blockIdx.x} * MOE_ORDER_CHUNK;
  const int64_t end = begin + MOE_ORDER_CHUNK < P ? begin + MOE_ORDER_CHUNK : P;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) atomicAdd(&count_s[flat[i]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) scratch[int64_t{blockIdx.x} * E + e] = count_s[e];
}

// Pass 2 (one block, a thread per expert): the totals, each expert's first position, and each
// block's first position for each expert (overwriting its count in scratch).
__global__ void order_scan_kernel(int32_t* __restrict__ scratch, int blocks, int E, int64_t* __restrict__ counts,
                                  int32_t* __restrict__ ends) {
  extern __shared__ int first_s[];
  const int e = threadIdx.x;
  int total = 0;
  if (e < E)
    for (int b = 0; b < blocks; ++b) total += scratch[int64_t{b} * E + e];
  if (e < E) first_s[e] = total;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int x = 0; x < E; ++x) {
      const int c = first_s[x];
      first_s[x] = run;
      run += c;
    }
  }
  __syncthreads();
  if (e >= E) return;
  counts[e] = total;
  ends[e] = first_s[e] + total;
  int run = first_s[e];
  for (int b = 0; b < blocks; ++b) {
    const int c = scratch[int64_t{b} * E + e];
    scratch[int64_t{b} * E + e] = run;
    run += c;
  }
}

// Pass 3 (one warp a chunk): each pair's position, in pair order within its expert. A tile of 32
// pairs ranks itself by the lanes holding the same expert before it (__match_any_sync); the lowest
// such lane then advances the expert's running position.
__global__ void order_place_kernel(const int64_t* __restrict__ flat, int64_t P, int64_t k, int E,
                                   const int32_t* __restrict__ scratch, int64_t* __restrict__ sorted,
                                   int64_t* __restrict__ order, int64_t* __restrict__ inverse,
                                   int64_t* __restrict__ token) {
  extern __shared__ int next_s[];
  const int lane = threadIdx.x;
  for (int e = lane; e < E; e += 32) next_s[e] = scratch[int64_t{blockIdx.x} * E + e];
  __syncwarp();
  const int64_t begin = int64_t{blockIdx.x} * MOE_ORDER_CHUNK;
  const int64_t end = begin + MOE_ORDER_CHUNK < P ? begin + MOE_ORDER_CHUNK : P;
  for (int64_t tile = begin; tile < end; tile += 32) {
    const int64_t i = tile + lane;
    const bool valid = i < end;
    const int e = valid ? static_cast<int>(flat[i]) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int pos = valid ? next_s[e] + rank : 0;
    __syncwarp();
    if (valid) {
      sorted[pos] = e;
      order[pos] = i;
      inverse[i] = pos;
      token[pos] = i / k;
      if (lane == __ffs(peers) - 1) next_s[e] += __popc(peers);
    }
    __syncwarp();
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gather_rows_kernel(T* __restrict__ out, const T* __restrict__ src, const int64_t* __restrict__ rows, int64_t R,
                       int64_t d) {
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= R) return;
  const int lane = threadIdx.x % 32;
  const T* s = src + rows[r] * d;
  T* o = out + r * d;
#pragma unroll 4
  for (int64_t c = int64_t{lane} * V; c < d; c += 32 * V) {
    Vec<T, V> x;
    x.load(s + c);
    x.store(o + c);
  }
}

unsigned warp_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The router's forward blocks: a token a warp, up to one full wave of the H100 (8 blocks of 8 warps
// on each of 132 SMs); past that the warps take several tokens each, so the per-block probability
// sums stay few for the column sum that adds them.
constexpr int64_t kRouterMaxBlocks = 132 * 8;

}  // namespace

int64_t moe_router_prob_sum_rows(int64_t N) {
  const int64_t blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return blocks < kRouterMaxBlocks ? blocks : kRouterMaxBlocks;
}

int moe_router_topk_forward(const float* logits, float* probs, int64_t* idx, float* w, float* prob_sums, int64_t N,
                            int64_t E, int64_t k, bool norm, void* stream) {
  if (!moe_router_supports(E, k) || N < 1) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_per_lane(E, [&](auto per) {
    router_topk_forward_kernel<decltype(per)::value>
        <<<static_cast<unsigned>(moe_router_prob_sum_rows(N)), kWarpsPerBlock * 32, 0, st>>>(
            logits, probs, idx, w, prob_sums, N, static_cast<int>(E), static_cast<int>(k), norm);
  });
  return static_cast<int>(cudaGetLastError());
}

int moe_router_topk_backward(float* dlogits, const float* probs, const int64_t* idx, const float* dw,
                             const float* dprobs, int64_t dprobs_row_stride, int64_t N, int64_t E, int64_t k,
                             bool norm, void* stream) {
  if (!moe_router_supports(E, k) || N < 1) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_per_lane(E, [&](auto per) {
    router_topk_backward_kernel<decltype(per)::value><<<warp_blocks(N), kWarpsPerBlock * 32, 0, st>>>(
        dlogits, probs, idx, dw, dprobs, dprobs_row_stride, N, static_cast<int>(E), static_cast<int>(k), norm);
  });
  return static_cast<int>(cudaGetLastError());
}

int moe_expert_order(const int64_t* flat, int64_t P, int64_t k, int64_t E, int64_t* sorted, int64_t* order,
                     int64_t* inverse, int64_t* token, int64_t* counts, int32_t* ends, int32_t* scratch,
                     void* stream) {
  if (P < 1 || k < 1 || E < 1 || E > MOE_ORDER_MAX_EXPERTS || P > INT_MAX) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>((P + MOE_ORDER_CHUNK - 1) / MOE_ORDER_CHUNK);
  const int Ei = static_cast<int>(E);
  const size_t smem = sizeof(int) * static_cast<size_t>(E);
  order_count_kernel<<<blocks, 256, smem, st>>>(flat, P, Ei, scratch);
  order_scan_kernel<<<1, static_cast<unsigned>((E + 31) / 32 * 32), smem, st>>>(scratch, blocks, Ei, counts, ends);
  order_place_kernel<<<blocks, 32, smem, st>>>(flat, P, k, Ei, scratch, sorted, order, inverse, token);
  return static_cast<int>(cudaGetLastError());
}

int moe_gather_rows(void* out, const void* src, const int64_t* rows, int64_t R, int64_t d, DType dt, void* stream) {
  if (R < 1 || d < 1) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_width(dt, d, {out, src}, [&](auto tag, auto width) {
    using T = decltype(tag);
    gather_rows_kernel<T, decltype(width)::value><<<warp_blocks(R), kWarpsPerBlock * 32, 0, st>>>(
        static_cast<T*>(out), static_cast<const T*>(src), rows, R, d);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

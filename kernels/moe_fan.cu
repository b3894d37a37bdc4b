// The MoE input's fan-out and its gradients' fan-in (kernels/moe_fan.h). One warp a token, eight
// tokens a block; a lane walks the row in V-element vectors (16 bytes of the 16-bit rows when the
// rows allow it). The k slots' row positions are read once a warp and kept in registers; the
// slot loop is unrolled to KMAX with the unused slots predicated off, so a lane's k loads of the
// fan-in are in flight together rather than one after another.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/elem.cuh"
#include "kernels/moe_fan.h"

namespace kernels {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// Token t's k expert-order rows as element offsets (row · d), the unused slots 0.
template <int KMAX>
__device__ __forceinline__ void slot_offsets(int64_t (&off)[KMAX], const int64_t* inverse, int64_t t, int k,
                                             int64_t d) {
#pragma unroll
  for (int j = 0; j < KMAX; ++j) off[j] = j < k ? inverse[t * k + j] * d : 0;
}

template <typename TX, typename TR, int V, int KMAX>
__global__ void __launch_bounds__(kThreads)
    moe_fan_out_kernel(TR* __restrict__ rows, TR* __restrict__ cast, const TX* __restrict__ x,
                       const int64_t* __restrict__ inverse, int64_t N, int k, int64_t d) {
  const int64_t t = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32;
  int64_t dst[KMAX];
  slot_offsets(dst, inverse, t, k, d);
  const TX* src = x + t * d;
#pragma unroll 4
  for (int64_t c = int64_t{lane} * V; c < d; c += 32 * V) {
    Vec<TX, V> in;
    in.load(src + c);
    Vec<TR, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.set(i, in.get(i));
    if (cast != nullptr) out.store(cast + t * d + c);
#pragma unroll
    for (int j = 0; j < KMAX; ++j)
      if (j < k) out.store(rows + dst[j] + c);
  }
}

template <typename TX, typename TR, int V, int KMAX>
__global__ void __launch_bounds__(kThreads)
    moe_fan_in_kernel(TX* __restrict__ dx, const TX* __restrict__ a, const TR* __restrict__ b,
                      const TR* __restrict__ rows, const int64_t* __restrict__ inverse, int64_t N, int k, int64_t d) {
  const int64_t t = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32;
  int64_t src[KMAX];
  slot_offsets(src, inverse, t, k, d);
  for (int64_t c = int64_t{lane} * V; c < d; c += 32 * V) {
    Vec<TR, V> r[KMAX];
#pragma unroll
    for (int j = 0; j < KMAX; ++j)
      if (j < k) r[j].load(rows + src[j] + c);
    float acc[V] = {};
    if (a != nullptr) {
      Vec<TX, V> va;
      va.load(a + t * d + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = va.get(i);
    }
    if (b != nullptr) {
      Vec<TR, V> vb;
      vb.load(b + t * d + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += vb.get(i);
    }
#pragma unroll
    for (int j = 0; j < KMAX; ++j) {
      if (j >= k) break;
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += r[j].get(i);
    }
    Vec<TX, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.set(i, acc[i]);
    out.store(dx + t * d + c);
  }
}

// Calls launch(TX{}, TR{}) for the pairs the kernels take: rows of x's own dtype, or 16-bit rows
// of an fp32 x. Returns false for any other pair.
template <typename Launch>
bool dispatch_pair(DType xdt, DType rdt, Launch&& launch) {
  if (xdt == rdt) {
    dispatch_dtype(xdt, [&](auto tag) { launch(tag, tag); });
    return true;
  }
  if (xdt != DType::F32) return false;
  dispatch_dtype(rdt, [&](auto tag) { launch(float{}, tag); });
  return true;
}

// launch(std::integral_constant<int, V>, std::integral_constant<int, KMAX>): 8-element vectors
// where d and every pointer allow them (each aligned to 8 of its own elements), else 1.
template <typename TX, typename TR, typename Launch>
void dispatch_shape(int64_t d, int64_t k, std::initializer_list<const void*> x_rows,
                    std::initializer_list<const void*> r_rows, Launch&& launch) {
  bool vec = d % 8 == 0;
  for (const void* p : x_rows) vec = vec && aligned_to(8 * sizeof(TX), p);
  for (const void* p : r_rows) vec = vec && aligned_to(8 * sizeof(TR), p);
  auto with_k = [&](auto v) {
    if (k <= 8) launch(v, std::integral_constant<int, 8>{});
    else launch(v, std::integral_constant<int, static_cast<int>(MOE_FAN_MAX_K)>{});
  };
  if (vec) with_k(std::integral_constant<int, 8>{});
  else with_k(std::integral_constant<int, 1>{});
}

unsigned token_blocks(int64_t N) { return static_cast<unsigned>((N + kWarps - 1) / kWarps); }

}  // namespace

int moe_fan_out(void* rows, void* cast, const void* x, const int64_t* inverse, int64_t N, int64_t k, int64_t d,
                DType xdt, DType rdt, void* stream) {
  if (!moe_fan_supports(k) || N < 1 || d < 1) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  const bool ok = dispatch_pair(xdt, rdt, [&](auto xtag, auto rtag) {
    using TX = decltype(xtag);
    using TR = decltype(rtag);
    dispatch_shape<TX, TR>(d, k, {x}, {rows, cast}, [&](auto v, auto kmax) {
      moe_fan_out_kernel<TX, TR, decltype(v)::value, decltype(kmax)::value><<<token_blocks(N), kThreads, 0, st>>>(
          static_cast<TR*>(rows), static_cast<TR*>(cast), static_cast<const TX*>(x), inverse, N,
          static_cast<int>(k), d);
    });
  });
  return ok ? static_cast<int>(cudaGetLastError()) : static_cast<int>(cudaErrorInvalidValue);
}

int moe_fan_in(void* dx, const void* a, const void* b, const void* rows, const int64_t* inverse, int64_t N,
               int64_t k, int64_t d, DType xdt, DType rdt, void* stream) {
  if (!moe_fan_supports(k) || N < 1 || d < 1) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  const bool ok = dispatch_pair(xdt, rdt, [&](auto xtag, auto rtag) {
    using TX = decltype(xtag);
    using TR = decltype(rtag);
    dispatch_shape<TX, TR>(d, k, {dx, a}, {b, rows}, [&](auto v, auto kmax) {
      moe_fan_in_kernel<TX, TR, decltype(v)::value, decltype(kmax)::value><<<token_blocks(N), kThreads, 0, st>>>(
          static_cast<TX*>(dx), static_cast<const TX*>(a), static_cast<const TR*>(b), static_cast<const TR*>(rows),
          inverse, N, static_cast<int>(k), d);
    });
  });
  return ok ? static_cast<int>(cudaGetLastError()) : static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace kernels

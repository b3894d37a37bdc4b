// RoPE: one block per token (b, t); its threads walk the token's H · D/2 rotation pairs, V
// consecutive pairs per thread through one aligned vector load of each half (8 bytes), so the
// token's position is read once and a warp touches one contiguous stretch of each head.
#include "kernels/elem.cuh"
#include "kernels/rope.h"

namespace kernels {

namespace {

template <typename T, int V>
__global__ void rope_kernel(T* out, const T* x, const int64_t* pos, const double* cos_t, const double* sin_t,
                            RopeShape s, float sign) {
  const int64_t token = blockIdx.x;
  const int64_t b = token / s.T, t = token % s.T;
  const int64_t half = s.D / 2, per_head = half / V;
  const int64_t p = pos[b * s.pos_sb + t * s.pos_st];
  const T* xt = x + b * s.x_sb + t * s.x_st;
  T* ot = out + token * s.H * s.D;
  for (int64_t i = threadIdx.x; i < s.H * per_head; i += blockDim.x) {
    const int64_t hd = i / per_head, j = (i % per_head) * V;
    const T* xh = xt + hd * s.x_sh;
    Vec<T, V> x1, x2, o1, o2;
    x1.load(xh + j);
    x2.load(xh + j + half);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float c = static_cast<float>(cos_t[p * half + j + k]);
      const float sn = sign * static_cast<float>(sin_t[p * half + j + k]);
      o1.set(k, x1.get(k) * c - x2.get(k) * sn);
      o2.set(k, x2.get(k) * c + x1.get(k) * sn);
    }
    T* oh = ot + hd * s.D;
    o1.store(oh + j);
    o2.store(oh + j + half);
  }
}

template <typename T, int V>
void launch(void* out, const void* x, const int64_t* pos, const double* cos, const double* sin, const RopeShape& s,
            float sign, cudaStream_t st) {
  const int64_t work = s.H * (s.D / 2) / V;
  const int threads = work >= 256 ? 256 : static_cast<int>((work + 31) / 32 * 32);
  rope_kernel<T, V><<<static_cast<unsigned>(s.B * s.T), threads, 0, st>>>(static_cast<T*>(out),
                                                                         static_cast<const T*>(x), pos, cos, sin, s,
                                                                         sign);
}

}  // namespace

int rope_apply(void* out, const void* x, DType dt, const int64_t* pos, const double* cos, const double* sin,
               const RopeShape& s, bool inverse, void* stream) {
  if (s.B * s.T == 0 || s.H == 0 || s.D == 0) return 0;
  if (s.D % 2 != 0) return static_cast<int>(cudaErrorInvalidValue);
  auto st = static_cast<cudaStream_t>(stream);
  const float sign = inverse ? -1.f : 1.f;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    // 8-byte vectors when every row start and the half split are aligned to them; else scalars.
    constexpr int V = 8 / sizeof(T);
    const int64_t half = s.D / 2;
    const bool vec = half % V == 0 && s.x_sb % V == 0 && s.x_st % V == 0 && s.x_sh % V == 0 && aligned_to(8, out, x);
    if (vec) launch<T, V>(out, x, pos, cos, sin, s, sign, st);
    else launch<T, 1>(out, x, pos, cos, sin, s, sign, st);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

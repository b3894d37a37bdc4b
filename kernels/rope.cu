// RoPE: one block per token (b, t); its threads walk the H · D/2 rotation pairs of that token, so
// the token's position is read once and consecutive threads touch consecutive elements.
#include "kernels/elem.cuh"
#include "kernels/rope.h"

namespace kernels {

namespace {

template <typename T>
__global__ void rope_kernel(T* out, const T* x, const int64_t* pos, const double* cos_t, const double* sin_t,
                            RopeShape s, float sign) {
  const int64_t token = blockIdx.x;
  const int64_t b = token / s.T, t = token % s.T;
  const int64_t half = s.D / 2;
  const int64_t p = pos[b * s.pos_sb + t * s.pos_st];
  const T* xt = x + b * s.x_sb + t * s.x_st;
  T* ot = out + token * s.H * s.D;
  for (int64_t i = threadIdx.x; i < s.H * half; i += blockDim.x) {
    const int64_t hd = i / half, j = i % half;
    const float c = static_cast<float>(cos_t[p * half + j]);
    const float sn = sign * static_cast<float>(sin_t[p * half + j]);
    const T* xh = xt + hd * s.x_sh;
    const float x1 = to_f32(xh[j]), x2 = to_f32(xh[j + half]);
    T* oh = ot + hd * s.D;
    oh[j] = from_f32<T>(x1 * c - x2 * sn);
    oh[j + half] = from_f32<T>(x2 * c + x1 * sn);
  }
}

}  // namespace

int rope_apply(void* out, const void* x, DType dt, const int64_t* pos, const double* cos, const double* sin,
               const RopeShape& s, bool inverse, void* stream) {
  const int64_t tokens = s.B * s.T;
  if (tokens == 0 || s.H == 0 || s.D == 0) return 0;
  if (s.D % 2 != 0) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t pairs = s.H * (s.D / 2);
  const int threads = pairs >= 256 ? 256 : static_cast<int>((pairs + 31) / 32 * 32);
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<static_cast<unsigned>(tokens), threads, 0, st>>>(static_cast<T*>(out), static_cast<const T*>(x),
                                                                      pos, cos, sin, s, inverse ? -1.f : 1.f);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels

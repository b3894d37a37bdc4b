// σ(x) = 1 / (1 + e^-x) for the element kernels bound by instruction issue (the short conv, the gated
// RMSNorm, SwiGLU): e^-x as ex2.approx.ftz of −x·log2 e, then the reciprocal by __fdividef, without
// IEEE division's slow path. __expf computes the same ex2 with a guard for subnormal results (three
// more instructions), which changes nothing here: 1 + e^-x rounds to 1 for any e^-x that small, so
// the result has the bits of __fdividef(1, 1 + __expf(-x)). For x < about −88 the denominator is
// infinite and the quotient 0, as it should be.
#pragma once

#include <cuda_runtime.h>

namespace kernels {

__device__ __forceinline__ float exp2_approx_ftz(float a) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

__device__ __forceinline__ float fast_sigmoid(float x) {
  return __fdividef(1.f, 1.f + exp2_approx_ftz(x * -1.44269504f));
}

}  // namespace kernels

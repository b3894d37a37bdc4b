// SwiGLU's per-element math in fp32, shared by the SwiGLU kernels (kernels/swiglu.cu) and the FP8
// quantisers that compute the activation or its gradient on the fly (kernels/fp8_quant.cu), so both
// produce the same values from the same g, u and dh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/fast_sigmoid.cuh"

namespace kernels {

// σ(g) by fast_sigmoid: the row kernels are bound by instruction issue as much as by memory.
__device__ __forceinline__ float swiglu_sigmoid(float g) { return fast_sigmoid(g); }

// h = g σ(g) u
__device__ __forceinline__ float swiglu_value(float g, float u) { return g * swiglu_sigmoid(g) * u; }

// dg = dh · u · σ(g) (1 + g (1 − σ(g))),  du = dh · g σ(g)
__device__ __forceinline__ void swiglu_grads(float g, float u, float dh, float& dg, float& du) {
  const float s = swiglu_sigmoid(g);
  dg = dh * u * s * (1.f + g * (1.f - s));
  du = dh * g * s;
}

}  // namespace kernels

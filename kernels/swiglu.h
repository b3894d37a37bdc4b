// SwiGLU activation on the fused gate|up projection, forward and backward. Raw pointers, no torch.
//   gu [N, 2F] (row stride ld ≥ 2F): g = gu[:, :F], u = gu[:, F:]
//   h = silu(g) · u = g σ(g) u                                       [N, F] contiguous
//   dg = dh · u · σ(g) (1 + g (1 − σ(g))),  du = dh · g σ(g)          written as dgu [N, 2F] contiguous
// so the backward of the one gate|up matmul receives one contiguous gradient. Math in fp32.
// The reference is model/fused_swiglu.h's ATen formula.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

#ifdef DD_HAVE_CUDA
// Returns the cudaError_t of the launch (0 = success). Every tensor has dtype `dt`.
int swiglu_forward(void* h, const void* gu, DType dt, int64_t N, int64_t F, int64_t ld, void* stream);
int swiglu_backward(void* dgu, const void* dh, const void* gu, DType dt, int64_t N, int64_t F, int64_t ld,
                    void* stream);
#endif

}  // namespace kernels

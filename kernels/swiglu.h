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

// The MoE experts' form, each row weighted by its router weight (w fp32: the γ of the routed row,
// so the layer's combine is a plain sum and its backward a plain gather). Row n reads w[i(n)], with
// i(n) = w_index[n] (w in the router's pair order, read through the expert order: no permuted copy
// of γ either way), or i(n) = n when w_index is null:
//   h = w[i(n)] · silu(g) · u;   dg, du as above from w[i(n)] · dh;   dw[i(n)] = Σ_f dh · silu(g) · u.
// w_index must be a permutation of [0, N) (each dw entry is written by its one row). One warp a
// row in the backward, for dw's sum.
int swiglu_weighted_forward(void* h, const void* gu, const float* w, const int64_t* w_index, DType dt, int64_t N,
                            int64_t F, int64_t ld, void* stream);
int swiglu_weighted_backward(void* dgu, float* dw, const void* dh, const void* gu, const float* w,
                             const int64_t* w_index, DType dt, int64_t N, int64_t F, int64_t ld, void* stream);
#endif

}  // namespace kernels

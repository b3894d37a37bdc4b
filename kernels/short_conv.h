// The Gated DeltaNet layer's causal short convolution with SiLU (MODEL.md §4), forward and backward.
// Raw pointers, no torch. Per channel c of x [R rows, T tokens, C] (token stride ld ≥ C, unit
// channel stride), with W taps and tap i reaching i tokens back:
//   s[t,c] = Σ_{i<W, ok(t,i)} w[c, W−1−i] · x[t−i, c],   y = silu(s)            y [R,T,C] contiguous
//   ok(t,i) = t − i ≥ 0 within the row, and pos[t] ≥ i when pos (the position of every token in its
//   document, [R·T]) is given: no tap reaches into the previous document of a packed row.
// Backward, with ds = dy · silu'(s) (s recomputed from x):
//   dx[t,c] = Σ_{i, ok(t+i,i)} ds[t+i,c] · w[c, W−1−i]                  dx [R,T,C], token stride ld_dx
//   dw[c, W−1−i] += Σ_t ds[t,c] · x[t−i,c] · ok(t,i)          dw fp32 [C,W], accumulated (zero it first)
// Math in fp32; w is fp32. The reference is model/gated_deltanet.h's short_conv.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

#ifdef DD_HAVE_CUDA
// Return the cudaError_t of the launch (0 = success). x, y, dy and dx have dtype `dt`; W ≤ 8.
int short_conv_forward(void* y, const void* x, DType dt, const float* w, const int64_t* pos, int64_t R, int64_t T,
                       int64_t C, int64_t ld, int W, void* stream);
// dx's token stride is ld_dx (0: C, contiguous), so a conv over some columns of a wider row can
// write its input gradient straight into those columns of the row's gradient.
int short_conv_backward(void* dx, float* dw, const void* dy, const void* x, DType dt, const float* w,
                        const int64_t* pos, int64_t R, int64_t T, int64_t C, int64_t ld, int W, void* stream,
                        int64_t ld_dx = 0);
#endif

// One part of a backward over several groups of channels that come with gradients of their own
// (the Gated DeltaNet's q|k|v): channels [c0, c0 + C) of x, w, dw and dx, and their output
// gradient dy [R, T, C] (contiguous, dtype `dt`).
struct ShortConvGradPart {
  const void* dy;
  int64_t c0, C;
};
constexpr int kShortConvMaxParts = 4;

#ifdef DD_HAVE_CUDA
// short_conv_backward over 1 to kShortConvMaxParts parts in one launch: parts in order of c0, not
// overlapping, ending within ld and ld_dx, each with its dy unless it is empty, ld_dx below 2³¹ / 64
// (else cudaErrorInvalidValue); channels between parts are left alone. ld_dx is dx's token stride
// (no 0 for C here). short_conv_backward is this with one part.
int short_conv_backward_parts(void* dx, float* dw, const ShortConvGradPart* parts, int n_parts, const void* x, DType dt,
                              const float* w, const int64_t* pos, int64_t R, int64_t T, int64_t ld, int W, void* stream,
                              int64_t ld_dx);
#endif

}  // namespace kernels

// The Gated DeltaNet layer's short convolution + SiLU through one CUDA kernel each way on a GPU
// (kernels/short_conv.h), and the ATen reference (short_conv, model/gated_deltanet.h) elsewhere.
// The reference's W shifted multiply-adds, its masks and SiLU each read and write the whole
// [B,T,C] activation, forward and backward; the kernel reads x once and writes y once (backward: x
// and dy in, dx out, the weight gradient reduced on the fly).
#pragma once

#include <torch/types.h>

#include <vector>

#include "model/layers.h"

namespace model {

// x [B,T,C] (unit channel stride; a column slice of a wider matmul output is taken as is), w [C,W]
// (tap W−1 multiplies the current token), p the batch's positions: packed rows mask the taps that
// would reach the previous document. Returns silu(conv(x)) [B,T,C] contiguous in x's dtype.
torch::Tensor fused_short_conv(const torch::Tensor& x, const torch::Tensor& w, const Positions& p);

// The Gated DeltaNet layer's front on its input projection's rows y [B,T,C+R]: silu(conv(·)) over the
// first C = Σ widths columns (w [C,W]), cut into one tensor per width (q, k, v), and the last R
// columns (the output gate's input) as they are, a view of y. On a GPU the backward writes the
// convolution's input gradient and the last columns' gradient straight into one gradient of y, each
// part's output gradient read where it is: split, conv and split again would concatenate the
// gradients twice (y's, then the conv output's). Elsewhere exactly those three steps.
struct ShortConvParts {
  std::vector<torch::Tensor> parts;  // [B,T,widths[i]] each, columns of one conv output
  torch::Tensor rest;                // [B,T,R], a view of y
};
ShortConvParts fused_short_conv_parts(const torch::Tensor& y, const torch::Tensor& w, const Positions& p,
                                      const std::vector<int64_t>& widths);
// How many backward passes of fused_short_conv_parts found the rest's gradient already in a buffer
// laid out as y (the gated output norm's dz) and filled that buffer's other columns instead of
// copying it into a new one; process-wide, for tests.
int64_t short_conv_parts_gradients_in_place();

}  // namespace model

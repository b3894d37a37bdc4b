// The Gated DeltaNet layer's short convolution + SiLU through one CUDA kernel each way on a GPU
// (kernels/short_conv.h), and the ATen reference (short_conv, model/gated_deltanet.h) elsewhere.
// The reference's W shifted multiply-adds, its masks and SiLU each read and write the whole
// [B,T,C] activation, forward and backward; the kernel reads x once and writes y once (backward: x
// and dy in, dx out, the weight gradient reduced on the fly).
#pragma once

#include <torch/types.h>

#include "model/layers.h"

namespace model {

// x [B,T,C] (unit channel stride; a column slice of a wider matmul output is taken as is), w [C,W]
// (tap W−1 multiplies the current token), p the batch's positions: packed rows mask the taps that
// would reach the previous document. Returns silu(conv(x)) [B,T,C] contiguous in x's dtype.
torch::Tensor fused_short_conv(const torch::Tensor& x, const torch::Tensor& w, const Positions& p);

}  // namespace model

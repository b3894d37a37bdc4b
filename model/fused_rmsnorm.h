// RMSNorm through the CUDA kernels of kernels/rmsnorm_train.h, as an autograd function: one kernel
// forward (keeping 1/rms per row), one backward for x plus a column sum for w — instead of the six
// fp32 elementwise/reduction kernels forward and about ten backward of the ATen formula, which
// stays the reference (rms_norm_reference) and the path on the CPU.
#pragma once

#include <torch/torch.h>

namespace model {

// The ATen formula: fp32 math, result in x's dtype; w undefined = weight-free.
torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& w, double eps);

// Whether the kernels take x: a CUDA build, x on a GPU in fp32 or bf16.
bool fused_rms_norm_applies(const torch::Tensor& x);

// x [..., C] (contiguous or not), w [C] fp32 or undefined. Same result as rms_norm_reference.
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

}  // namespace model

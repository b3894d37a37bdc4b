// RMSNorm through the CUDA kernels of kernels/rmsnorm_train.h, as an autograd function, with the
// pre-norm block's residual add fused in front of it: h = x + b, y = RMSNorm(h) · w in one kernel
// forward (keeping 1/rms), one backward for x, b and the weight. It replaces an fp32 add, the six
// fp32 elementwise/reduction kernels of the ATen formula and the bf16 cast autocast would apply to y
// before the next matmul. The ATen formula stays the reference and the path on the CPU.
#pragma once

#include <torch/types.h>

namespace model {

// The ATen formula: fp32 math, result in x's dtype; w undefined = weight-free.
torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& w, double eps);

struct AddNormOut {
  torch::Tensor h;  // x + b (type promotion as ATen's add), or x itself when b is undefined
  torch::Tensor y;  // RMSNorm(h) · w in the requested dtype
};

// Reference: h = x + b (b undefined: h = x), y = rms_norm_reference(h, w).to(y_dtype).
AddNormOut add_rms_norm_reference(const torch::Tensor& x, const torch::Tensor& b, const torch::Tensor& w, double eps,
                                  torch::ScalarType y_dtype);

// Same result as add_rms_norm_reference; on a GPU through the fused kernels when the dtypes allow
// (any fp32/bf16/fp16 y and b over an fp32 residual stream, or one dtype throughout).
// x, b [..., C] (b the shape of x, or undefined), w [C] or undefined.
AddNormOut fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& b, const torch::Tensor& w, double eps,
                              torch::ScalarType y_dtype);

// Plain RMSNorm in x's dtype: fused_add_rms_norm(x, {}, w, eps, x's dtype).y.
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

}  // namespace model

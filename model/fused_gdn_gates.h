// The Gated DeltaNet's per-token gates (MODEL.md §4) from the projections a and b:
//   beta = sigmoid(b) (× 2 with negative eigenvalues),  g = −exp(A_log) · softplus(a + dt_bias)
// as one op: on a GPU one CUDA kernel each way (kernels/gdn_gates.h) reading a and b from the
// projection's rows and summing the gradients of A_log and dt_bias itself, instead of about twenty
// small ATen launches (casts, exp, softplus, their backwards and two reductions) a layer;
// elsewhere, and as the reference it is tested against, the ATen formula.
#pragma once

#include <torch/types.h>

namespace model {

struct GdnGates {
  torch::Tensor beta, g;  // [B,T,H] in the math dtype
};

// a, b [B,T,H] (any float dtype; views allowed), A_log and dt_bias [H]. Math and results in ft
// (fp32 or fp64). Differentiable in all four tensors.
GdnGates gdn_gates_reference(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& A_log,
                             const torch::Tensor& dt_bias, bool neg_eig, torch::ScalarType ft);
// ab [B,T,2H]: a is ab[..., :H], b is ab[..., H:]. The kernels take a contiguous fp32, bf16 or
// fp16 ab on a GPU with fp32 A_log and dt_bias and ft fp32; anything else runs the reference.
// Any thread; bad shapes throw c10::Error.
GdnGates fused_gdn_gates(const torch::Tensor& ab, const torch::Tensor& A_log, const torch::Tensor& dt_bias,
                         bool neg_eig, torch::ScalarType ft);

}  // namespace model

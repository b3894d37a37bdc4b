// The Gated DeltaNet's L2Norm of q and k (MODEL.md §4), y = x / sqrt(Σ x² + eps) over the last dim,
// as one op: on a GPU one CUDA kernel each way (kernels/l2_norm.h) reading x in place from the
// short conv's output (a column slice, in the activations' dtype) and writing y in fp32, or in x's
// own 16-bit dtype (16-bit training: the delta rule's kernels stage 16-bit q and k as they come),
// so no cast copy of x is made either way; elsewhere, and as the reference it is tested against,
// the ATen formula.
#pragma once

#include <torch/types.h>

namespace model {

// x [B,T,H,D] (any float dtype; may be a view with unit column stride). Returns y [B,T,H,D] in
// out_dtype, computed in fp64 for an fp64 out_dtype and else in fp32 (a 16-bit y is the fp32 one
// rounded).
// Differentiable in x. Any thread; bad shapes throw c10::Error.
torch::Tensor l2_norm_reference(const torch::Tensor& x, double eps, torch::ScalarType out_dtype);
torch::Tensor fused_l2_norm(const torch::Tensor& x, double eps, torch::ScalarType out_dtype);

}  // namespace model

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

// For an op that takes L2Norm's backward into its own (the chunked delta rule's core,
// model/gdr_chunk_core.h): the forward without autograd, y as fused_l2_norm's (the same kernel on
// a GPU) and r = 1/sqrt(Σ x² + eps) per row [B·T·H] (fp32; fp64 for an fp64 out_dtype)...
struct L2NormRowsOut {
  torch::Tensor y, rstd;
};
L2NormRowsOut l2_norm_rows(const torch::Tensor& x, double eps, torch::ScalarType out_dtype);
// ... and the backward, for where that op's kernels do not take it: dx = r (dy − y Σ(y ⊙ dy)),
// y = x r, as fused_l2norm's backward computes it (the same kernel on a GPU), from x and the
// forward's r; dx in x's dtype, contiguous.
torch::Tensor l2_norm_input_grad(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& rstd);

}  // namespace model

// SwiGLU's activation on the fused gate|up projection through the CUDA kernels of
// kernels/swiglu.h, as an autograd function: one kernel forward, one backward that writes the
// gradient of the whole gate|up output (what the one fused matmul's backward wants), instead of
// silu, mul and their backward kernels. swiglu_reference is the ATen formula and the CPU path.
#pragma once

#include <torch/torch.h>

namespace model {

// gu [..., 2F] = [gate | up] -> silu(gate) · up [..., F], in gu's dtype.
torch::Tensor swiglu_reference(const torch::Tensor& gu);
// SwiGLU's gradient [dg | du] [..., 2F] for gu [..., 2F] and dh [..., F] by the ATen formula
// (kernels/swiglu.h's), in the inputs' dtype: the reference of the kernels that write or quantise it.
torch::Tensor swiglu_backward_reference(const torch::Tensor& gu, const torch::Tensor& dh);
// Same result; through the kernels on a GPU for fp32/bf16/fp16.
torch::Tensor swiglu(const torch::Tensor& gu);

// The MoE experts' SwiGLU with each row weighted by its router weight: gu [N, 2F], w [N] (fp32, or
// fp64 with an fp64 gu) -> w[n] · silu(gate) · up [N, F] in gu's dtype, computed in fp32 (fp64 for
// fp64) and rounded once. Differentiable in gu and w. The reference is the ATen formula in that
// precision; swiglu_weighted takes the kernels on a GPU for fp32/bf16/fp16 and an fp32 w.
// w_index (optional, int64 [N], a permutation of [0, N)): row n is weighted by w[w_index[n]], as if
// w.index_select(0, w_index) were passed (the MoE layer's γ in pair order, read in expert order; the
// kernels read it through the index, with no permuted copy either way).
torch::Tensor swiglu_weighted_reference(const torch::Tensor& gu, const torch::Tensor& w,
                                        const torch::Tensor& w_index = {});
torch::Tensor swiglu_weighted(const torch::Tensor& gu, const torch::Tensor& w, const torch::Tensor& w_index = {});

}  // namespace model

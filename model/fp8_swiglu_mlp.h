// The SwiGLU feed-forward y = down(silu(x W_gᵀ) ⊙ x W_uᵀ) with its products in FP8, as one autograd
// function, so that SwiGLU's activation is quantised by the kernel that computes it from gate|up,
// and its gradient by the kernel that computes that from gate|up and dh: neither is ever written in
// bf16 (the unfused layers write each in bf16 and read it back to quantise). Same products, scales
// and amax histories as the unfused fp8 layers (model/fp8_linear.h): gate|up's Fp8History for the
// first product, down's for the second. The plain twin is fp8_linear → swiglu → fp8_linear.
#pragma once

#include <torch/types.h>

#include <vector>

#include "model/fp8_linear.h"

namespace model {

// h = silu(g) · u of gu [N, 2F] (unit column stride), quantised with delayed scaling on `h`'s
// record of `role`: q [N, F], qt [F, N]. Through kernels::fp8_quantize_swiglu_delayed on a GPU;
// elsewhere (or for other dtypes) swiglu_reference then quantize_fp8_operand_delayed.
Fp8Operand quantize_swiglu_fp8_delayed(const torch::Tensor& gu, at::ScalarType fp8_type, Fp8History& h,
                                       Fp8History::Role role);

// SwiGLU's gradient [dg | du] for gu [N, 2F] and dh [N, F] (both unit column stride; dh
// contiguous), quantised likewise: q [N, 2F], qt [2F, N]. Fallback: swiglu_backward_reference then
// quantize_fp8_operand_delayed.
Fp8Operand quantize_swiglu_grad_fp8_delayed(const torch::Tensor& gu, const torch::Tensor& dh, at::ScalarType fp8_type,
                                            Fp8History& h, Fp8History::Role role);

// y = (silu(x W_gᵀ) ⊙ x W_uᵀ) W_downᵀ for x [..., d], gate|up's weight [2F, d] as row blocks (gate's
// F rows, then up's: {W_g, W_u}, read where they are) and w_down [d, F], fp32 weights; bf16 output
// [..., d]. CUDA only; fp8_swiglu_mlp_fits says when.
torch::Tensor fp8_swiglu_mlp(const torch::Tensor& x, const std::vector<torch::Tensor>& w_gate_up,
                             const torch::Tensor& w_down, Fp8History& gate_up, Fp8History& down);
// Whether SwiGLU layers under an Fp8Scope take fp8_swiglu_mlp (default) or the unfused layers
// (`deltadeck bench train --fp8-ffn unfused` measures the difference). Process-wide.
void fp8_swiglu_mlp_enabled(bool on);
bool fp8_swiglu_mlp_enabled();
// A CUDA x, gate|up's blocks of 2F rows in all and d columns, w_down [d, F], and d, F and the token
// count multiples of 16 (the fp8 products' rule).
bool fp8_swiglu_mlp_fits(const torch::Tensor& x, const std::vector<torch::Tensor>& w_gate_up,
                         const torch::Tensor& w_down);

}  // namespace model

// The MoE experts' grouped products over their fp32 weights without autograd's weight path
// (MODEL.md §3): x [M, K] (rows grouped by expert) times each expert's [Σ n_i, K] block of the
// stacked weights [E, n_i, K] (gate|up, or down alone):
//   y_e = x_e · [W1_e; W2_e; ...]ᵀ,   y [M, Σ n_i].
// Through autocast and autograd the same product cast the fp32 weights every forward (and
// concatenated gate and up), and its bf16 weight gradient was split, cast to fp32 by strided copies
// and added into .grad: about 10 ms of a moe-1b step. Here the forward multiplies with the weights'
// bf16 shadow, which our AdamW keeps current (model/weight_shadow.h), and the backward's one
// weight-gradient GEMM lands in each weight's fp32 .grad through one scatter kernel
// (kernels/block_grads.h), written after the gradients were cleared, added otherwise.
//
// As with model/mixed_linear.h, the weights' gradients bypass autograd's accumulation, so the MoE
// layer takes this path only inside a WeightGradInPlaceScope (expert_product_applies).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace model {

// Whether expert_product takes these operands here: inside an active WeightGradInPlaceScope, grad
// mode on, x [M, K] on a GPU in `dtype` (bf16 or fp16) and every weight a 3-D contiguous fp32 leaf
// of x's device that requires grad, [E, n_i, K] with one E, and the grouped GEMM takes the device
// offsets at this shape (model/grouped_linear.h).
bool expert_product_applies(const at::Tensor& x, at::TensorList weights, at::ScalarType dtype);

// y [M, Σ n_i] in `dtype`, as above; offsets [E] int32 on x's device, the end row of each expert's
// group (the last is M). x's gradient flows back through autograd; the weights' go to .grad. Any
// device: on the CPU (or a GPU without the grouped GEMM) the products loop over the groups, read
// to the host (the reference the GPU test compares with). Throws c10::Error on mismatched shapes.
at::Tensor expert_product(const at::Tensor& x, at::TensorList weights, const at::Tensor& offsets, at::ScalarType dtype);

// A weight-gradient product's output dw [E, Σ n_i, K] (or pieces [G, Σ n_i, K] with first and
// count, as sum_expert_grad_pieces takes them) into each weight's fp32 .grad: written where that is
// undefined, added otherwise. What the backward does with its gradient outside
// model/expert_grads_in_pieces.h's scope, and how that header's gradients reach .grad.
void scatter_expert_weight_grads(std::vector<at::Tensor> weights, const at::Tensor& dw, const at::Tensor& first,
                                 const at::Tensor& count);

// Process-wide switch, on by default: off, expert_product_applies is false and the MoE layer takes
// autocast and autograd's path (`bench train --expert-weights autograd`, to measure the change).
void expert_products(bool on);

// The weights' gradient product sums over each expert's rows, so with uneven routing the largest
// expert's GEMM tiles run long after the others finish (kernels/expert_grad_pieces.h). On the grouped
// GEMM the rows are therefore cut into pieces of at most this many rows per expert, and the pieces'
// partial gradients summed in fp32 on their way into .grad. The default rule: kExpertGradPieceMeans
// times the mean rows per expert, rounded up to 64 (even routing then stays one piece per expert).
constexpr int64_t kExpertGradPieceMeans = 2;
// rows > 0: pieces of at most `rows`; 0: one piece per expert (unsplit); negative: the default rule.
// Process-wide, any thread (`bench train --expert-grad-pieces`, and the tests).
void expert_grad_piece_rows(int64_t rows);
// The experts' gradients [E, N, K] (fp32) from pieces [G, N, K]: expert e's is the sum of pieces
// first[e] .. first[e] + count[e] − 1 (first, count int [E] on the pieces' device; none: zero), in
// ATen with no host sync: the path for gradients the scatter kernel (kernels/block_grads.h) does not
// take.
at::Tensor sum_expert_grad_pieces(const at::Tensor& pieces, const at::Tensor& first, const at::Tensor& count);
// The piece size the weight-gradient product uses for `rows` rows over `experts` experts (0: unsplit).
int64_t expert_grad_piece_rows_for(int64_t rows, int64_t experts);

}  // namespace model

// The token embedding lookup whose weight gradient goes straight into the weight's fp32 .grad,
// inside a WeightGradInPlaceScope (model/mixed_linear.h, the same contract: hooks on the weight do
// not see the gradient, torch::autograd::grad() does not return it). On a GPU the rows are added
// by kernels/embedding_backward.h into the gradient already there (with tied embeddings, the LM
// head's, which linear_cross_entropy writes first), instead of a fresh zero-filled [V, C] gradient
// that autograd then adds; elsewhere by index_add_.
#pragma once

#include <ATen/core/Tensor.h>

namespace model {

// Whether embedding_in_place takes (weight, tokens) here: an active WeightGradInPlaceScope, grad
// mode on, weight a 2-D fp32 CUDA leaf that requires grad, tokens int64 on its device.
bool embedding_in_place_applies(const at::Tensor& weight, const at::Tensor& tokens);

// weight[tokens] ([..., C] for tokens [...]), its weight gradient added into weight.grad (zeros
// first when undefined). Any device (the CPU for tests). Token values are checked as at::embedding
// checks them.
at::Tensor embedding_in_place(const at::Tensor& weight, const at::Tensor& tokens);

}  // namespace model

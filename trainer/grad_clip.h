// Global-norm gradient clipping with an accurate norm. torch::nn::utils::clip_grad_norm_ takes each
// tensor's fp32 `norm`, which on the CPU drifts by ~1e-4 relative on large skewed gradients (an
// embedding's); here each tensor's sum of squares uses the pairwise `sum` and the total is formed in
// fp64 (on a GPU: one fused per-tensor norm kernel, then fp64), so the plain, data-parallel and ZeRO-1 paths clip by the same number.
// A gradient whose producer recorded its sum of squares while the trainer collected them
// (model/grad_square_sums.h) is not read again: its recorded sum is taken while still valid.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace trainer {

// The .grad() of every parameter that has one, in order.
std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params);

// ‖g‖₂ over every defined .grad() of params (read once from the device).
double global_grad_norm(const std::vector<at::Tensor>& params);

// The same on the gradients' device without reading anything back (no host synchronisation): returns
// the norm as a 0-dim fp64 tensor there.
at::Tensor clip_grad_norm_async(const std::vector<at::Tensor>& params, double max_norm);

// The global norm as clip_grad_norm_async takes it, without scaling the gradients: returns (norm,
// divisor), the divisor 1 / min(1, max_norm / (norm + 1e-6)) as a 0-dim fp32 tensor on the
// gradients' device (exactly 1 when no clipping is needed), for an optimizer that divides the
// gradients as it reads them (AdamW::update) — one pass over every gradient fewer. An undefined
// divisor when max_norm is inf (nothing to clip) or there are no gradients.
std::pair<at::Tensor, at::Tensor> grad_norm_and_clip_divisor_async(const std::vector<at::Tensor>& params,
                                                                   double max_norm);

// Scales the grads by max_norm / (norm + 1e-6) when that is below 1, as clip_grad_norm_ does;
// max_norm = inf only measures. Returns the norm before clipping.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace trainer

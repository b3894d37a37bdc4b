// Activation checkpointing for LibTorch C++ (which has no torch.utils.checkpoint): run a function
// without keeping its autograd graph, and rerun it with grad on when the backward pass reaches it.
// Trades one extra forward of the wrapped function for not storing its intermediate activations.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace model {

// fn maps x to one or more outputs; it must be deterministic (no dropout, no RNG) because the
// backward pass recomputes it. Parameters fn uses receive their gradients during that recompute.
using CheckpointedFn = std::function<std::vector<torch::Tensor>(const torch::Tensor& x)>;

// Returns fn(x). When grad mode is on and x requires grad, fn runs under no-grad now and again
// with grad in the backward pass; otherwise this is a plain call. The caller's CUDA autocast
// state is captured and restored for the recompute. Any thread; errors are fn's own.
std::vector<torch::Tensor> run_checkpointed(const CheckpointedFn& fn, const torch::Tensor& x);

}  // namespace model

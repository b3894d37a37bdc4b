// Moving an MoE layer's rows between token order and expert order (model/moe.cpp), as gathers
// both ways: no scatter with atomics (index_add, or index_select's backward) and nothing that
// depends on the order atomics land in, so the layer stays deterministic. The N·k (token, slot)
// pairs are numbered pair = token·k + slot.
#pragma once

#include <torch/types.h>

namespace model {

struct ExpertOrder {
  torch::Tensor order;    // [N·k] int64: the pair at each expert-order position (stable by pair)
  torch::Tensor inverse;  // [N·k] int64: the expert-order position of each pair
  torch::Tensor token;    // [N·k] int64: order / k, the token of each expert-order position
};

// flat [N·k] int64: the expert of each pair. Sorted stably, so equal experts keep pair order.
ExpertOrder expert_order(const torch::Tensor& flat, int64_t k);

// x [N, d] -> [N·k, d] in expert order (each token's row once per slot). Backward: the k rows of
// each token gathered back and summed.
torch::Tensor dispatch_rows(const torch::Tensor& x, const ExpertOrder& o, int64_t k);

// ys [N·k, d] in expert order -> [N·k, d] in pair order. Backward: the gather the other way.
torch::Tensor combine_rows(const torch::Tensor& ys, const ExpertOrder& o);

}  // namespace model

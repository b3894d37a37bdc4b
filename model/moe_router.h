// The MoE router's tail (MODEL.md §3): softmax over the E experts' logits, the k largest
// probabilities, and their renormalisation to sum 1 when asked. On a GPU with fp32 logits (E ≤ 256,
// k ≤ 16) one kernel each way (kernels/moe_routing.h) replaces ATen's softmax, topk, sum and
// division and their backward kernels; elsewhere the reference, the same formula as ATen ops.
#pragma once

#include <torch/types.h>

namespace model {

struct RouterTopK {
  torch::Tensor probs;  // [N, E] softmax of the logits, in their dtype
  torch::Tensor idx;    // [N, k] int64, the k most probable experts in descending order
  torch::Tensor w;      // [N, k] their probabilities, divided by their sum when norm
  torch::Tensor mean_probs;  // [E] probs averaged over the N tokens (the aux loss's P)
};

// logits [N, E] (N > 0, 1 ≤ k ≤ E). Differentiable in the logits through probs, w and mean_probs.
RouterTopK router_topk(const torch::Tensor& logits, int64_t k, bool norm);
// The same as ATen ops (torch::softmax, torch::topk, a sum and a division, and probs.mean(0)).
RouterTopK router_topk_reference(const torch::Tensor& logits, int64_t k, bool norm);

}  // namespace model

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
  torch::Tensor sorted;   // [N·k] int64: the expert at each expert-order position (ascending)
  torch::Tensor counts;   // [E] int64: the pairs of each expert (when E was given)
  torch::Tensor ends;     // [E] int32: the running sum of counts, where each expert's slice ends (ditto)
};

// Assignments per expert [E] int64 from the sorted experts: the run lengths, found by binary
// search for each expert's first position. On a GPU this is two small kernels with no atomics
// (a scatter_add of N·k ones into E bins contends on E addresses: 36 µs per call at moe-1b's
// 98k pairs) and no host sync (bincount reads the max back).
torch::Tensor expert_counts_sorted(const torch::Tensor& sorted, int64_t E);

// flat [N·k] int64: the expert of each pair. Sorted stably, so equal experts keep pair order.
// With E > 0 (every expert in [0, E), as the router's picks are) also the counts and ends; on a
// GPU (E ≤ 1024) then one counting sort, three small kernels (kernels/moe_routing.h).
ExpertOrder expert_order(const torch::Tensor& flat, int64_t k, int64_t E = 0);
// The same by ATen ops: a stable sort, a scatter for the inverse, a binary search for the counts.
ExpertOrder expert_order_reference(const torch::Tensor& flat, int64_t k, int64_t E = 0);

// x [N, d] -> [N·k, d] in expert order (each token's row once per slot; on a GPU one warp a row,
// kernels/moe_routing.h). Backward: the k rows of each token gathered back and summed.
torch::Tensor dispatch_rows(const torch::Tensor& x, const ExpertOrder& o, int64_t k);

// The MoE layer's input u [N, d] (fp32) for its three readers, in two steps, since the router reads
// one of them before the order the others are laid out in exists:
//   moe_inputs_open  (before routing): router = u itself, experts and rows allocated;
//   moe_inputs_fill  (after routing):  experts = u in `dtype` (the shared expert's; only when
//                    with_experts), rows = u's k copies a token in expert order, [N·k, d] in `dtype`.
// Backward: the router's, the shared expert's and the rows' gradients summed into u's in fp32, in
// one pass. Taken (moe_inputs_fused) on a GPU for an fp32 u, a 16-bit dtype and k ≤ 16, with one
// kernel each way (kernels/moe_fan.h); otherwise the MoE layer casts and dispatches as separate ops.
// The open step's outputs must not be read before the fill. Any thread; throws c10::Error on a
// shape or device mismatch.
struct MoEInputs {
  torch::Tensor router;   // [N, d] fp32: u
  torch::Tensor experts;  // [N, d] in dtype, or undefined without with_experts
  torch::Tensor rows;     // [N·k, d] in dtype, expert order
  torch::Tensor inverse;  // [N·k] int64: the order's inverse, copied in by the fill for the backward
};
bool moe_inputs_fused(const torch::Tensor& u, int64_t k, c10::ScalarType dtype);
MoEInputs moe_inputs_open(const torch::Tensor& u, int64_t k, c10::ScalarType dtype, bool with_experts);
void moe_inputs_fill(MoEInputs& in, const torch::Tensor& u, const ExpertOrder& o);
// Process-wide switch, on by default: off, moe_inputs_fused is false (`bench train --moe-inputs
// separate`, to measure the change).
void moe_inputs_fusion(bool on);

// ys [N·k, d] in expert order -> [N·k, d] in pair order. Backward: the gather the other way.
torch::Tensor combine_rows(const torch::Tensor& ys, const ExpertOrder& o);

// y [N, d] = add[t] + Σ_j ys[inverse[t·k + j]]: the expert rows back in token order and summed over
// the k slots (their router weights already applied, model/fused_swiglu.h's swiglu_weighted), plus
// `add` [N, d] when given. On a GPU (k ≤ 16, add like ys) the combine kernel forward and the fan-out
// kernel backward (kernels/moe_fan.h: each expert row gets its token's gradient, one read of each);
// elsewhere combine_rows and a sum. Differentiable in ys and add.
torch::Tensor combine_sum(const torch::Tensor& ys, const ExpertOrder& o, int64_t k, const torch::Tensor& add = {});

// y [N, d] = add[t] + Σ_j γ[t, j] · ys[inverse[t·k + j]]: the expert rows back in token order,
// weighted by the router's γ [N, k] and summed over the k slots, in ys' dtype, plus `add` [N, d]
// when given (the shared expert's output). On a GPU (fp32 γ, k ≤ 16, add like ys) one kernel each
// way (kernels/moe_combine.h), summing in fp32 and rounding once; elsewhere the reference.
// Differentiable in ys, γ and add.
torch::Tensor combine_weighted(const torch::Tensor& ys, const ExpertOrder& o, const torch::Tensor& gamma,
                               const torch::Tensor& add = {});
// The same as ATen ops: combine_rows, a multiply by γ (cast to ys' dtype), a sum over k, then
// add + that sum.
torch::Tensor combine_weighted_reference(const torch::Tensor& ys, const ExpertOrder& o, const torch::Tensor& gamma,
                                         const torch::Tensor& add = {});

}  // namespace model

// MoE expert weights whose gradients stay in their product's 16-bit pieces for the optimizer.
// Written to .grad, each expert weight's gradient costs a scatter kernel (read the bf16 pieces,
// write fp32: 6 bytes a parameter) and then AdamW's read of the fp32 values (4 bytes): for moe-1b's
// 0.9 B expert parameters 2.0 ms and 1.2 ms of a step. Left in the pieces, the clipping norm sums
// their squares in one read (2 bytes a parameter) and our AdamW kernel reads them once more (2
// bytes, kernels/adamw.h's AdamWGradPieces): the same fp32 values, so the same update.
//
// Only a step whose gradients nobody else reads may leave them there: the trainer opens the scope
// below for one rank, one micro-batch a step, no loss scaling and our AdamW as the only optimizer
// with the clip folded into its update. Inside the scope the experts' backward (model/expert_product.h)
// leaves .grad undefined and records the pieces here; AdamW takes them (expert_grad_pieces_of), and
// the norm takes their recorded sums of squares (recorded_grad_square_sum, model/grad_square_sums.h).
// A consumer that cannot read pieces calls materialize_expert_grad_pieces, which writes them into
// .grad as the backward would have. The scope's end forgets what is left (a skipped step's gradients).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace model {

// One weight's gradient in pieces: its rows [row0, row0 + rows) of every piece of `pieces`
// [G, Σ n_i, K] (bf16 or fp16, contiguous); expert e's gradient is the fp32 sum of pieces
// first[e] .. first[e] + count[e] − 1 (int32 [E] on the device), or piece e alone when first is
// undefined. square_sum: ‖gradient‖², 0-dim fp64.
struct ExpertGradPieces {
  at::Tensor pieces, first, count;
  int64_t row0 = 0, rows = 0;
  at::Tensor square_sum;
};

// Leaves the experts' gradients in pieces on `device` for the scope's life when `on` (and the
// process-wide switches below and producer_grad_square_sums allow it); the outermost scope's end
// forgets any left. Scopes nest.
class ExpertGradsInPiecesScope {
 public:
  ExpertGradsInPiecesScope(const at::Device& device, bool on);
  ~ExpertGradsInPiecesScope();
  ExpertGradsInPiecesScope(const ExpertGradsInPiecesScope&) = delete;
  ExpertGradsInPiecesScope& operator=(const ExpertGradsInPiecesScope&) = delete;

 private:
  at::Device device_;
  bool on_;
};

// Whether the experts' backward on `device` should leave its gradients in pieces now.
bool expert_grads_in_pieces(const at::Device& device);

// Records the gradients of `weights` (one product's, in order, their rows consecutive in the
// pieces) with each one's sum of squares (sums: fp64 [weights.size()]).
void record_expert_grad_pieces(const std::vector<at::Tensor>& weights, const at::Tensor& pieces, const at::Tensor& first,
                               const at::Tensor& count, const at::Tensor& sums);

// The gradient of `param` left in pieces, or nullptr. The pointer stays valid until the scope ends
// or the gradients are materialized.
const ExpertGradPieces* expert_grad_pieces_of(const at::Tensor& param);

// Writes every recorded gradient into its weight's .grad (added where .grad is defined, as the
// backward's scatter would), then forgets them: for a consumer that reads .grad only. The weights
// of one product go in one scatter. Returns how many weights were written.
int64_t materialize_expert_grad_pieces();
// The same for the products that `weights` belong to (before another backward adds to them).
void materialize_expert_grad_pieces(const std::vector<at::Tensor>& weights);

// How many products have left their gradients in pieces in this process (the tests' proof that a
// run took this path).
int64_t expert_grad_pieces_recorded();

// For a consumer that reads .grad where it is defined: writes out (adds into .grad) the pieces of
// every product one of whose weights among `params` has both a defined .grad and pieces, so no
// part of a gradient is left behind.
void materialize_expert_grad_pieces_beside_grads(const std::vector<at::Tensor>& params);

// Drops the pieces of the products these weights belong to, unapplied (zero_grad).
void forget_expert_grad_pieces(const std::vector<at::Tensor>& weights);

// Process-wide switch, on by default: off, no scope leaves gradients in pieces (`bench train
// --expert-grads scatter`, to measure the change).
void expert_grads_in_pieces_allowed(bool on);

}  // namespace model

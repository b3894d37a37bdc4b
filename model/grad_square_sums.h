// Gradients' sums of squares computed by the kernels that wrote the gradients. The clipping norm
// reads every fp32 gradient once more (`_foreach_norm`): for moe-1b 1.06 B of them, 1.6 ms of a
// step, and the experts' are 85% of those. Their scatter kernel (kernels/block_grads.h) already
// holds each value it writes, so it sums the squares as it goes, and the norm takes the recorded
// sum instead of reading that gradient again (trainer/grad_clip.h).
//
// A recorded sum describes the gradient as it was written. It is used only while that still holds:
// the parameter's .grad is the same tensor (held while recorded) with the version counter it had
// then. An ATen op on the gradient (the loss scaler's unscale, an accumulation through autograd, a
// zero fill) bumps the version; NCCL's all-reduce and other raw writers do not, so the trainer
// collects sums only where nothing else touches the gradients between backward and the norm: one
// rank, no loss scaling. Collection is off unless the trainer turns it on for its device, and its
// outermost start and end drop what was recorded.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace model {

// Starts (on = true) or ends collection for `device`. Starts and ends nest (an inner pair leaves
// the outer collection on); the outermost start and end forget every sum recorded there.
void collect_grad_square_sums(const at::Device& device, bool on);

// Whether producers on `device` should record their sums now.
bool grad_square_sums_collecting(const at::Device& device);

// Producer: ‖grad‖² of `param` is `square_sum` (0-dim, fp64, on grad's device), grad being
// param's .grad as it is now. Ignored unless collecting on grad's device. Any thread (autograd's
// device threads record; the trainer's thread reads).
void record_grad_square_sum(const at::Tensor& param, const at::Tensor& square_sum);

// Consumer: the recorded ‖grad‖² of param's current .grad, or an undefined tensor when none was
// recorded or the gradient has changed since (another tensor, or its version). For a parameter
// without .grad whose gradient was left in pieces (model/expert_grads_in_pieces.h), that gradient's
// sum; none for one with both (write the pieces out first).
at::Tensor recorded_grad_square_sum(const at::Tensor& param);

// Collection on `device` for the scope's life (from a step's first backward through its norm), so
// an exception in between cannot leave it on for a later run. Does nothing when `on` is false or
// the process-wide switch below is off.
class GradSquareSumsScope {
 public:
  GradSquareSumsScope(const at::Device& device, bool on);
  ~GradSquareSumsScope();
  GradSquareSumsScope(const GradSquareSumsScope&) = delete;
  GradSquareSumsScope& operator=(const GradSquareSumsScope&) = delete;

 private:
  at::Device device_;
  bool on_;
};

// How many times recorded_grad_square_sum has handed out a sum in this process (the tests' proof
// that a step's norm took them).
int64_t grad_square_sums_taken();

// Process-wide switch, on by default: off, no scope collects and the norm reads every gradient
// (`bench train --grad-norm read`, to measure the change).
void producer_grad_square_sums(bool on);
bool producer_grad_square_sums_allowed();

}  // namespace model

// AdamW with decoupled weight decay, written out so its state is plain named tensors that
// checkpoints save and restore exactly (same update as torch.optim.AdamW, tested against it).
// On CUDA the update is one multi-tensor kernel of ours (kernels/adamw.h), or ATen's fused one
// (torch.optim.AdamW(fused=True)) where ours does not take the tensors; the written-out
// single-tensor path is their reference.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  // named_params: (name, parameter) pairs; decay[i] says whether parameter i gets weight decay.
  AdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<bool> decay, AdamWOptions opt);
  // One update with learning rate lr from the parameters' current .grad(); parameters without a
  // grad are skipped. Worker thread only. The same as begin_step(lr) then update(grad_divisor).
  void step(double lr, const at::Tensor& grad_divisor = {});
  // The two halves of step(), for a step captured as a CUDA graph: begin_step counts the step and
  // writes lr where the update reads it (on a GPU, a device scalar), every step outside the graph;
  // update() launches the update itself, the part a graph records and replays.
  // `grad_divisor` (0-dim fp32 on the parameters' device, optional): the update reads every gradient
  // divided by it — gradient clipping without a pass of its own (grad_clip.h).
  void begin_step(double lr);
  void update(const at::Tensor& grad_divisor = {});
  // Whether the update is a fused CUDA kernel.
  bool fused() const { return fused_; }
  // Process-wide: whether CUDA updates take kernels/adamw.h's kernel (the default) or ATen's fused
  // one (`bench train --adamw aten`, to measure the change). Set before training starts.
  static void use_own_kernel(bool on);
  // Drops every gradient, those left in pieces (model/expert_grads_in_pieces.h) included.
  void zero_grad();
  int64_t steps_taken() const { return steps_; }
  // "exp_avg.<name>" and "exp_avg_sq.<name>" for every parameter, for checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Restores state saved by state_tensors(); throws std::runtime_error naming a missing or
  // mis-shaped tensor.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps);

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<at::Tensor> param_tensors() const;  // params_' tensors, in order
  std::vector<bool> decay_;
  void fused_update(const at::Tensor& grad_divisor);
  bool own_kernel_update(const at::Tensor& grad_divisor);  // false: the tensors do not suit it

  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  bool fused_ = false;                 // CUDA parameters: the fused kernel
  at::Tensor step_device_;               // fused paths: the step count, fp32 on the device (both kernels
                                         // read it for the bias corrections; ATen's as every tensor's count)
  at::Tensor lr_device_;                 // fused path: fp32 scalar the kernel reads the lr from
  double lr_ = 0;                        // the lr of the current step (begin_step)
  AdamWOptions opt_;
  int64_t steps_ = 0;
};

}  // namespace trainer

// ZeRO stage 1 (run.zero1): the AdamW state is sharded across the ranks. All parameters are viewed
// as one flat fp32 vector padded to a multiple of the world size; rank r owns the r-th slice. A step
// reduce-scatters the summed gradients (each rank receives its slice), unscales and checks them for
// inf/NaN, clips by the global norm, updates its slice of the weights with AdamW (the same math as
// trainer::AdamW, decay per element by a mask), and all-gathers the updated slices into every
// rank's parameters. Optimizer memory per rank falls by the world size.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "trainer/adamw.h"

namespace trainer {

class Communicator;

class ShardedAdamW {
 public:
  ShardedAdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<bool> decay,
               AdamWOptions opt, Communicator& comm);

  struct StepResult {
    bool found_inf = false;  // some gradient was inf/NaN: nothing was updated (checked steps only)
    // Global norm before clipping (of the unscaled, averaged gradient): on the host for a checked
    // step (NaN otherwise), and always as a float64 scalar on the parameters' device.
    double grad_norm = 0;
    at::Tensor grad_norm_tensor;
  };
  // One step from the parameters' local .grad() (summed over this rank's micro-steps, scaled by
  // loss_scale): averages across ranks, unscales, clips to max_norm (inf = off), updates. Every rank
  // must call it. Worker thread.
  // check_nonfinite: the step reads the norm and an inf/NaN count back to the host and updates
  // nothing when a gradient is not finite (the loss scaler's steps, and the runs that decide on a
  // bad step within it: trainer/train_loop.cpp's decide_in_step_). Off, nothing is read back (the
  // host queues on while the GPU computes), the clip is worked out on the device, and a non-finite
  // gradient goes into the update as it does without ZeRO-1, to be judged a step later.
  StepResult step(double lr, double loss_scale, double max_norm, bool check_nonfinite = true);
  int64_t steps_taken() const { return steps_; }
  // The full "exp_avg.<name>"/"exp_avg_sq.<name>" tensors, gathered from every rank (checkpoints
  // written by rank 0 read the same with or without ZeRO). Every rank must call it.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors();
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps);
  // Elements of optimizer state this rank holds (2 × its slice), for the memory claim.
  int64_t state_numel() const { return 2 * exp_avg_.numel(); }

 private:
  at::Tensor flatten(const std::vector<at::Tensor>& parts) const;  // padded flat copy
  at::Tensor my_slice(const std::vector<at::Tensor>& parts) const;  // this rank's part of flatten(parts), copied
  void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& into) const;

  std::vector<std::pair<std::string, at::Tensor>> params_;
  AdamWOptions opt_;
  Communicator& comm_;
  int64_t total_ = 0, shard_ = 0;  // real elements; slice length per rank
  at::Tensor decay_mask_;          // this rank's slice: 1 where weight decay applies
  at::Tensor exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

}  // namespace trainer

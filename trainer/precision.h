// train.precision applied to a forward pass: bf16/fp16 autocast on the run's device type, and for
// fp8 bf16 autocast plus float8 products in the linear layers. The backward runs outside the scope
// (autograd follows the forward's dtypes; activation checkpointing re-applies the forward's state).
// `weight_grads_in_place`: the linear layers' low-precision products also write their weight
// gradients straight into the fp32 .grad (model/mixed_linear.h), their GEMMs on the device's
// weight-gradient stream; only where nothing hooks the weights' gradient accumulation, and the
// caller joins that stream (model::join_weight_grad_stream) after backward.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace trainer {

class ForwardPrecision {
 public:
  // `graph_step`: the step is captured as a CUDA graph (the in-place products' GEMMs then run
  // without cuBLAS's workspace, model/mixed_linear.h).
  ForwardPrecision(const std::string& precision, const c10::Device& device, bool weight_grads_in_place = false,
                   bool graph_step = false);
  ~ForwardPrecision();
  ForwardPrecision(const ForwardPrecision&) = delete;
  ForwardPrecision& operator=(const ForwardPrecision&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainer

// Exponential moving average of the weights: ema ← decay·ema + (1−decay)·w, in place on the
// parameters' device after each optimizer step. Evaluation swaps the EMA tensors into the
// parameters by pointer (Tensor::set_data) and swaps them back when the guard goes away — also
// when evaluation throws — so no weight is ever copied and the originals come back bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace trainer {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

class Ema {
 public:
  // Starts as a copy of params (the one copy EMA costs: its own storage). decay in [0, 1).
  Ema(const NamedParams& params, double decay);
  // One update from the current parameter values. Step-loop thread.
  void update();
  double decay() const { return decay_; }

  // While alive, the parameters hold the EMA values and the EMA holds the trained ones.
  class Swap {
   public:
    explicit Swap(Ema& ema);
    ~Swap();
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;

   private:
    Ema& ema_;
  };

  // "ema.<name>" tensors for checkpoints, and back (throws std::runtime_error naming a missing or
  // mis-shaped tensor).
  NamedParams state_tensors() const;
  void load_state(const NamedParams& tensors);

 private:
  void swap_all();
  NamedParams params_;              // the live parameters (shared storage with the model)
  std::vector<at::Tensor> shadow_;  // the EMA values, one per parameter
  double decay_;
};

}  // namespace trainer

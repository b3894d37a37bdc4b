// Where a step's GPU time goes: the PyTorch (Kineto) profiler around a few training steps, its GPU
// kernels summed by component (matmul, attention, elementwise, ...) and by kernel, as a text table;
// the full trace is saved for chrome://tracing / Perfetto. For `deltadeck bench train --profile`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace trainer {

// The component a GPU kernel's time is counted under, from its name: our kernels by the layer part
// they belong to (the delta rule, the short conv and gates, norms, RoPE, SwiGLU, MoE routing, FP8
// quantisation), the libraries' by what they do (cuBLAS's GEMMs "matmul", cuDNN's and flash's
// "attention"), ATen's by kind; "other" for the rest.
std::string profile_component_of(const std::string& kernel_name);

class StepProfile {
 public:
  // Starts collecting CPU ops, and GPU kernels (all threads, CUPTI) when `gpu_index` >= 0; the
  // report counts the kernels of that GPU only (other ranks' GPUs run the same work). `shapes`:
  // the trace also records each op's input shapes (for a saved trace, to tell which tensors a
  // kernel worked on; it slows the host side of the profiled steps).
  static std::unique_ptr<StepProfile> start(int gpu_index, bool shapes = false);
  ~StepProfile();
  // Stops, writes the trace to trace_path (JSON) and returns the table, times per step, listing
  // the `top` kernels with the most GPU time.
  std::string stop(const std::string& trace_path, int64_t steps, double wall_ms_per_step, int64_t top = 20);

 private:
  StepProfile() = default;
  bool running_ = false;
  int gpu_index_ = -1;
};

}  // namespace trainer

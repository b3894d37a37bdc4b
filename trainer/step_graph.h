// The training step as one captured CUDA graph (train.cuda_graph): its kernels are recorded once
// and replayed every step, so the host no longer launches hundreds of kernels per step and the GPU
// never waits for it between them. A replay reads and writes exactly the device memory the capture
// saw: the step's inputs live in fixed tensors the host fills before each replay, its outputs in
// tensors the capture allocated, and everything else the step changes in place (parameters,
// gradients, optimizer state). Which runs may use it: trainer/step_graph_policy.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace trainer {

class StepGraph {
 public:
  // For the CUDA device `device_index`. Throws std::runtime_error in a build without CUDA.
  explicit StepGraph(int device_index);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs fn with the graph's own stream current, after all work queued so far on the current stream
  // and before any queued after: the warm-up steps before the capture run here, so the libraries'
  // handles and workspaces for that stream exist before it is captured.
  void run_on_graph_stream(const std::function<void()>& fn);

  // Records fn's device work without running it. A capture that fails (fn does something a graph
  // cannot hold: a host synchronisation, a copy from pageable memory) is ended and discarded, and the
  // error rethrown; captured() then stays false.
  void capture(const std::function<void()>& fn);

  // Runs the recorded work on the current stream.
  void replay();

  bool captured() const;

  // Bytes the graph's private memory pool holds but no live tensor uses: the activations and
  // temporaries every replay writes. The caching allocator counts them as reserved, not allocated,
  // so a replayed step's true peak is the allocated peak plus this. 0 before the capture.
  int64_t pool_idle_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer

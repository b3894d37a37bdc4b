// When the training step may run as a captured CUDA graph (train.cuda_graph, trainer/step_graph.h).
// A graph replays the kernels and the device addresses it recorded, so every step must have the
// same shapes and make no decision on the host between its kernels. Packed batches qualify: their
// cu_seqlens are padded to a fixed length and the Gated DeltaNet layers' chunk plans kept at a fixed
// size in fixed device buffers (trainer/graph_inputs.h), where the layers' state scan runs as its
// kernel. Torch-free, so the rules are tested on any machine (tests/trainer/test_step_graph_policy.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "trainer/api.h"

namespace trainer {

// What the run found at start-up that the config alone does not say.
struct StepGraphFacts {
  bool cuda = false;            // the rank trains on a GPU
  int64_t world = 1;            // ranks in the run
  bool loss_scaling = false;    // the dynamic loss scaler is on (fp16, or train.loss_scaling = "dynamic")
  bool decide_in_step = false;  // the step guard reads the loss back before the update
  bool faults_armed = false;    // DELTADECK_FAULT is set (test faults act between the step's kernels)
  // The MoE layers' grouped GEMMs take device offsets (bf16 on sm90/sm100, model/grouped_linear.h),
  // so no token count is read on the host.
  bool moe_counts_on_device = false;
  // The Gated DeltaNet layers' state scan runs as its kernel for model.gdn_chunk and model.gdn_dk
  // (kernels::gdr_scan_supports), which reads a packed batch's chunk plan from device buffers; the
  // scan's ATen loop sizes its steps on the host.
  bool gdn_scan_kernel = true;
};

// Empty when the step can be captured; otherwise why not, naming the config key or condition, in
// words a log line can carry ("the run has 2 ranks: ..."). Checks train.cuda_graph = "off" first.
std::string step_graph_blocker(const RunConfig& cfg, const StepGraphFacts& facts);

}  // namespace trainer

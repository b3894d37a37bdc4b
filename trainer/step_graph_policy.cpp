#include "trainer/step_graph_policy.h"

namespace trainer {

std::string step_graph_blocker(const RunConfig& cfg, const StepGraphFacts& f) {
  if (cfg.train.cuda_graph == "off") return "train.cuda_graph is \"off\"";
  if (!f.cuda) return "the run trains on the CPU";
  if (f.world > 1)
    return "the run has " + std::to_string(f.world) + " ranks (its gradient all-reduce runs outside a graph)";
  if (f.loss_scaling)
    return std::string("dynamic loss scaling is on (") +
           (cfg.train.loss_scaling == "dynamic" ? "train.loss_scaling is \"dynamic\""
                                                : "train.precision \"" + cfg.train.precision + "\" scales the loss") +
           "): it decides each step's skip on the host";
  if (f.decide_in_step)
    return "train.nonfinite or train.spike_action is \"skip\": the skip is decided on the host inside the step";
  if (cfg.train.phases.size() > 1) return "train.phases changes the batch shape during the run";
  if (cfg.data.document_attention && cfg.model.pattern.find('G') != std::string::npos && !f.gdn_scan_kernel)
    return "data.document_attention is on and the Gated DeltaNet layers' state scan runs as ATen steps sized on "
           "the host for each batch (model.gdn_chunk = " + std::to_string(cfg.model.gdn_chunk) +
           " and model.gdn_dk = " + std::to_string(cfg.model.gdn_dk) +
           " are outside what its kernel takes: chunks up to 128, dk a multiple of 4 up to 256)";
  if (cfg.model.moe_experts > 0 && !f.moe_counts_on_device)
    return "model.moe_experts > 0 and the experts' grouped GEMMs need their token counts on the host "
           "(they stay on the device only in bf16 on sm90/sm100 GPUs)";
  if (f.faults_armed) return "DELTADECK_FAULT is set";
  return "";
}

}  // namespace trainer

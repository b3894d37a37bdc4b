// Which optimizer treatment each parameter gets, by name and rank (number of dimensions). Shared by
// the step loop and the tests that step a reference model by hand.
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

// No weight decay on norms, biases and embeddings (the tied head is the embedding).
inline bool gets_weight_decay(const std::string& name, int64_t dim) {
  return dim >= 2 && name.rfind("emb.", 0) != 0 && name != "lm_head";
}

// The hidden matrices: 2-D weights inside the blocks (Muon's parameters, and μP's scaled group),
// the Gated DeltaNet's gate projections (wa, wb) and the MoE router included: each is a map
// between spaces. Not: the embedding/head, norms and 1-D gate parameters (A_log, dt_bias), the
// GDN conv taps (per-channel filters), and the MoE experts' stacked [E, ...] weights (3-D).
inline bool is_hidden_matrix(const std::string& name, int64_t dim) {
  return dim == 2 && name.rfind("blocks.", 0) == 0 && name.find(".conv_") == std::string::npos;
}

// The MoE experts' stacked weights [E, rows, cols] inside the blocks: a matrix per expert.
inline bool is_expert_stack(const std::string& name, int64_t dim) {
  return dim == 3 && name.rfind("blocks.", 0) == 0;
}

// Muon's parameters: the hidden matrices, and with `experts` (train.muon_experts) the experts'
// stacks, each expert's matrix orthogonalised by itself (trainer/muon.h). μP's scaled group stays
// the hidden matrices alone.
inline bool takes_muon(const std::string& name, int64_t dim, bool experts) {
  return is_hidden_matrix(name, dim) || (experts && is_expert_stack(name, dim));
}

}  // namespace trainer

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

// The hidden matrices: 2-D weights inside the blocks (Muon's parameters, and μP's scaled group).
// The embedding/head, norms, gates and the GDN conv taps (per-channel filters, not maps between
// spaces) are not.
inline bool is_hidden_matrix(const std::string& name, int64_t dim) {
  return dim == 2 && name.rfind("blocks.", 0) == 0 && name.find(".conv_") == std::string::npos;
}

}  // namespace trainer

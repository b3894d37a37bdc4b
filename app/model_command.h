// `deltadeck model info`: sizes of a preset without building it — parameters (total and active
// per token), training FLOPs per token (MODEL.md §9-§10) and estimated activation memory.
#pragma once

#include <cstdint>
#include <string>

namespace app {

struct ModelInfoArgs {
  std::string preset = "tiny";
  std::string family = "hybrid";
  int64_t seq_len = 0;     // 0: the preset's training context
  int64_t vocab_size = 0;  // 0: the preset's vocabulary
};

// Prints the figures; returns the exit code (2 for an unknown preset or family). Main thread.
int model_info(const ModelInfoArgs& args);

}  // namespace app

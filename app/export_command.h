// `deltadeck export RUN [--step N] [--ema] --out DIR`: a recorded run's checkpoint as
// model.safetensors + config.json for use outside deltadeck.
#pragma once

#include <cstdint>
#include <string>

namespace app {

struct ExportArgs {
  std::string runs_dir = "runs";
  std::string run;        // id, name or unique prefix
  int64_t step = -1;      // -1: the newest complete checkpoint
  std::string out;
  bool ema = false;
  bool force = false;     // replace an export already in --out
};

// Returns the exit code: 0 written, 2 bad arguments (unknown run or step), 1 other failures.
int run_export(const ExportArgs& args);

}  // namespace app

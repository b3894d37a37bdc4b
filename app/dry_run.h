// `deltadeck train --dry-run`: the check a cluster user runs before queueing a job. The config has
// already been validated and resolved (every data source opened and checked) by the train command;
// this prints what the run would be — data (files, bytes, tokens where cheap), model (parameters,
// FLOPs per token; built on the CPU when its weights are small), devices, estimated memory per
// device and the planned schedule — and starts nothing: no database, no folder, no training.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/api.h"

namespace app {

struct DryRunInfo {
  std::string where;        // "the demo config", the config path, or "run 'x' (id 3)" for --resume
  std::string resume_from;  // the checkpoint a --resume would continue from
  int nnodes = 1;
};

// Prints the report to stdout; returns 0, or 2 (the problem on stderr) when the loader cannot make
// the data split. Main thread. Throws std::runtime_error only for a broken
// build (the model failing to construct from a validated config).
int dry_run(const trainer::RunConfig& cfg, const DryRunInfo& info);

// ---- the parts that need LibTorch (app/dry_run_torch.cpp)

// The devices run.devices names here, one line each ("cpu", "cuda:0 (NVIDIA H100 ...)"), and the
// dense peak TFLOP/s of the first for the precision (run.peak_tflops if set; 0 = unknown).
struct DryRunDevices {
  std::vector<std::string> names;
  double peak_tflops = 0;
};
DryRunDevices probe_devices(const trainer::RunConfig& cfg);
// The data split as the run's loader makes it (rank 0 of one): document counts and the validation
// batches, or the loader's error (an empty or too small validation split), which the run would
// otherwise meet only after it was recorded.
struct DryRunSplit {
  int64_t train_documents = 0, val_documents = 0, val_batches = 0, val_tokens = 0;
  std::string error;
};
DryRunSplit probe_split(const trainer::RunConfig& cfg);
// Builds the model on the CPU and returns its parameter count (Σ numel), or -1 without building it
// when its fp32 weights would exceed max_bytes.
int64_t built_param_count(const trainer::RunConfig& cfg, int64_t max_bytes);

}  // namespace app

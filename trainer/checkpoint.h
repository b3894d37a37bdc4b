// Checkpoints: one directory per saved step, committed atomically.
//   <root>/step_00000100/model.safetensors   weights by parameter name (fp32)
//                                            (metadata "config.toml": the run's resolved config)
//                        state.safetensors   optimizer moments, RNG state; metadata: step, tokens,
//                                            loader position, optimizer steps
//                        manifest.json       per-file bytes and sha256, written last
// Everything is written into "step_XXXXXXXX.tmp", each file fsynced, the manifest fsynced, the
// directory renamed into place and the parent fsynced: a directory named step_* is complete.
// Loading checks every file against the manifest before reading it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct CheckpointData {
  int64_t step = 0;                         // optimizer steps completed
  NamedTensors weights;                     // model parameters
  NamedTensors state;                       // optimizer and RNG tensors
  std::map<std::string, std::string> meta;  // scalars as strings (tokens, loader position, ...)
  std::string config_toml;                  // the run's resolved config, so a checkpoint alone rebuilds its model
};

struct SavedCheckpoint {
  std::string dir;
  int64_t bytes = 0;       // all files of the checkpoint
  std::string sha256;      // of model.safetensors
};

// Writes a checkpoint of `data` under root (created if missing). Replaces an existing checkpoint
// of the same step only after the new one is complete. Throws std::runtime_error naming the file
// and errno on any I/O failure, leaving older checkpoints untouched. Worker thread.
SavedCheckpoint save_checkpoint(const std::string& root, const CheckpointData& data);

// Writes tensors (any device; copied to the host) as one safetensors file with string metadata;
// returns its size. Throws std::runtime_error naming the file on I/O failure.
int64_t write_weights_file(const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& meta);

// Reads a checkpoint directory after verifying every file's size and sha256 against the manifest.
// Throws std::runtime_error naming the damaged file and expected vs actual values.
CheckpointData load_checkpoint(const std::string& dir);

// The checkpoint a user means by `path`: a step directory (has manifest.json) as is, or the newest
// complete checkpoint under path/checkpoints or path itself. Throws std::runtime_error naming path.
std::string find_checkpoint(const std::string& path);

// Complete checkpoint directories under root, oldest step first (".tmp" ones are ignored).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);

// Deletes all but the newest `keep` checkpoints and the one of protected_step (the best by
// validation loss; -1 = none); returns the steps removed.
std::vector<int64_t> prune_checkpoints(const std::string& root, int64_t keep, int64_t protected_step = -1);

}  // namespace trainer

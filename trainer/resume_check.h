// What a checkpoint must share with the run that resumes from it, checked from its manifest alone,
// before any tensor is read or any model built: the model's shape (every [model] key that decides a
// parameter's shape or existence, vocabulary included), the training dtype (train.precision) and
// the world size (each rank's data position is its own). A mismatch is refused naming the field
// and both values; keys that only change behaviour (rope_theta, activation_checkpointing, ...) may
// change on resume. No torch here: the command line checks before starting the engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/api.h"

namespace trainer {

// The fields as recorded in a checkpoint's manifest ("compat"): "model.d" -> "64",
// "model.family" -> "\"gpt\"", "train.precision" -> "\"bf16\"", "world_size" -> "2" (values as
// JSON text). world_size: ranks over every node. Any thread; never fails.
std::map<std::string, std::string> resume_fingerprint(const RunConfig& cfg, int64_t world_size);

// One line per differing field: "model.d: the checkpoint has 64, this run has 128". Fields only one
// side records (a checkpoint from an older deltadeck) are not compared. Any thread.
std::vector<std::string> resume_mismatches(const std::map<std::string, std::string>& checkpoint,
                                           const std::map<std::string, std::string>& run);

}  // namespace trainer

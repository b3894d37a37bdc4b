// The one parser and validator of run configs, shared by the command line and the GUI:
// TOML text + `--set section.key=value` overrides -> a typed RunConfig, or every problem at once.
#pragma once

#include <string>
#include <vector>

#include "trainer/api.h"

namespace trainer {

struct ConfigResult {
  RunConfig config;
  std::vector<std::string> errors;  // each "key: what is wrong (got X; allowed Y)"; empty = valid
  bool ok() const { return errors.empty(); }
};

// Parses TOML text (source_name is used in messages, e.g. the file path) and applies overrides
// of the form "section.key=value" (values in TOML syntax; a bare word is taken as a string).
// Unknown keys, wrong types, out-of-range values and contradictions are all reported; nothing throws.
// Any thread may call it.
ConfigResult parse_config(const std::string& toml_text, const std::string& source_name,
                          const std::vector<std::string>& overrides);
// Reads the file then parses; a missing/unreadable file is reported as an error naming the path.
ConfigResult load_config(const std::string& path, const std::vector<std::string>& overrides);

// Checks a typed config (also used by the GUI on its draft). Lines like "train.lr: must be > 0 (got -1)".
std::vector<std::string> validate(const RunConfig& c);

// One progressive-training phase (train.phases): from `tokens` training tokens on, rows of
// seq_len tokens and micro-batches of batch_size rows.
struct Phase {
  int64_t tokens = 0;
  int64_t seq_len = 0;
  int64_t batch_size = 0;
};
// The phases of a config: train.phases parsed, or one phase of train.seq_len × train.batch_size.
// Problems ("train.phases: ...") are appended to errors when given; bad entries are skipped.
std::vector<Phase> resolve_phases(const TrainConfig& t, std::vector<std::string>* errors = nullptr);

// The folder of the run named `name` (its checkpoints go to <folder>/checkpoints): under
// run.checkpoint_dir when that is set, else beside the database under run.runs_dir.
std::string run_folder(const RunConfig& c, const std::string& name);

// The resolved config, every key, in TOML and JSON (what the run records store).
std::string to_toml(const RunConfig& c);
std::string to_json(const RunConfig& c);

}  // namespace trainer

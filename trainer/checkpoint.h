// Checkpoints: one directory per saved step, committed atomically.
//   <root>/step_00000100/model.safetensors   weights by parameter name (fp32)
//                                            (metadata "config.toml": the run's resolved config)
//                        state.safetensors   optimizer moments, RNG state; metadata: step, tokens,
//                                            loader position, optimizer steps
//                        manifest.json       per-file bytes and sha256, written last
// The order of a save, which the fault tests check operation by operation (tests/faults):
//   1. "step_XXXXXXXX.tmp/" is created (a leftover of an earlier failed save of that step is
//      removed first, so saving a step again never meets "already exists");
//   2. model.safetensors and state.safetensors are written and each fsynced;
//   3. manifest.json.tmp (every file's bytes and sha256, and the `compat` fields a resume must
//      match) is written and fsynced, renamed to manifest.json, and the directory fsynced;
//   4. the directory is renamed to "step_XXXXXXXX" and the parent directory fsynced: the commit;
//   5. only then are older checkpoints deleted (prune_checkpoints, called by the caller after).
// A crash anywhere leaves the previous checkpoints untouched; a directory whose name has a '.' or
// that lacks a manifest is never chosen. Loading checks every file's size and sha256 against the
// manifest before using a byte of it, and choose_checkpoint falls back past damaged checkpoints,
// reporting each one it skipped.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/file_io.h"

namespace trainer {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct CheckpointData {
  int64_t step = 0;                         // optimizer steps completed
  NamedTensors weights;                     // model parameters
  NamedTensors state;                       // optimizer and RNG tensors
  std::map<std::string, std::string> meta;  // scalars as strings (tokens, loader position, ...)
  std::string config_toml;                  // the run's resolved config, so a checkpoint alone rebuilds its model
  // What a resume must match (manifest "compat"): "model.d" -> "64", "train.precision" -> "\"bf16\"",
  // "world_size" -> "2", ... (trainer/resume_check.h makes and checks them). Empty: not recorded.
  std::map<std::string, std::string> compat;
};

struct SavedCheckpoint {
  std::string dir;
  int64_t bytes = 0;       // all files of the checkpoint
  std::string sha256;      // of model.safetensors
};

// Writes a checkpoint of `data` under root (created if missing) in the order above, through `io`.
// before_commit (optional) runs after the files and manifest are durable and before the rename
// that commits them (the app waits there until the metrics up to this step are in the database).
// Replaces an existing checkpoint of the same step only after the new one is complete. Throws
// std::runtime_error (storage::IoError for I/O) naming the file, the offset and errno's text,
// having removed its partial directory; older checkpoints are untouched. Worker thread.
SavedCheckpoint save_checkpoint(const std::string& root, const CheckpointData& data,
                                storage::FileIo& io = storage::checkpoint_io(),
                                const std::function<void()>& before_commit = {});

// Writes tensors (any device; copied to the host) as one safetensors file with string metadata;
// returns its size. Throws std::runtime_error naming the file on I/O failure.
int64_t write_weights_file(const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& meta);
// The same through io; *sha256 (when given) receives the file's digest, computed while writing.
int64_t write_weights_file(storage::FileIo& io, const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& meta, std::string* sha256);

// Reads a checkpoint directory after verifying every file's size and sha256 against the manifest
// (each file is read once). Throws std::runtime_error naming the damaged file and expected vs actual
// values. Any thread.
CheckpointData load_checkpoint(const std::string& dir);
// load_checkpoint for the ranks of one process, which all resume from the same folder: callers
// that overlap share one read (one copy in host memory and one sha256 pass, not one per GPU), and
// a failure reaches each of them. The data is read-only; it is freed when its last holder lets go,
// and a later call reads the folder again. Any thread.
std::shared_ptr<const CheckpointData> load_checkpoint_shared(const std::string& dir);

// Why the checkpoint in `dir` cannot be used ("" when it can): no or an empty or unparsable
// manifest, a listed file missing, of the wrong size or with the wrong sha256 (reads every file).
// Any thread; never throws.
std::string checkpoint_problem(const std::string& dir);

// The manifest's "compat" fields (empty for checkpoints written before they were recorded). Throws
// std::runtime_error naming the manifest when it is missing or unreadable. Reads only the manifest.
std::map<std::string, std::string> read_compat(const std::string& dir);

struct CheckpointChoice {
  std::string dir;                   // the newest usable checkpoint; empty when none
  std::vector<std::string> skipped;  // newer ones passed over (and unfinished saves), each with why
};
// The checkpoint a user means by `path`: a step directory (has manifest.json) as is, or the newest
// usable checkpoint under path/checkpoints or path itself, verified by checkpoint_problem; damaged
// ones and unfinished saves ("step_X.tmp") are skipped and listed. A "step_X.old" without a step_X
// beside it is a committed checkpoint that a crash caught while a save of the same step replaced
// it (between its two renames): it stands for step X (restore_moved_aside gives it its name back).
// Throws std::runtime_error naming path when it is neither a checkpoint nor a run directory. Reads
// only; any thread.
CheckpointChoice choose_checkpoint(const std::string& path);
// For a resume's chosen dir: "…/step_X.old" is renamed back to "…/step_X" when no step_X exists, and
// the folder fsynced; returns the dir to resume from (`dir` itself otherwise). Throws
// std::runtime_error naming both paths when the rename fails.
std::string restore_moved_aside(const std::string& dir);
// The dir restore_moved_aside(dir) would return, without renaming anything: what a node other than
// node 0 of a multi-node resume takes, as node 0 renames the checkpoint back before they meet.
std::string restored_name(const std::string& dir);
// choose_checkpoint's dir; throws std::runtime_error naming path and every skipped checkpoint when
// none is usable.
std::string find_checkpoint(const std::string& path);

// Committed checkpoint directories under root (named step_XXXXXXXX, holding a manifest.json),
// oldest step first; unfinished saves (".tmp") and leftovers (".old") are not listed.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);

// Renames the checkpoints under root after step `from` (those list_checkpoints finds, and step_X.old
// ones choose_checkpoint would take) to "<dir>.superseded" ("-2", "-3", ... when taken), fsyncing root: a resume from `from` abandons
// them, and left as they are they would be a later resume's choice, or (damaged ones a resume
// skipped) count as the newest in prune_checkpoints and get fresh saves deleted. A name with a
// '.' is never chosen and never pruned; nothing is deleted. Returns each (step, new path); throws
// std::runtime_error naming the checkpoint when a rename fails (those renamed before stay so).
std::vector<std::pair<int64_t, std::string>> set_aside_checkpoints_after(const std::string& root, int64_t from);

// Deletes all but the newest `keep` checkpoints and the one of protected_step (the best by
// validation loss; -1 = none) through `io`, then fsyncs root; returns the steps removed. Each is
// first renamed to step_X.deleting (atomic), then deleted; a deletion cut short leaves that name,
// removed at the next pruning. A checkpoint that cannot be renamed stays (and is not listed).
std::vector<int64_t> prune_checkpoints(const std::string& root, int64_t keep, int64_t protected_step = -1,
                                       storage::FileIo& io = storage::checkpoint_io());

}  // namespace trainer

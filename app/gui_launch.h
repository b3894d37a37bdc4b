// What the desktop app needs from the engine to start runs, kept in one translation unit because it
// includes the device header (ATen): the devices of this machine, a new run's world size, and a
// past run prepared for resuming from one of its checkpoints (or a new process started to resume it).
// No torch in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/run_host.h"
#include "trainer/api.h"

namespace app {

// "cpu (16 cores)", "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90)", ... Main thread at startup.
std::vector<std::string> list_devices();

// Problems running `cfg` on this machine (devices, precision, data sources), each naming its key;
// fills model.vocab_size from the tokenizer like the command line. Empty = ready to record.
std::vector<std::string> check_runnable(trainer::RunConfig& cfg);

// Ranks of `cfg` on this machine (one node). Call after check_runnable passed.
int64_t world_size_of(const trainer::RunConfig& cfg);

// What preparing a resume found. Either `prep` holds the reopened run, ready for a RunHost, or the
// resume was refused (`prep` is null) and the database is untouched.
struct ResumeOutcome {
  std::unique_ptr<PreparedRun> prep;     // null when refused
  std::string run_name;
  std::string checkpoint;                // the checkpoint chosen (or the one refused)
  std::vector<std::string> skipped;      // newer checkpoints passed over: "<dir>: <why>"
  std::vector<std::string> set_aside;    // later checkpoints of the abandoned attempt, renamed "<dir>.superseded"
  std::vector<std::string> mismatches;   // trainer::resume_mismatches: "model.d: the checkpoint has 64, this run has 128"
  std::string error;                     // any other reason for refusing
  bool gpu_blocked = false;              // the run needs the GPU and this process may no longer use it
};

// Prepares run `run_id` of the database at db_path to continue from its checkpoint of `step` (-1: the
// newest usable one, trainer::choose_checkpoint, which verifies sizes and sha256 and skips damaged
// and unfinished saves; a given step is verified the same way): its recorded config with
// `overrides` ("train.steps=1200", as --set gives them; resolved again for this machine). Refused,
// before anything is written, for a run still alive, a run whose record beside its checkpoints is
// further along than this database's copy (another database's job went on with it), config
// problems, a run that needs the GPU after trainer::cuda_blocked_reason() was set, no usable
// checkpoint, or a checkpoint whose model shape, vocabulary, precision or world size differs from
// the run's (trainer::resume_mismatches).
// Otherwise the run is reopened, the metric rows after the checkpoint are marked superseded, the
// checkpoints after it (saved by the attempt being abandoned, when resuming from an older one) are
// renamed "<dir>.superseded" and their records removed, so no later resume picks them up (the
// files stay), and events record the skipped checkpoints, those set aside and the resume. Hashes whole checkpoint files: call it off
// the main thread. Never throws.
ResumeOutcome prepare_resume(const std::string& db_path, int64_t run_id, int64_t step,
                             const std::vector<std::string>& overrides = {});

// This program's path (/proc/self/exe), for starting it again. "" when unknown. Any thread.
std::string self_exe();

// Starts `deltadeck train --no-gui --resume <run_id> --runs-dir <runs_dir>` as a process in a
// session of its own (a stop signal or a closing window here does not reach it), stdin from
// /dev/null, stdout and stderr appended to log_path. The faults armed for this process
// (DELTADECK_FAULT, DELTADECK_IO_FAULT) are not passed on: the new process exists to recover from
// this one. Returns the child's pid; throws std::runtime_error naming the program or log file when
// it cannot start. The caller reaps it (waitpid). Main thread.
int spawn_resume_process(const std::string& exe, int64_t run_id, const std::string& runs_dir,
                         const std::string& log_path);

}  // namespace app

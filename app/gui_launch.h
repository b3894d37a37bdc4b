// What the desktop app needs from the engine to start runs, kept in one translation unit because it
// includes the device header (ATen): the devices of this machine, a new run's world size, and a
// past run prepared for resuming from one of its checkpoints. No torch in this header.
#pragma once

#include <cstdint>
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

// Reopens run `run_id` of the database at db_path to continue from its checkpoint of `step` (-1: the
// newest complete one): its recorded config with `overrides` ("train.steps=1200", as --set gives
// them; resolved again for this machine), the metric rows after that step removed (the resumed run
// recomputes them), an event saying so. Throws std::runtime_error saying what is wrong (run still
// alive, no such checkpoint, config problems).
PreparedRun prepare_resume(const std::string& db_path, int64_t run_id, int64_t step,
                           const std::vector<std::string>& overrides = {});

}  // namespace app

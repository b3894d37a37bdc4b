// A rank's thread body: load or build everything, then step until done, a stop command or an
// error.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>

#include "trainer/api.h"
#include "trainer/channel.h"
#include "trainer/session.h"

namespace trainer {

// Where the worker is, for threads that report beside it (GPU telemetry). Written after every step.
struct RunProgress {
  // False until the worker knows its starting step (a resume's checkpoint loaded): telemetry
  // sampled before is dropped, where it was recorded at step 0 of a run resumed from step N.
  std::atomic<bool> known{false};
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<double> wall_s{0};
};

class Communicator;

// One rank of the run: its device and its link to the other ranks (world 1: a no-op link).
struct RankContext {
  c10::Device device{c10::kCPU};
  Communicator* comm = nullptr;
};

// Runs rank `rank`'s share of the training of cfg on this thread until done, a stop decided by
// rank 0 (which alone reads `commands` and reports events), or an error. Never throws: returns how
// the rank ended (a failure also goes out as an error LogEvent). The caller sends the EndedEvent.
EndedEvent run_rank(const RunConfig& cfg, const SessionOptions& opts, Channel<Event>& events,
                    Channel<Command>& commands, RunProgress& progress, const RankContext& rank);

// Records why this process must not run CUDA work any more (cuda_blocked_reason() in session.h).
void block_cuda(const std::string& why);

}  // namespace trainer

// The worker thread's body: load or build everything, then step until done, a stop command or an
// error; every outcome ends with exactly one EndedEvent.
#pragma once

#include <atomic>
#include <cstdint>

#include "trainer/api.h"
#include "trainer/channel.h"
#include "trainer/session.h"

namespace trainer {

// Where the worker is, for threads that report beside it (GPU telemetry). Written after every step.
struct RunProgress {
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<double> wall_s{0};
};

// Runs the whole training of cfg on this thread. Never throws: failures become an EndedEvent
// with status Failed and the error text.
void run_training(const RunConfig& cfg, const SessionOptions& opts, Channel<Event>& events,
                  Channel<Command>& commands, RunProgress& progress);

}  // namespace trainer

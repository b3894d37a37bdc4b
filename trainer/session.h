// Session: one training run. It owns the worker threads (one per rank: a device of run.devices;
// the ranks of one process meet in an in-process store) and talks to the app only through two
// channels: events out, commands in.
// No torch in this header, so app/ and ui/ include it cheaply.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/api.h"
#include "trainer/channel.h"
#include "trainer/cluster.h"

namespace trainer {

class Rendezvous;  // trainer/rendezvous.h

struct SessionOptions {
  SessionOptions() = default;
  explicit SessionOptions(std::string dir, std::string resume = "")
      : run_dir(std::move(dir)), resume_from(std::move(resume)) {}
  std::string run_dir;      // checkpoints go to <run_dir>/checkpoints
  std::string resume_from;  // a checkpoint directory to continue from; empty = fresh start
  // The run's name as recorded. Node 0 of a multi-node run sends its own to the other nodes, whose
  // sessions report it as a RunNamedEvent.
  std::string run_name;
  bool measure_only = false;  // benchmarks: no evaluation, no checkpoints
  // Benchmarks: profile steps [profile_from_step, profile_from_step + profile_steps) on rank 0; the
  // report arrives as a LogEvent of level "profile", the trace goes to profile_trace (if set).
  int64_t profile_from_step = -1;
  int64_t profile_steps = 0;
  std::string profile_trace;
  int64_t profile_top = 20;  // kernels listed in the report, the most GPU time first
  ClusterSpec cluster;        // this process's node; several nodes meet at cluster.master_addr:port
  // The nodes' store, where the caller met the other nodes already (a multi-node --resume agrees on
  // the run before the session starts); null: the session connects to cluster.master_addr:port.
  std::shared_ptr<Rendezvous> rendezvous;
  // Called on rank 0's thread once a checkpoint of `step` is written and fsynced and before the
  // rename that commits it; returns when the metrics the run emitted so far are durable (the app
  // flushes its database writer), so no metric row up to a committed checkpoint is ever lost.
  // Empty: no wait.
  std::function<void(int64_t step)> before_checkpoint_commit;
  // Polled by rank 0 at every step boundary (must be cheap and never block): a Stop or Preempt it
  // returns ends the run at that very boundary, as the command would, without waiting for a front
  // end's next poll (the app: the first SIGINT/SIGTERM). Empty: none.
  std::function<std::optional<Command>()> poll_stop;
};

// The nodes' store for this node of a multi-node run: node 0 serves it (or torchrun's agent does,
// and every node joins under this attempt's prefix); the others connect, retrying until `timeout`.
// Throws std::runtime_error naming the address.
std::shared_ptr<Rendezvous> node_rendezvous(const ClusterSpec& node, std::chrono::milliseconds timeout);

// Why this process may no longer run CUDA work ("" when it may): set after a multi-rank GPU run
// failed, since its NCCL communicator may be wedged with kernels still queued on the device; any
// further CUDA call could hang. A front end that keeps running (the desktop app) shows this and
// offers to resume the run in a fresh process. Any thread.
std::string cuda_blocked_reason();

// Completes a validated config for this build: fills model.vocab_size from the tokenizer when 0 and
// makes train.precision "auto" concrete for this machine's devices (resolve_precision),
// rejects a tokenizer vocabulary larger than the model's, settings this build does not have yet,
// and data sources that match no files. Returns error lines naming the key; empty = ready.
// Any thread; reads only directory listings.
std::vector<std::string> resolve_config(RunConfig& cfg);

class Session {
 public:
  Session(RunConfig cfg, SessionOptions opts);
  // Asks the worker to stop (without a checkpoint) if still running, then joins.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Starts the worker thread. Call once. Main thread.
  void start();
  // Events of the run, ending with an EndedEvent, after which the channel is closed.
  Channel<Event>& events();
  // Queues a command; the worker applies it at the next step boundary. Any thread. Waits only while
  // 64 commands are queued, and then not for SaveNow, which is dropped (a checkpoint a step at most).
  void send(Command c);
  // Waits for the worker thread to end.
  void join();

 private:
  struct Impl;
  // Shared with rank threads that were abandoned (hung past the grace period): they keep what
  // they use alive after the Session is gone.
  std::shared_ptr<Impl> impl_;
};

}  // namespace trainer

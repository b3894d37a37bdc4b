// RunView: what a front end (terminal dashboard, desktop app, plain log) knows about one live run,
// as plain values with no torch and no pointers into the trainer. app::RunHost owns the master
// copy, updates it from the run's events on its forwarding thread, and front ends copy it out
// under a mutex (RunHost::snapshot), so nothing a front end does can make the training loop wait.
//
// The one decision a reader might undo: series and the event log are append-only (the event log
// drops its oldest lines past MAX_EVENT_LINES and counts them in events_total), so a front end's
// copy is brought up to date by appending the tail it lacks (copy_changes) instead of copying the
// whole history every frame.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trainer/api.h"

namespace ui {

// One value of one metric at one step.
struct SeriesPoint {
  int64_t step = 0;
  int64_t tokens = 0;   // training tokens seen up to this step
  double wall_s = 0;    // seconds since the run started (a resumed run continues its clock)
  double value = 0;
};
using Series = std::vector<SeriesPoint>;

// The newest reading of one GPU (the telemetry thread's gpu<i>.* metrics, once a second).
struct GpuStats {
  int index = 0;
  double util = 0;           // %
  double mem_used_gib = 0;
  double power_w = 0;
  double temp_c = 0;
  double sm_clock_mhz = 0;
};

// One line of the run's log: a training step or evaluation (plain log only; `values` holds every
// metric of it) or an event. kind is one of
//   step        a logged training step (never in RunView::events: the charts show those)
//   eval        an evaluation (values: val_loss, val_ppl, ...)
//   checkpoint  a checkpoint saved (path, values: bytes)
//   skipped     steps skipped for non-finite gradients since the last logged step (values:
//               skipped_steps = the run's total, loss_scale)
//   backoff     the loss scaler lowered its scale without a skipped step (values: loss_scale)
//   log         a message of the engine (level info | warn | error)
//   started     the engine is up (text says on which device; values: params, vocab_size)
//   ended       the run ended (status finished | stopped | failed; text: why)
struct LogRecord {
  std::string kind;
  int64_t step = 0;
  int64_t tokens = 0;
  double wall_s = 0;
  std::string level = "info";
  std::string text;           // the event in words (empty for step and eval: front ends format those)
  std::string path;           // checkpoint: its directory
  std::string status;         // ended: finished | stopped | failed
  double eta_s = -1;          // step: seconds to the last step at the recent pace; -1 = unknown
  std::vector<std::pair<std::string, double>> values;
};

struct CheckpointView {
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;
};

struct RunView {
  // Which run: set once, before the engine starts.
  int64_t run_id = 0;
  std::string run_name;
  std::string model;          // "gpt/tiny"
  int64_t params = 0;
  std::string devices;        // run.devices as configured ("auto", "0,1", "cpu")
  std::string device;         // what the engine reported it trains on ("cpu", "4 ranks (NCCL), ...")
  std::string db_path;
  std::string run_dir;
  int64_t total_steps = 0;
  int64_t log_interval = 0;

  // Where it is.
  std::string status = "starting";  // starting | running | paused | stopping | finished | stopped | failed
  int64_t step = 0;
  int64_t tokens = 0;
  double elapsed_s = 0;       // wall_s of the newest event
  double eta_s = -1;          // seconds to total_steps at the pace of the last logged steps; -1 unknown
  std::string end_message;    // why it ended (once status is finished | stopped | failed)

  // What it measured. Training series have a point per logged step; val_loss per evaluation.
  Series loss, val_loss, grad_norm, loss_scale, lr, tokens_per_s, mfu;
  std::map<std::string, double> latest;   // every metric's newest value (telemetry included)
  std::vector<GpuStats> gpus;             // by index; empty where no telemetry runs (CPU)
  std::vector<LogRecord> events;          // the newest MAX_EVENT_LINES non-step records
  int64_t events_total = 0;               // records ever appended to `events`
  std::vector<CheckpointView> checkpoints;  // recorded and still on disk, by step

  // Bumped by every change; a copy with the same version and run_id holds the same data.
  uint64_t version = 0;

  static constexpr size_t MAX_EVENT_LINES = 500;
  // The metric keys that have a Series above, and the Series of one (nullptr for other keys).
  static const std::vector<std::string>& series_keys();
  const Series* series(const std::string& key) const;
  Series* series(const std::string& key);
  bool ended() const {
    return status == "finished" || status == "stopped" || status == "failed" || status == "preempted" ||
           status == "diverged";
  }
};

// Folds one engine event into the view and returns the log records it gives (in order; a
// metrics event may give a step record plus a derived skipped/backoff record). Checkpoint pruning
// (a checkpoint directory vanishing) is the host's business: it calls drop_checkpoint.
// Not thread-safe: the caller holds the view's lock.
std::vector<LogRecord> apply_event(RunView& v, const trainer::Event& e);
// Appends an event record to v.events (dropping the oldest past MAX_EVENT_LINES).
void append_event(RunView& v, LogRecord r);
void drop_checkpoint(RunView& v, int64_t step);

// Seconds to total_steps from the pace of the last (up to 20) points of `s`; -1 when unknown.
double estimate_eta(const Series& s, int64_t total_steps);

// Brings `to` up to date with `from`, copying only what changed: the tail of each series and of
// the event log that `to` lacks, and the small fields. A `to` of another run (or a newer version,
// which cannot happen with one host) is replaced whole.
void copy_changes(const RunView& from, RunView& to);

}  // namespace ui

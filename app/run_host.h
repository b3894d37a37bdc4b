// RunHost: one live run as every front end sees it (terminal dashboard, plain log, desktop app).
// It owns the trainer::Session and does the forwarding the train command needs: metrics to the
// storage writer thread, checkpoints and events to the run store, the run's end status to the
// run record. The forwarding runs on the host's own thread, so the training loop never waits on
// a front end: front ends only copy a mutex-protected ui::RunView (snapshot), drain plain-log
// records (take_records) and send commands, from any thread, at their own pace.
//
//   app::PreparedRun prep = app::record_new_run(cfg, world_size);   // or the resume path
//   app::RunHost host(std::move(prep));
//   host.start();
//   ui::RunView view;
//   while (!host.ended()) { host.snapshot(view); draw(view); if (key == 'p') host.send(Pause); }
//   trainer::EndedEvent end = host.wait();   // the run record is closed by now
//
// No torch in this header.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/run_owner.h"
#include "storage/run_store.h"
#include "storage/types.h"
#include "trainer/api.h"
#include "trainer/cluster.h"
#include "trainer/rendezvous.h"
#include "ui/run_view.h"

namespace trainer {
class Session;
}
namespace storage {
class MetricsWriter;
}

namespace app {

// A run recorded in the database and ready to start: a new one (record_new_run) or one reopened
// for --resume (the train command).
struct PreparedRun {
  trainer::RunConfig cfg;                   // validated and resolved
  std::unique_ptr<storage::RunStore> store; // read-write; the host's thread writes through it
  std::string db_path;
  int64_t run_id = 0;
  std::string run_dir;                      // <runs_dir>/<name>: checkpoints go to run_dir/checkpoints
  std::string resume_from;                  // checkpoint directory to continue from; empty = fresh start
  // A resume's run read from its record (storage::RUN_RECORD_FILE), not yet in the database (then
  // run_id is 0), and the database's older copy it replaces (0: none); the train command's
  // commit_resume brings it in.
  std::optional<storage::ImportedRun> adopt;
  int64_t replaces_run = 0;
};

// Records a new run for a validated, resolved config in <cfg.run.runs_dir>/deltadeck.db (the name
// gets a suffix if taken; read it back from the store) and creates its folder. world_size = ranks
// over every node. Main thread; throws std::runtime_error naming the database or folder on failure.
PreparedRun record_new_run(trainer::RunConfig cfg, int64_t world_size, const std::string& revision);
// A resume's config (the run's recorded one with this resume's --set changes) becomes the run's
// recorded config, so that the next resume keeps them; an event at `step` names the keys that
// changed. Nothing is written when nothing changed. Returns the event's text ("" when none).
std::string record_resumed_config(PreparedRun& prep, int64_t step);

struct RunHostOptions {
  trainer::ClusterSpec cluster;  // this process's node of a multi-node run; default: one node
  // The plain log's queue: keep every step/eval/event record for take_records(). Off, nothing is
  // queued (the dashboards read the RunView's event log instead).
  bool keep_records = false;
  size_t max_records = 10000;    // past this the oldest records are dropped (counted in dropped_records)
  // Handed to the engine (SessionOptions::poll_stop): the train command's first stop signal ends
  // the run at the very next step boundary. Empty in the desktop app, which stops by command.
  std::function<std::optional<trainer::Command>()> poll_stop;
  // The nodes' store where the caller met them already (SessionOptions::rendezvous); may be null.
  std::shared_ptr<trainer::Rendezvous> rendezvous;
};

class RunHost {
 public:
  // Takes the prepared run; a resumed run's earlier metric points are loaded into the view so the
  // charts show the whole run. Throws std::runtime_error if the metrics database cannot be opened.
  explicit RunHost(PreparedRun prep, RunHostOptions opts = {});
  // If the run is still going: asks it to stop (with a checkpoint, as Command::Stop does) and
  // waits for it to end and be recorded.
  ~RunHost();
  RunHost(const RunHost&) = delete;
  RunHost& operator=(const RunHost&) = delete;

  // Starts the engine and the forwarding thread. Call once. Main thread.
  void start();

  // Brings `view` up to date, copying only what changed since it was last filled from this host
  // (pass the same RunView every frame). Any thread; holds the host's lock for the copy only.
  void snapshot(ui::RunView& view) const;
  // Moves the queued plain-log records (in order) to the end of `out`; returns how many. Any
  // thread. Empty unless RunHostOptions::keep_records.
  size_t take_records(std::vector<ui::LogRecord>& out);
  int64_t dropped_records() const;

  // Queues a command; the engine applies it at its next step boundary. Pause, Resume and Stop show
  // at once in the view's status (paused, running, stopping). Ignored once the run has ended. Any
  // thread; never waits on the training loop.
  void send(trainer::Command c);

  // True once the run has ended and its end is recorded in the database. Any thread.
  bool ended() const;
  // Blocks until ended(), then returns how the run ended. Any thread; callable more than once.
  trainer::EndedEvent wait();

  const PreparedRun& run() const { return prep_; }
  // Warnings of the forwarding (a failed database write, the metrics writer's last error); they
  // are also in the view's event log. Any thread.
  std::vector<std::string> warnings() const;

 private:
  void forward();                                   // the forwarding thread's body
  void handle(const trainer::Event& e);             // one event: view, records, database
  void warn(const std::string& what);               // a storage failure: logged, never thrown
  // Asks for the run's record in its folder (storage::RUN_RECORD_FILE), after a checkpoint and at
  // the end, so that it travels with the checkpoints. The record thread writes it, through its own
  // read-only connection: a long run's record (every metric row) never holds up the events. Requests
  // that pile up while it writes are one write. A failure is a warning.
  void write_record();
  void record_loop();
  // The end: the last record written, then the record thread joined and the owner file removed.
  void finish_records();
  // Writes the run folder's owner file (app/run_owner.h), stamped now: at the start and every
  // storage::HEARTBEAT_EVERY_S on the record thread. A failure is a warning.
  void stamp_owner();
  void preload_history();
  // The engine's before_checkpoint_commit hook (rank 0's thread): returns once every metrics row
  // the engine emitted before the call is committed to the database, or after a minute (logged).
  void wait_metrics_committed(int64_t step);

  PreparedRun prep_;
  RunHostOptions opts_;
  std::unique_ptr<storage::MetricsWriter> writer_;
  std::unique_ptr<trainer::Session> session_;
  std::thread thread_;
  std::thread record_thread_;
  std::mutex record_mu_;
  std::condition_variable record_cv_;
  bool record_wanted_ = false, record_stop_ = false;  // guarded by record_mu_
  std::optional<RunOwner> owner_;                    // this process, where the run has an owner file

  mutable std::mutex mu_;                           // guards everything below
  std::condition_variable ended_cv_;
  ui::RunView view_;
  std::deque<ui::LogRecord> records_;
  int64_t dropped_records_ = 0;
  std::vector<std::string> warnings_;
  bool started_ = false, ended_ = false, stop_sent_ = false;
  uint64_t markers_sent_ = 0, markers_done_ = 0;     // wait_metrics_committed's markers
  std::condition_variable marker_cv_;
  trainer::EndedEvent end_{trainer::RunStatus::Failed, 0, "the engine ended without a final event"};
};

}  // namespace app

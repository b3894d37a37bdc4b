// GuiController. Index:
//   [SECTION] reads on the database thread (poll: runs list, new metric rows, run details)
//   [SECTION] construction, launcher config
//   [SECTION] per-frame update (live snapshot, results, poll scheduling)
//   [SECTION] actions (start, resume, commands, edits, exports)
//
// The one decision a reader might undo: every database read happens on db_worker_ against its own
// read-only connection, and a poll first asks PRAGMA data_version whether anything was committed
// since the last one; a quiet database costs one pragma per second, and a busy one never holds up
// a frame (the frame keeps drawing what it has until the poll's result arrives).
#include "app/gui_controller.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "app/build_info.h"
#include "app/gui_launch.h"
#include "app/run_host.h"
#include "storage/file_util.h"
#include "storage/run_queries.h"
#include "storage/run_store.h"
#include "storage/sha256.h"
#include "trainer/config.h"
#include "trainer/export.h"
#include "trainer/session.h"
#include "ui/gui/config_diff.h"
#include "ui/gui/recovery.h"
#include "ui/log/log_line.h"

namespace app {

// ============================================================================================
// [SECTION] reads on the database thread
// ============================================================================================

namespace {

// Rows of one metric read per run per poll; a longer history arrives over several polls, drawn as
// it comes, so the first curve shows at once even for a million-step run.
constexpr int64_t ROWS_PER_POLL = 250000;

struct PollRequest {
  bool force = false;
  struct Run {
    int64_t id = 0;
    uint64_t generation = 0;
    int64_t after = 0;
    bool must = false;  // read even if the database did not change (first read, or more to come)
  };
  std::vector<Run> runs;
  int64_t live_id = 0, live_after = 0;
  uint64_t live_generation = 0;
  bool force_live = false;    // the last read of an ended live run: read even if nothing changed
  std::vector<int64_t> details;
  bool details_must = false;  // read details even if the database did not change (a run just opened)
};

struct RunDetails {
  std::vector<storage::CheckpointRecord> checkpoints;
  std::vector<storage::EventRecord> events;
  std::string config_toml;
};

struct MetricsRead {
  uint64_t generation = 0;
  int64_t after = 0;
  std::vector<storage::MetricRowRead> rows;
};

struct PollResult {
  std::string db_status;
  bool rows_fresh = false;
  std::vector<ui::RunRow> rows;
  std::map<int64_t, MetricsRead> metrics;  // by run id
  std::vector<storage::MetricRowRead> live;
  int64_t live_id = 0;
  uint64_t live_generation = 0;
  std::map<int64_t, RunDetails> details;
  bool more = false;
};

}  // namespace

struct GuiController::DbContext {
  std::string path;
  storage::ReadConnection conn;
  std::unique_ptr<storage::RunStore> reader;  // read-only: list_runs, checkpoints, events
  std::unique_ptr<storage::RunStore> writer;  // opened by the first edit
  int64_t data_version = -1;
  bool reported_missing = false;
  std::map<int64_t, ui::FlatConfig> configs;  // flattened config_json by run id (configs never change)
  // A run another process trains can die (SIGKILL, OOM) while the app is open: while the list
  // shows one running, the poll checks every kSweepEvery whether its process is gone, as opening
  // the database does (RunStore::mark_dead_runs; a file this user may not write is left alone).
  static constexpr std::chrono::seconds kSweepEvery{20};
  bool any_running = false;
  bool sweep_refused = false;
  // The end (status and time) of each run not running at the last listing, and the end each was
  // last read after.
  std::map<int64_t, std::string> end_stamp, read_at_end;
  std::chrono::steady_clock::time_point last_sweep = std::chrono::steady_clock::now();

  // True when the sweep marked a run interrupted (the list is then read again).
  bool sweep_dead_runs() {
    const auto now = std::chrono::steady_clock::now();
    if (!any_running || sweep_refused || now - last_sweep < kSweepEvery) return false;
    last_sweep = now;
    try {
      return writable().mark_dead_runs() > 0;
    } catch (const storage::SqliteError& e) {
      // Busy (another process holds the write lock) may pass: tried again at the next sweep.
      // Anything else (a read-only file or directory) will not: the stored statuses are shown.
      if (!e.may_pass()) sweep_refused = true;
      return false;
    } catch (const std::exception&) {
      sweep_refused = true;
      return false;
    }
  }

  storage::RunStore& writable() {
    if (!writer) writer = storage::RunStore::open(path);
    return *writer;
  }

  bool open(std::string& status) {
    if (conn) return true;
    if (!storage::files::exists(path)) {
      status = "No runs yet: " + path + " is created by the first run.";
      return false;
    }
    conn = storage::open_read_connection(path);
    // Migrates an older schema and marks runs of dead processes interrupted first, where it may.
    reader = storage::RunStore::open_for_display(path);
    return true;
  }

  std::vector<ui::RunRow> rows() {
    std::vector<ui::RunRow> out;
    const auto runs = reader->list_runs();
    any_running = false;
    bool missing = false;
    for (const auto& r : runs) missing |= !configs.count(r.id);
    if (missing)
      for (const auto& [id, json] : storage::run_configs(conn.get()))
        if (!configs.count(id)) configs[id] = ui::flatten_config_json(json);
    for (const auto& r : runs) {
      ui::RunRow row;
      row.id = r.id;
      row.name = r.name;
      row.status = r.status;
      any_running |= r.status == "running";
      if (r.status == "running") end_stamp.erase(r.id);
      else end_stamp[r.id] = r.status + " " + r.ended_at;
      row.model = r.model;
      row.params = r.params;
      row.world_size = r.world_size;
      row.started_at = r.started_at;
      row.ended_at = r.ended_at;
      row.message = r.message;
      row.tags = r.tags;
      row.notes = r.note;
      const storage::RunFigures f = storage::run_figures(conn.get(), r.id);
      row.steps = f.has_loss ? f.last_step : r.last_step;
      row.tokens = f.tokens;
      row.duration_s = f.wall_s;
      if (f.has_val) row.best_val_loss = f.best_val_loss;
      row.config = configs[r.id];
      out.push_back(std::move(row));
    }
    return out;
  }

  PollResult poll(const PollRequest& req) {
    PollResult res;
    try {
      if (!open(res.db_status)) {
        // Report the empty list once; later polls of a still missing file change nothing.
        res.rows_fresh = !reported_missing;
        reported_missing = true;
        return res;
      }
      const bool swept = sweep_dead_runs();
      const int64_t dv = storage::data_version(conn.get());
      const bool changed = dv != data_version || req.force || swept;
      data_version = dv;
      if (changed) {
        res.rows = rows();
        res.rows_fresh = true;
      }
      for (const auto& run : req.runs) {
        if (!changed && !run.must) continue;
        // A run that ended and was read once since gets no more rows: reading after its last one
        // would scan the rest of the table (rowids past it belong to other runs) at every commit.
        // Its end (status and time) is the stamp: a resume, even one that ended between two polls,
        // changes it, and the run is read again.
        const auto end = end_stamp.find(run.id);
        const bool ended = end != end_stamp.end();
        if (!run.must && ended) {
          const auto read = read_at_end.find(run.id);
          if (read != read_at_end.end() && read->second == end->second) continue;
        }
        auto got = storage::metrics_after(conn.get(), run.id, run.after, ROWS_PER_POLL);
        if (ended) read_at_end[run.id] = end->second;
        res.more |= static_cast<int64_t>(got.size()) == ROWS_PER_POLL;
        res.metrics[run.id] = {run.generation, run.after, std::move(got)};
      }
      if (req.live_id != 0 && (changed || req.force_live)) {
        res.live = storage::metrics_after(conn.get(), req.live_id, req.live_after, ROWS_PER_POLL);
        res.live_id = req.live_id;
        res.live_generation = req.live_generation;
        res.more |= static_cast<int64_t>(res.live.size()) == ROWS_PER_POLL;
      }
      for (int64_t id : req.details) {
        if (!changed && !req.details_must) continue;
        RunDetails d;
        d.checkpoints = reader->checkpoints(id);
        d.events = reader->events(id);
        d.config_toml = reader->run_config_toml(id);
        res.details[id] = std::move(d);
      }
    } catch (const std::exception& e) {
      res.db_status = std::string("database: ") + e.what();
      // Start over next time (the file may have been replaced or damaged).
      reader.reset();
      conn.reset();
      data_version = -1;
    }
    return res;
  }
};

namespace {

// True when `rows` (new rows of a run, in write order) start the run over: a training loss at a
// step the history has already gone past means the run was resumed from an earlier checkpoint, and
// the points read before were marked superseded by then (the resume marks them before the engine
// writes a row). Evaluations and telemetry do not count: a step may log several of those.
bool resumed_since(const ui::RunHistory& h, const std::vector<storage::MetricRowRead>& rows) {
  const ui::MetricSeries* loss = h.find("loss");
  if (!loss || loss->size() == 0) return false;
  const double last = h.timeline().step[loss->t.back()];
  for (const auto& m : rows)
    if (m.point.key == "loss") return static_cast<double>(m.point.step) <= last;
  return false;
}

// Forgets what was read of a run, to read it again from its first (current) row.
void forget_history(ui::LoadedRun& lr) {
  lr.history.clear();
  lr.smoothed.clear();
  lr.last_rowid = 0;
  lr.loaded_once = false;
  lr.loading = false;
  ++lr.generation;
}

// Returns whether anything changed that the window shows; `reread` is set when a run must be read
// again from its start.
bool apply_poll(ui::GuiState& s, PollResult& r, bool& reread, uint64_t live_generation) {
  bool changed = s.db_status != r.db_status || r.rows_fresh || !r.details.empty();
  s.db_status = r.db_status;
  if (r.rows_fresh) {
    s.rows = std::move(r.rows);
    ++s.rows_version;
    s.rows_loaded = true;
    // Runs deleted meanwhile (here or by another process) leave the views.
    for (auto it = s.loaded.begin(); it != s.loaded.end();)
      it = s.row(it->first) ? std::next(it) : s.loaded.erase(it);
    auto& cr = s.compare.runs;
    cr.erase(std::remove_if(cr.begin(), cr.end(), [&](int64_t id) { return !s.row(id); }), cr.end());
    for (auto it = s.runs.selected.begin(); it != s.runs.selected.end();)
      it = s.row(*it) ? std::next(it) : s.runs.selected.erase(it);
  }
  for (auto& [id, got] : r.metrics) {
    auto it = s.loaded.find(id);
    // A run reopened, reread or deleted meanwhile asked again from another row; this answer is stale.
    if (it == s.loaded.end() || it->second.generation != got.generation || it->second.last_rowid != got.after) continue;
    ui::LoadedRun& lr = it->second;
    if (resumed_since(lr.history, got.rows)) {
      // Resumed by another process (or this one): what was read after its checkpoint is superseded.
      forget_history(lr);
      reread = true;
      changed = true;
      continue;
    }
    changed |= !got.rows.empty() || !lr.loaded_once;
    for (const auto& m : got.rows) lr.history.append(m.point.step, m.point.tokens, m.point.wall_s, m.point.key, m.point.value);
    if (!got.rows.empty()) lr.last_rowid = got.rows.back().rowid;
    lr.loaded_once = true;
    lr.loading = false;
  }
  // Rows of the run that trains here; dropped when another run has been adopted since they were asked for.
  if (!r.live.empty() && s.live.active && r.live_id == s.live.view.run_id && r.live_generation == live_generation) {
    const auto& keys = ui::RunView::series_keys();
    for (const auto& m : r.live) {
      // The snapshot carries these series already (sooner); the database adds the rest.
      if (std::find(keys.begin(), keys.end(), m.point.key) != keys.end()) continue;
      s.live.history.append(m.point.step, m.point.tokens, m.point.wall_s, m.point.key, m.point.value);
    }
    s.live.last_rowid = r.live.back().rowid;
    changed = true;
  }
  for (auto& [id, d] : r.details) {
    ui::LoadedRun& lr = s.loaded[id];
    lr.id = id;
    lr.checkpoints = std::move(d.checkpoints);
    lr.events = std::move(d.events);
    lr.config_toml = std::move(d.config_toml);
  }
  return changed;
}

// The problems of reading a config that the form will not show next to a field: the form shows
// what validate() finds; the rest (unknown keys, bad TOML, an unreadable file) go at the top.
std::vector<std::string> not_shown_by_fields(const std::vector<std::string>& errors, const trainer::RunConfig& cfg) {
  const auto shown = trainer::validate(cfg);
  std::vector<std::string> out;
  for (const auto& e : errors)
    if (std::find(shown.begin(), shown.end(), e) == shown.end()) out.push_back(e);
  return out;
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

}  // namespace

// ============================================================================================
// [SECTION] construction, launcher config
// ============================================================================================

GuiController::GuiController(GuiOptions opts, std::function<void()> wake) : opts_(std::move(opts)) {
  mailbox_ = std::make_unique<Mailbox>(std::move(wake));
  db_ = std::make_unique<DbContext>();
  db_->path = opts_.runs_dir + "/deltadeck.db";
  state_.db_path = db_->path;
  db_worker_ = std::make_unique<Worker>("gui-db");
  file_worker_ = std::make_unique<Worker>("gui-files");
  launch_worker_ = std::make_unique<Worker>("gui-launch");
  state_.exe_path = self_exe();
  init_launcher();
  if (!opts_.resume.empty()) {
    try {
      auto store = storage::RunStore::open_for_display(db_->path);
      int64_t id = 0;
      if (opts_.resume == "latest") {
        for (const auto& r : store->list_runs()) id = std::max(id, r.id);
      } else {
        id = store->find_run(opts_.resume).id;
      }
      store.reset();
      // `deltadeck train --resume RUN --set train.steps=N` trains it longer, as on the command line.
      resume_run(id, -1, opts_.overrides);
    } catch (const std::exception& e) {
      state_.set_status(std::string("resume: ") + e.what(), true);
    }
  } else if (opts_.start) {
    start_run();
  }
}

GuiController::~GuiController() {
  // Workers first (they may be mid-read); then the host stops and records a run still going. A
  // resume prepared but never adopted is closed by its RunHost's destructor in the mailbox.
  launch_worker_.reset();
  db_worker_.reset();
  file_worker_.reset();
  host_.reset();
}

void GuiController::init_launcher() {
  ui::LauncherPanel& p = state_.launcher;
  p.runs_dir = opts_.runs_dir;
  p.devices = list_devices();
  if (!opts_.assets_dir.empty()) {
    // The shipped presets; the embedded demo config is the default draft.
    for (const char* name : {"demo.toml", "tiny.toml", "small.toml"}) {
      const std::string path = opts_.assets_dir + "/configs/" + name;
      if (storage::files::exists(path)) p.presets.push_back(path);
    }
  }
  trainer::ConfigResult parsed =
      opts_.config_path.empty() ? trainer::parse_config(DEMO_CONFIG_TOML, "<embedded demo config>", opts_.overrides)
                                : trainer::load_config(opts_.config_path, opts_.overrides);
  p.source_name = opts_.config_path.empty() ? "demo (embedded)" : opts_.config_path;
  if (!opts_.overrides.empty()) p.source_name += " with --set";
  p.draft = parsed.config;
  p.draft.run.runs_dir = opts_.runs_dir;
  p.train_sources = join_lines(p.draft.data.train);
  p.parse_errors = not_shown_by_fields(parsed.errors, p.draft);
  p.dirty_validation = true;
}

void GuiController::load_config_file(const std::string& path) {
  ui::LauncherPanel& p = state_.launcher;
  trainer::ConfigResult parsed = trainer::load_config(path, {});
  p.draft = parsed.config;
  p.draft.run.runs_dir = opts_.runs_dir;
  p.train_sources = join_lines(p.draft.data.train);
  p.source_name = path;
  p.parse_errors = not_shown_by_fields(parsed.errors, p.draft);
  p.dirty_validation = true;
  p.message = parsed.ok() ? "Loaded " + path : "Loaded " + path + " with problems";
}

// ============================================================================================
// [SECTION] per-frame update
// ============================================================================================

void GuiController::feed_live() {
  ui::LiveRun& live = state_.live;
  host_->snapshot(live.view);
  if (live.view.version == live.seen_version) return;
  ++live.snapshots_taken;
  if (live.seen_version != 0 && live.view.version > live.seen_version + 1)
    live.snapshots_skipped += live.view.version - live.seen_version - 1;
  live.seen_version = live.view.version;
  for (const auto& key : ui::RunView::series_keys()) {
    const ui::Series& s = *live.view.series(key);
    size_t& done = live.consumed[key];
    // Fewer points than taken already: the view was replaced; start over (cannot happen with one host).
    if (s.size() < done) done = 0;
    for (size_t i = done; i < s.size(); ++i) live.history.append(s[i].step, s[i].tokens, s[i].wall_s, key, s[i].value);
    done = s.size();
  }
  // The checkpoints table reads the run's records from the database.
  auto it = state_.loaded.find(live.view.run_id);
  if (it == state_.loaded.end() || it->second.checkpoints.size() != live.view.checkpoints.size()) force_poll_ = true;
}

void GuiController::post_poll(bool force) {
  PollRequest req;
  req.force = force;
  for (auto& [id, lr] : state_.loaded) {
    const bool must = !lr.loaded_once || poll_again_;
    req.runs.push_back({id, lr.generation, lr.last_rowid, must});
    lr.loading = must;
  }
  // While the run trains, and once more after its host has ended (the writer's last commit may have
  // come after the previous read); not later, when another process may resume the same run.
  if (state_.live.active && state_.live.view.run_id != 0 && !live_tail_read_) {
    req.live_id = state_.live.view.run_id;
    req.live_after = state_.live.last_rowid;
    req.live_generation = live_generation_;
    req.force_live = !run_active();
    live_tail_read_ = !run_active();
  }
  // Details of the run in focus and of the live run (its checkpoints table).
  if (state_.runs.focused) req.details.push_back(state_.runs.focused);
  if (state_.live.active && state_.live.view.run_id) {
    req.details.push_back(state_.live.view.run_id);
    state_.loaded[state_.live.view.run_id].id = state_.live.view.run_id;
  }
  for (const auto& [id, lr] : state_.loaded)
    if (!lr.loaded_once && std::find(req.details.begin(), req.details.end(), id) == req.details.end()) {
      req.details.push_back(id);
      req.details_must = true;
    }
  req.details_must |= force;
  poll_in_flight_ = true;
  poll_again_ = false;
  db_worker_->post([this, req] {
    auto res = std::make_shared<PollResult>(db_->poll(req));
    mailbox_->push([this, res](ui::GuiState& s) {
      poll_in_flight_ = false;
      bool reread = false;
      const bool changed = apply_poll(s, *res, reread, live_generation_);
      if (res->more || reread) poll_again_ = true;
      return changed;
    });
  });
}

bool GuiController::update(double now) {
  bool changed = false;
  if (host_) {
    const uint64_t before = state_.live.seen_version;
    feed_live();
    changed |= state_.live.seen_version != before;
  }
  changed |= mailbox_->drain(state_);
  std::string blocked = cuda_blocked_test_.empty() ? trainer::cuda_blocked_reason() : cuda_blocked_test_;
  if (blocked != state_.cuda_blocked) {
    state_.cuda_blocked = std::move(blocked);
    changed = true;
  }
  const size_t tasks = file_worker_->pending();
  if (tasks != state_.file_tasks) {
    state_.file_tasks = tasks;
    changed = true;
  }
  if (!state_.children.empty()) {
    const size_t before = std::count_if(state_.children.begin(), state_.children.end(), [](const auto& c) { return c.running; });
    reap_children();
    changed |= before != static_cast<size_t>(std::count_if(state_.children.begin(), state_.children.end(),
                                                           [](const auto& c) { return c.running; }));
  }
  // Closing: no more reads; the window only waits for the run, the exports and the edits.
  if (state_.quit) return changed;
  if (!poll_in_flight_ && (poll_again_ || force_poll_ || now - last_poll_ >= (run_active() ? 0.5 : 1.0))) {
    post_poll(force_poll_);
    force_poll_ = false;
    last_poll_ = now;
  }
  return changed;
}

double GuiController::next_poll_in(double now) const {
  if (poll_again_ || force_poll_) return 0;
  return std::max(0.0, last_poll_ + (run_active() ? 0.5 : 1.0) - now);
}

bool GuiController::run_active() const { return host_ && !host_->ended(); }

bool GuiController::ready_to_quit() const {
  return state_.quit && !run_active() && !launch_pending() && file_worker_->pending() == 0 && db_worker_->pending() == 0;
}

void GuiController::request_close() {
  ui::CloseState& c = state_.close;
  if (c.closing && !ready_to_quit()) {
    // A second close while the run stops: the committed checkpoint and rows are safe as they are.
    c.quit_now = true;
    return;
  }
  if (run_active() || file_worker_->pending() > 0 || launch_pending()) c.requested = true;
  else state_.quit = true;
}

void GuiController::stop_and_close() {
  ui::CloseState& c = state_.close;
  c.requested = false;
  if (run_active()) host_->send(trainer::Command::Stop);
  state_.quit = true;
  c.closing = run_active() || file_worker_->pending() > 0 || launch_pending();
}

size_t GuiController::pending_tasks() const { return db_worker_->pending() + file_worker_->pending(); }

// ============================================================================================
// [SECTION] actions
// ============================================================================================

void GuiController::adopt_host(std::unique_ptr<RunHost> host) {
  host_.reset();  // a previous run has ended (the launcher allows no second live run)
  host_ = std::move(host);
  host_->start();
  ++live_generation_;
  live_tail_read_ = false;
  state_.live = ui::LiveRun{};
  state_.live.active = true;
  state_.dashboard.x.auto_fit = true;
  state_.dashboard.plots.clear();  // the previous run's zoom would hide this run's curves
  state_.tab = ui::Tab::Live;
  state_.select_tab = true;
  force_poll_ = true;
}

void GuiController::start_run() {
  ui::LauncherPanel& p = state_.launcher;
  if (run_active() || launch_pending()) return;
  trainer::RunConfig cfg = p.draft;
  cfg.run.runs_dir = opts_.runs_dir;
  // The window's frame loop keeps a core: ATen takes the others (STYLE.md §5).
  if (cfg.run.threads == 0)
    cfg.run.threads = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) - 1);
  p.errors = trainer::validate(cfg);
  if (!p.errors.empty()) {
    state_.set_status("The config has problems; nothing was started.", true);
    return;
  }
  // After a multi-GPU failure this process refuses the GPU (the launcher shows why next to Start).
  if (const std::string why = ui::gpu_refusal(cfg.run.devices, p.devices, state_.cuda_blocked); !why.empty()) {
    p.start_errors = {"run.devices: " + why};
    state_.set_status("Not started: " + why, true);
    return;
  }
  p.start_errors = check_runnable(cfg);
  if (!p.start_errors.empty()) {
    state_.set_status("The config cannot run on this machine; nothing was started.", true);
    return;
  }
  try {
    PreparedRun prep = record_new_run(cfg, world_size_of(cfg), REVISION);
    const std::string name = prep.store->run(prep.run_id)->name;
    adopt_host(std::make_unique<RunHost>(std::move(prep)));
    state_.set_status("Started run '" + name + "'.");
  } catch (const std::exception& e) {
    state_.set_status(std::string("Could not start: ") + e.what(), true);
  }
}

// Forgets what was read of a run so the next poll reads it again from its first current row.
void GuiController::reload_run(int64_t run_id) {
  auto it = state_.loaded.find(run_id);
  if (it == state_.loaded.end()) return;
  forget_history(it->second);
  force_poll_ = true;
}

namespace {
// A resume prepared on the launch thread, on its way to the main thread.
struct PreparedLaunch {
  ResumeOutcome outcome;
  std::unique_ptr<RunHost> host;
};
}  // namespace

void GuiController::resume_run(int64_t run_id, int64_t step, const std::vector<std::string>& overrides) {
  if (run_active()) {
    state_.set_status("A run is training in this window; resume when it has ended.", true);
    return;
  }
  if (launch_pending()) return;
  const ui::RunRow* row = state_.row(run_id);
  if (row) {
    auto dev = row->config.find("run.devices");
    const std::string why =
        ui::gpu_refusal(dev == row->config.end() ? "auto" : dev->second, state_.launcher.devices, state_.cuda_blocked);
    if (!why.empty()) {
      ui::ResumeNotice n;
      n.open = n.refused = n.gpu_blocked = true;
      n.run_id = run_id;
      n.run_name = row->name;
      n.error = "Run '" + row->name + "' trains on the GPU, and " + why;
      state_.resume_notice = n;
      state_.set_status("Not resumed here: " + why, true);
      return;
    }
  }
  state_.launching = "Preparing the resume of '" + (row ? row->name : std::to_string(run_id)) +
                     "': verifying its checkpoints...";
  const std::string db = db_->path;
  // Choosing a checkpoint hashes its files and reopening the run writes to the database: neither
  // may hold up a frame.
  launch_worker_->post([this, db, run_id, step, overrides] {
    auto launch = std::make_shared<PreparedLaunch>();
    launch->outcome = prepare_resume(db, run_id, step, overrides);
    if (launch->outcome.prep) {
      try {
        launch->host = std::make_unique<RunHost>(std::move(*launch->outcome.prep));
      } catch (const std::exception& e) {
        launch->outcome.error = e.what();
      }
      launch->outcome.prep.reset();
    }
    mailbox_->push([this, launch, run_id](ui::GuiState& s) {
      s.launching.clear();
      const ResumeOutcome& o = launch->outcome;
      ui::ResumeNotice n;
      n.run_id = run_id;
      n.run_name = o.run_name.empty() ? std::to_string(run_id) : o.run_name;
      n.checkpoint = o.checkpoint;
      n.skipped = o.skipped;
      n.mismatches = o.mismatches;
      n.error = o.error;
      n.gpu_blocked = o.gpu_blocked;
      n.refused = !launch->host;
      n.open = n.refused || !n.skipped.empty();
      s.resume_notice = n;
      if (n.refused) {
        s.set_status("Not resumed: " + (!o.error.empty() ? o.error
                                        : !o.mismatches.empty() ? "the checkpoint does not fit: " + o.mismatches.front()
                                                                : std::string("refused")),
                     true);
        return true;
      }
      if (s.quit || run_active()) {
        // Closing meanwhile: the run is not started (its host records that it never was).
        launch->host.reset();
        return true;
      }
      // The resumed history supersedes the rows after the checkpoint; views read it again.
      reload_run(run_id);
      adopt_host(std::move(launch->host));
      std::string msg = "Resumed from " + o.checkpoint;
      if (!o.skipped.empty()) msg += "; skipped " + std::to_string(o.skipped.size()) + " damaged or unfinished";
      if (!o.set_aside.empty())
        msg += "; set aside " + std::to_string(o.set_aside.size()) + " later checkpoint(s) of the abandoned attempt (" +
               o.set_aside.front() + (o.set_aside.size() > 1 ? ", ..." : "") + ")";
      s.set_status(msg, !o.skipped.empty());
      return true;
    });
  });
}

void GuiController::resume_in_new_process(int64_t run_id) {
  const ui::RunRow* row = state_.row(run_id);
  const std::string name = row ? row->name : std::to_string(run_id);
  for (const auto& c : state_.children)
    if (c.run_id == run_id && c.running) return;
  if (state_.live.active && state_.live.view.run_id == run_id && run_active()) {
    state_.set_status("Run '" + name + "' is training in this window.", true);
    return;
  }
  const std::string exe = state_.exe_path;
  if (exe.empty()) {
    state_.set_status("Cannot find this program's path to start it again; run: " +
                          ui::resume_command("deltadeck", run_id, opts_.runs_dir),
                      true);
    return;
  }
  ui::ChildRun c;
  c.run_id = run_id;
  c.run_name = name;
  c.log_path = opts_.runs_dir + "/" + name + ".resume.log";
  c.command = ui::resume_command(exe, run_id, opts_.runs_dir) + " --no-gui >> " + ui::shell_quote(c.log_path) + " 2>&1";
  try {
    c.pid = spawn_resume_process(exe, run_id, opts_.runs_dir, c.log_path);
  } catch (const std::exception& e) {
    state_.set_status(std::string("Could not start the resume process: ") + e.what(), true);
    return;
  }
  state_.set_status("Resuming '" + name + "' in process " + std::to_string(c.pid) + " (log: " + c.log_path +
                    "); follow it in Runs.");
  state_.children.push_back(std::move(c));
  // Its rows supersede what was read after the checkpoint; the next polls notice and read again.
  force_poll_ = true;
}

void GuiController::reap_children() {
  for (auto& c : state_.children) {
    if (!c.running) continue;
    int status = 0;
    const pid_t got = waitpid(static_cast<pid_t>(c.pid), &status, WNOHANG);
    if (got == 0) continue;
    c.running = false;
    if (got < 0) c.outcome = "ended (its status is unknown)";
    else if (WIFEXITED(status)) c.outcome = "exited with status " + std::to_string(WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) c.outcome = "was killed by signal " + std::to_string(WTERMSIG(status));
    const bool ok = got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    state_.set_status("The resume process of '" + c.run_name + "' " + c.outcome + " (log: " + c.log_path + ")", !ok);
    force_poll_ = true;
  }
}

void GuiController::open_run(int64_t run_id) {
  ui::LoadedRun& lr = state_.loaded[run_id];
  lr.id = run_id;
  force_poll_ = true;
}

// An edit through the writable store on the database thread; `task` returns the status line.
void GuiController::edit(const std::string& what, std::function<std::string(void*)> task) {
  db_worker_->post([this, what, task] {
    std::string msg;
    bool error = false;
    try {
      msg = task(&db_->writable());
    } catch (const std::exception& e) {
      msg = what + ": " + e.what();
      error = true;
    }
    mailbox_->push([this, msg, error](ui::GuiState& s) {
      s.set_status(msg, error);
      force_poll_ = true;
      return true;
    });
  });
}

void GuiController::handle_actions() {
  std::vector<ui::Action> actions;
  actions.swap(state_.actions);
  for (auto& a : actions) {
    if (auto* x = std::get_if<ui::act::LoadConfigFile>(&a)) {
      load_config_file(x->path);
    } else if (auto* x = std::get_if<ui::act::SaveConfig>(&a)) {
      std::ofstream out(x->path);
      out << trainer::to_toml(state_.launcher.draft);
      out.close();
      state_.launcher.message = out ? "Saved " + x->path : "Could not write " + x->path;
    } else if (std::get_if<ui::act::StartRun>(&a)) {
      start_run();
    } else if (auto* x = std::get_if<ui::act::SendCommand>(&a)) {
      if (host_) host_->send(x->command);
    } else if (auto* x = std::get_if<ui::act::ResumeRun>(&a)) {
      resume_run(x->run_id, x->step);
    } else if (auto* x = std::get_if<ui::act::RenameRun>(&a)) {
      const int64_t id = x->run_id;
      const std::string name = x->name;
      edit("rename", [id, name](void* st) {
        static_cast<storage::RunStore*>(st)->rename_run(id, name);
        return "Renamed run " + std::to_string(id) + " to '" + name + "'.";
      });
    } else if (auto* x = std::get_if<ui::act::SetNote>(&a)) {
      const int64_t id = x->run_id;
      const std::string note = x->note;
      edit("note", [id, note](void* st) {
        static_cast<storage::RunStore*>(st)->set_note(id, note);
        return std::string("Note saved.");
      });
    } else if (auto* x = std::get_if<ui::act::AddTag>(&a)) {
      const int64_t id = x->run_id;
      const std::string tag = x->tag;
      edit("tag", [id, tag](void* st) {
        static_cast<storage::RunStore*>(st)->add_tag(id, tag);
        return "Tagged '" + tag + "'.";
      });
    } else if (auto* x = std::get_if<ui::act::RemoveTag>(&a)) {
      const int64_t id = x->run_id;
      const std::string tag = x->tag;
      edit("tag", [id, tag](void* st) {
        static_cast<storage::RunStore*>(st)->remove_tag(id, tag);
        return "Removed tag '" + tag + "'.";
      });
    } else if (auto* x = std::get_if<ui::act::DeleteRun>(&a)) {
      const int64_t id = x->run_id;
      if (state_.live.active && state_.live.view.run_id == id && run_active()) {
        state_.set_status("The run training in this window cannot be deleted.", true);
        continue;
      }
      if (state_.runs.focused == id) state_.runs.focused = 0;
      edit("delete", [id](void* st) {
        const storage::DeletedRun d = static_cast<storage::RunStore*>(st)->delete_run(id);
        std::string msg = "Deleted run '" + d.name + "' (" + std::to_string(d.removed.size()) + " folders removed)";
        if (!d.kept.empty()) msg += "; kept: " + d.kept.front() + (d.kept.size() > 1 ? " ..." : "");
        return msg;
      });
    } else if (auto* x = std::get_if<ui::act::ExportCsv>(&a)) {
      const int64_t id = x->run_id;
      const std::string path = x->path, db = db_->path;
      file_worker_->post([this, id, path, db] {
        std::string msg;
        bool error = false;
        try {
          auto conn = storage::open_read_connection(db);
          const int64_t n = storage::export_metrics_csv(conn.get(), id, path);
          msg = "Wrote " + std::to_string(n) + " metric rows to " + path;
        } catch (const std::exception& e) {
          msg = std::string("CSV export: ") + e.what();
          error = true;
        }
        mailbox_->push([msg, error](ui::GuiState& s) {
          s.set_status(msg, error);
          return true;
        });
      });
    } else if (auto* x = std::get_if<ui::act::ExportCheckpoint>(&a)) {
      const auto job = *x;
      state_.set_status("Exporting step " + std::to_string(job.step) + " to " + job.out_dir + "...");
      file_worker_->post([this, job] {
        std::string msg;
        bool error = false;
        try {
          const trainer::ExportResult r = trainer::export_checkpoint(job.dir, job.out_dir, false);
          msg = "Exported step " + std::to_string(r.step) + ": " + r.weights_path + ", " + r.config_path;
        } catch (const std::exception& e) {
          msg = std::string("Export: ") + e.what();
          error = true;
        }
        mailbox_->push([msg, error](ui::GuiState& s) {
          s.set_status(msg, error);
          return true;
        });
      });
    } else if (auto* x = std::get_if<ui::act::VerifyCheckpoint>(&a)) {
      const auto job = *x;
      state_.loaded[job.run_id].checksum[job.step] = ui::ChecksumState::Checking;
      file_worker_->post([this, job] {
        ui::ChecksumState st = ui::ChecksumState::Missing;
        const std::string file = job.dir + "/model.safetensors";
        try {
          if (storage::files::exists(file))
            st = storage::sha256_file(file) == job.sha256 ? ui::ChecksumState::Ok : ui::ChecksumState::Mismatch;
        } catch (const std::exception&) {
          st = ui::ChecksumState::Missing;
        }
        mailbox_->push([job, st](ui::GuiState& s) {
          s.loaded[job.run_id].checksum[job.step] = st;
          return true;
        });
      });
    } else if (auto* x = std::get_if<ui::act::OpenRun>(&a)) {
      open_run(x->run_id);
    } else if (std::get_if<ui::act::RefreshRuns>(&a)) {
      force_poll_ = true;
    } else if (auto* x = std::get_if<ui::act::ResumeInNewProcess>(&a)) {
      resume_in_new_process(x->run_id);
    } else if (std::get_if<ui::act::StopAndClose>(&a)) {
      stop_and_close();
    } else if (std::get_if<ui::act::QuitNow>(&a)) {
      state_.close.quit_now = true;
    }
  }
}

}  // namespace app

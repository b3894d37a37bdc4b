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

#include <algorithm>
#include <fstream>
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
#include "ui/gui/config_diff.h"
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
    int64_t after = 0;
    bool must = false;  // read even if the database did not change (first read, or more to come)
  };
  std::vector<Run> runs;
  int64_t live_id = 0, live_after = 0;
  std::vector<int64_t> details;
  bool details_must = false;  // read details even if the database did not change (a run just opened)
};

struct RunDetails {
  std::vector<storage::CheckpointRecord> checkpoints;
  std::vector<storage::EventRecord> events;
  std::string config_toml;
};

struct PollResult {
  std::string db_status;
  bool rows_fresh = false;
  std::vector<ui::RunRow> rows;
  std::map<int64_t, std::pair<int64_t, std::vector<storage::MetricRowRead>>> metrics;  // id -> (after, rows)
  std::vector<storage::MetricRowRead> live;
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
    try {
      reader = storage::RunStore::open(path, /*read_only=*/true);
    } catch (const std::exception&) {
      // An older schema: one read-write open migrates it (as any deltadeck command would).
      storage::RunStore::open(path);
      reader = storage::RunStore::open(path, /*read_only=*/true);
    }
    return true;
  }

  std::vector<ui::RunRow> rows() {
    std::vector<ui::RunRow> out;
    const auto runs = reader->list_runs();
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
      const int64_t dv = storage::data_version(conn.get());
      const bool changed = dv != data_version || req.force;
      data_version = dv;
      if (changed) {
        res.rows = rows();
        res.rows_fresh = true;
      }
      for (const auto& run : req.runs) {
        if (!changed && !run.must) continue;
        auto got = storage::metrics_after(conn.get(), run.id, run.after, ROWS_PER_POLL);
        res.more |= static_cast<int64_t>(got.size()) == ROWS_PER_POLL;
        res.metrics[run.id] = {run.after, std::move(got)};
      }
      if (req.live_id != 0 && changed) {
        res.live = storage::metrics_after(conn.get(), req.live_id, req.live_after, ROWS_PER_POLL);
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

// Returns whether anything changed that the window shows.
bool apply_poll(ui::GuiState& s, PollResult& r) {
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
    // A run reopened or deleted meanwhile asked again from another row; this answer is stale.
    if (it == s.loaded.end() || it->second.last_rowid != got.first) continue;
    ui::LoadedRun& lr = it->second;
    changed |= !got.second.empty() || !lr.loaded_once;
    for (const auto& m : got.second) lr.history.append(m.point.step, m.point.tokens, m.point.wall_s, m.point.key, m.point.value);
    if (!got.second.empty()) lr.last_rowid = got.second.back().rowid;
    lr.loaded_once = true;
    lr.loading = false;
  }
  if (!r.live.empty() && s.live.active) {
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
  init_launcher();
  if (!opts_.resume.empty()) {
    try {
      auto store = storage::RunStore::open(db_->path, /*read_only=*/true);
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
  // Workers first (they may be mid-read); then the host stops and records a run still going.
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
    req.runs.push_back({id, lr.last_rowid, must});
    lr.loading = must;
  }
  if (state_.live.active && !state_.live.view.ended() && state_.live.view.run_id != 0) {
    req.live_id = state_.live.view.run_id;
    req.live_after = state_.live.last_rowid;
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
      if (res->more) poll_again_ = true;
      return apply_poll(s, *res);
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

bool GuiController::ready_to_quit() const { return state_.quit && !run_active(); }

size_t GuiController::pending_tasks() const { return db_worker_->pending() + file_worker_->pending(); }

// ============================================================================================
// [SECTION] actions
// ============================================================================================

void GuiController::adopt_host(std::unique_ptr<RunHost> host) {
  host_.reset();  // a previous run has ended (the launcher allows no second live run)
  host_ = std::move(host);
  host_->start();
  state_.live = ui::LiveRun{};
  state_.live.active = true;
  state_.dashboard.x.auto_fit = true;
  state_.tab = ui::Tab::Live;
  state_.select_tab = true;
  force_poll_ = true;
}

void GuiController::start_run() {
  ui::LauncherPanel& p = state_.launcher;
  if (run_active()) return;
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

void GuiController::resume_run(int64_t run_id, int64_t step, const std::vector<std::string>& overrides) {
  if (run_active()) {
    state_.set_status("A run is training in this window; resume when it has ended.", true);
    return;
  }
  try {
    PreparedRun prep = prepare_resume(db_->path, run_id, step, overrides);
    const std::string from = prep.resume_from;
    // The resumed history replaces rows after the checkpoint; reread it from scratch.
    state_.loaded.erase(run_id);
    adopt_host(std::make_unique<RunHost>(std::move(prep)));
    state_.set_status("Resumed from " + from);
  } catch (const std::exception& e) {
    state_.set_status(std::string("Could not resume: ") + e.what(), true);
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
    }
  }
}

}  // namespace app

// RunHost: the forwarding thread between a Session and the database and front ends. A storage
// failure is logged into the view and the run goes on: losing a database row is better than
// stopping a training run, and an exception here would leave the engine blocked on a full queue.
#include "app/run_host.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "app/run_owner.h"
#include "app/run_record.h"
#include "storage/file_util.h"
#include "storage/metrics_writer.h"
#include "storage/run_store.h"
#include "trainer/config.h"
#include "trainer/session.h"

namespace app {

namespace {

// Runs a write to the run database, trying again while another process holds its write lock past
// the busy timeout (e.g. `runs delete` of a large run), for up to `patience`; other failures and
// the last busy one are thrown.
template <class Write>
void write_while_busy(Write write, std::chrono::seconds patience) {
  const auto give_up_at = std::chrono::steady_clock::now() + patience;
  std::chrono::milliseconds pause{100};
  for (;;) {
    try {
      write();
      return;
    } catch (const storage::SqliteError& e) {
      if (!e.may_pass() || std::chrono::steady_clock::now() + pause > give_up_at) throw;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(2));
  }
}

// How long the run's end may wait for the lock (nothing else is left to do then), and how long a
// checkpoint's or event's row may hold up the events behind it.
constexpr std::chrono::seconds kEndPatience{180};
constexpr std::chrono::seconds kRowPatience{30};

}  // namespace

PreparedRun record_new_run(trainer::RunConfig cfg, int64_t world_size, const std::string& revision) {
  PreparedRun out;
  out.db_path = cfg.run.runs_dir + "/deltadeck.db";
  out.store = storage::RunStore::open(out.db_path);
  storage::NewRun nr;
  nr.name = cfg.name;
  nr.model = std::string(model::family_name(cfg.model.family)) + "/" + cfg.model.preset;
  nr.config_toml = trainer::to_toml(cfg);
  nr.config_json = trainer::to_json(cfg);
  nr.params = model::count_params(cfg.model);
  nr.world_size = world_size;
  nr.revision = revision;
  nr.checkpoint_dir = cfg.run.checkpoint_dir;
  out.run_id = out.store->create_run(nr);
  out.run_dir = trainer::run_folder(cfg, out.store->run(out.run_id)->name);
  storage::files::make_dirs(out.run_dir);
  out.cfg = std::move(cfg);
  return out;
}

std::string record_resumed_config(PreparedRun& prep, int64_t step) {
  const std::string toml = trainer::to_toml(prep.cfg), json = trainer::to_json(prep.cfg);
  const std::string old_json = prep.store->run_config_json(prep.run_id);
  if (toml == prep.store->run_config_toml(prep.run_id) && json == old_json) return "";
  // The keys that changed, from a JSON diff of the two configs ("/train/steps" -> train.steps).
  std::string changed;
  int listed = 0, more = 0;
  try {
    const nlohmann::json before = nlohmann::json::parse(old_json), after = nlohmann::json::parse(json);
    for (const auto& op : nlohmann::json::diff(before, after)) {
      std::string key = op.value("path", "");
      if (!key.empty() && key[0] == '/') key.erase(0, 1);
      std::replace(key.begin(), key.end(), '/', '.');
      if (listed == 8) {
        ++more;
        continue;
      }
      const nlohmann::json::json_pointer at(op.value("path", ""));
      std::string what = key;
      if (op.value("op", "") == "replace" && before.contains(at))
        what += " " + before.at(at).dump() + " -> " + after.at(at).dump();
      changed += (listed++ == 0 ? "" : ", ") + what;
    }
  } catch (const std::exception&) {
    changed = "";  // an unreadable recorded JSON: the event says only that the config changed
  }
  if (more > 0) changed += " and " + std::to_string(more) + " more";
  prep.store->update_run_config(prep.run_id, toml, json);
  const std::string text = "resume changed the run's config" + (changed.empty() ? "" : ": " + changed) +
                           " (later resumes keep it)";
  prep.store->add_event({prep.run_id, step, "info", text, ""});
  return text;
}

RunHost::RunHost(PreparedRun prep, RunHostOptions opts) : prep_(std::move(prep)), opts_(std::move(opts)) {
  writer_ = std::make_unique<storage::MetricsWriter>(prep_.db_path);
  writer_->keep_alive(prep_.run_id);  // other machines tell this run is alive by its heartbeat
  const storage::RunSummary rec = *prep_.store->run(prep_.run_id);
  view_.run_id = prep_.run_id;
  view_.run_name = rec.name;
  view_.model = rec.model;
  view_.params = rec.params;
  view_.devices = prep_.cfg.run.devices;
  view_.db_path = prep_.db_path;
  view_.run_dir = prep_.run_dir;
  view_.total_steps = prep_.cfg.train.steps;
  view_.log_interval = prep_.cfg.run.log_interval;
  preload_history();
}

RunHost::~RunHost() {
  // A start that failed after the owner file was written leaves no thread to remove it.
  struct ReleaseOwner {
    RunHost* host;
    ~ReleaseOwner() {
      if (host->owner_) release_run_owner(host->prep_.run_dir, *host->owner_);
    }
  } release_owner{this};
  if (thread_.joinable()) {
    send(trainer::Command::Stop);
    thread_.join();
    finish_records();
  } else if (!started_) {
    try {
      prep_.store->finish_run(prep_.run_id, "failed", "the run was never started");
    } catch (const std::exception&) {
      // Nothing left to tell: the next open marks the record interrupted (its process is gone).
    }
  }
}

// A resumed run's metrics up to its checkpoint (later rows were removed when it was reopened),
// so the charts and the ETA continue where the run left off.
void RunHost::preload_history() {
  for (const std::string& key : ui::RunView::series_keys()) {
    ui::Series& s = *view_.series(key);
    for (const storage::MetricPoint& p : prep_.store->metrics(prep_.run_id, key)) {
      s.push_back({p.step, p.tokens, p.wall_s, p.value});
    }
  }
  // The scaler counters, so the first resumed step is not taken for a back-off.
  for (const char* key : {"skipped_steps", "loss_scale"}) {
    auto pts = prep_.store->metrics(prep_.run_id, key);
    if (!pts.empty()) view_.latest[key] = pts.back().value;
  }
  if (!view_.loss.empty()) {
    view_.step = view_.loss.back().step;
    view_.tokens = view_.loss.back().tokens;
    view_.elapsed_s = view_.loss.back().wall_s;
  }
  for (const storage::CheckpointRecord& c : prep_.store->checkpoints(prep_.run_id)) {
    view_.checkpoints.push_back({c.step, c.path, c.bytes});
  }
}

void RunHost::start() {
  trainer::SessionOptions so;
  so.run_dir = prep_.run_dir;
  so.resume_from = prep_.resume_from;
  so.run_name = view_.run_name;
  so.cluster = opts_.cluster;
  so.rendezvous = opts_.rendezvous;
  so.before_checkpoint_commit = [this](int64_t step) { wait_metrics_committed(step); };
  so.poll_stop = opts_.poll_stop;
  session_ = std::make_unique<trainer::Session>(prep_.cfg, so);
  {
    std::lock_guard<std::mutex> lk(mu_);
    started_ = true;
  }
  // A database in memory (tests) has no second connection to read it through: no record then, and
  // no owner file either.
  const bool on_disk = !prep_.db_path.empty() && prep_.db_path != ":memory:";
  if (on_disk) {
    owner_ = this_process_owner(storage::files::absolute_path(prep_.db_path));
    stamp_owner();
  }
  session_->start();
  if (on_disk) record_thread_ = std::thread([this] { record_loop(); });
  thread_ = std::thread([this] { forward(); });
}

void RunHost::forward() {
  bool got_end = false;
  while (auto ev = session_->events().pop()) {
    if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) {
      std::lock_guard<std::mutex> lk(mu_);
      end_ = *e;
      got_end = true;
    }
    handle(*ev);
  }
  session_->join();
  writer_->flush();
  if (const std::string err = writer_->last_error(); !err.empty()) warn("metrics writer: " + err);
  trainer::EndedEvent end;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!got_end) {
      ui::apply_event(view_, end_);  // the default: failed, with why
    }
    end = end_;
  }
  try {
    write_while_busy([&] { prep_.store->finish_run(prep_.run_id, trainer::status_name(end.status), end.message); },
                     kEndPatience);
  } catch (const std::exception& e) {
    warn(std::string("recording the run's end: ") + e.what());
  }
  write_record();
  finish_records();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ended_ = true;
  }
  ended_cv_.notify_all();
}

void RunHost::wait_metrics_committed(int64_t step) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lk(mu_);
    id = ++markers_sent_;
  }
  // Behind every event the engine pushed before this call: when the forwarding thread reaches it,
  // all those metrics rows are queued in the writer, and a flush commits them.
  session_->events().push(trainer::MarkerEvent{id});
  std::unique_lock<std::mutex> lk(mu_);
  if (!marker_cv_.wait_for(lk, std::chrono::minutes(1), [&] { return markers_done_ >= id || ended_; })) {
    lk.unlock();
    warn("checkpoint of step " + std::to_string(step) +
         ": the metrics were not committed within a minute; committing the checkpoint anyway");
  }
}

void RunHost::handle(const trainer::Event& ev) {
  const int64_t run_id = prep_.run_id;
  if (auto* marker = std::get_if<trainer::MarkerEvent>(&ev)) {
    writer_->flush();
    {
      std::lock_guard<std::mutex> lk(mu_);
      markers_done_ = std::max(markers_done_, marker->id);
    }
    marker_cv_.notify_all();
    return;
  }
  // The database first (outside the lock: SQLite may wait on another process), then the view.
  if (auto* m = std::get_if<trainer::MetricsEvent>(&ev)) {
    std::vector<storage::MetricRow> rows;
    rows.reserve(m->values.size());
    for (const auto& [k, v] : m->values) rows.push_back({run_id, {m->step, m->tokens, m->wall_s, k, v}});
    writer_->push(rows);
  } else if (auto* c = std::get_if<trainer::CheckpointEvent>(&ev)) {
    try {
      write_while_busy([&] { prep_.store->add_checkpoint({run_id, c->step, c->path, c->bytes, c->sha256, ""}); },
                       kRowPatience);
      // The engine prunes old checkpoints from disk and names them; their records go too (the view
      // drops them in apply_event below), and so do those of checkpoints removed by hand. Only an
      // absolute path is checked: a relative one, recorded by an older version, is relative to
      // the working directory of the process that saved it, not necessarily this one's.
      for (const auto& rec : prep_.store->checkpoints(run_id)) {
        if (rec.step == c->step) continue;
        const bool pruned = std::find(c->pruned.begin(), c->pruned.end(), rec.step) != c->pruned.end();
        const bool vanished = !rec.path.empty() && rec.path[0] == '/' && !storage::files::exists(rec.path);
        if (!pruned && !vanished) continue;
        prep_.store->remove_checkpoint(run_id, rec.step);
        std::lock_guard<std::mutex> lk(mu_);
        ui::drop_checkpoint(view_, rec.step);
      }
      prep_.store->add_event({run_id, c->step, "info", "checkpoint saved: " + c->path, ""});
    } catch (const std::exception& e) {
      warn(std::string("recording checkpoint ") + c->path + ": " + e.what());
    }
    write_record();
  } else if (auto* l = std::get_if<trainer::LogEvent>(&ev)) {
    try {
      write_while_busy([&] { prep_.store->add_event({run_id, l->step, l->level, l->text, ""}); }, kRowPatience);
    } catch (const std::exception& e) {
      warn(std::string("recording an event: ") + e.what());
    }
  }
  std::vector<ui::LogRecord> recs;
  {
    std::lock_guard<std::mutex> lk(mu_);
    recs = ui::apply_event(view_, ev);
    if (opts_.keep_records) {
      for (const auto& r : recs) records_.push_back(r);
      while (records_.size() > opts_.max_records) {
        records_.pop_front();
        ++dropped_records_;
      }
    }
  }
  // Derived events (skipped steps, scaler back-off) belong in the run's event log too.
  for (const auto& r : recs) {
    if (r.kind != "skipped" && r.kind != "backoff") continue;
    try {
      prep_.store->add_event({run_id, r.step, r.level, r.text, ""});
    } catch (const std::exception& e) {
      warn(std::string("recording an event: ") + e.what());
    }
  }
}

void RunHost::write_record() {
  {
    std::lock_guard<std::mutex> lk(record_mu_);
    record_wanted_ = true;
  }
  record_cv_.notify_all();
}

void RunHost::record_loop() {
  std::unique_ptr<storage::RunStore> reader;
  // One writer for the run's life here: after its first write it appends the new metric rows.
  RunRecordWriter writer(prep_.run_dir);
  // The owner file's stamps (app/run_owner.h) fall due on a clock of their own: records asked for
  // more often than that must not put them off.
  const auto every = std::chrono::seconds(storage::HEARTBEAT_EVERY_S);
  auto stamp_due = std::chrono::steady_clock::now() + every;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(record_mu_);
      for (;;) {
        if (std::chrono::steady_clock::now() >= stamp_due) {
          lk.unlock();
          stamp_owner();
          stamp_due = std::chrono::steady_clock::now() + every;
          lk.lock();
        }
        if (record_wanted_ || record_stop_) break;
        record_cv_.wait_until(lk, stamp_due);
      }
      if (!record_wanted_) return;  // stopped, nothing asked for
      record_wanted_ = false;
    }
    try {
      if (!reader) reader = storage::RunStore::open(prep_.db_path, /*read_only=*/true);
      const auto rec = reader->run(prep_.run_id);
      if (rec) writer.write(*reader, *rec);
    } catch (const std::exception& e) {
      warn(std::string("the run's record beside its checkpoints: ") + e.what());
    }
  }
}

void RunHost::finish_records() {
  if (!record_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(record_mu_);
    record_stop_ = true;
  }
  record_cv_.notify_all();
  record_thread_.join();
  if (owner_) release_run_owner(prep_.run_dir, *owner_);
}

void RunHost::stamp_owner() {
  try {
    write_run_owner(prep_.run_dir, *owner_);
  } catch (const std::exception& e) {
    warn(e.what());
  }
}

void RunHost::warn(const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  warnings_.push_back(what);
  ui::LogRecord r;
  r.kind = "log";
  r.step = view_.step;
  r.tokens = view_.tokens;
  r.wall_s = view_.elapsed_s;
  r.level = "warn";
  r.text = "database: " + what;
  if (opts_.keep_records) records_.push_back(r);
  ui::append_event(view_, std::move(r));
}

void RunHost::snapshot(ui::RunView& view) const {
  std::lock_guard<std::mutex> lk(mu_);
  ui::copy_changes(view_, view);
}

size_t RunHost::take_records(std::vector<ui::LogRecord>& out) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t n = records_.size();
  out.insert(out.end(), std::make_move_iterator(records_.begin()), std::make_move_iterator(records_.end()));
  records_.clear();
  return n;
}

int64_t RunHost::dropped_records() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_records_;
}

void RunHost::send(trainer::Command c) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!started_ || ended_ || view_.ended()) return;
    // Stop is final: after it, pause and resume change nothing the user could see.
    if (stop_sent_) return;
    switch (c) {
      case trainer::Command::Pause: view_.status = "paused"; break;
      case trainer::Command::Resume: view_.status = "running"; break;
      case trainer::Command::Stop:
      case trainer::Command::Preempt:
        view_.status = "stopping";
        stop_sent_ = true;
        break;
      case trainer::Command::SaveNow: break;
    }
    ++view_.version;
  }
  session_->send(c);
}

bool RunHost::ended() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ended_;
}

trainer::EndedEvent RunHost::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  ended_cv_.wait(lk, [&] { return ended_ || !started_; });
  return end_;
}

std::vector<std::string> RunHost::warnings() const {
  std::lock_guard<std::mutex> lk(mu_);
  return warnings_;
}

}  // namespace app

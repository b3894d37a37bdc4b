// Folding engine events into a RunView, and copying a view's changes to a front end's copy.
#include "ui/run_view.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <variant>

#include "ui/log/log_line.h"

namespace ui {

namespace {

constexpr size_t ETA_WINDOW = 20;

LogRecord record(const char* kind, int64_t step, int64_t tokens, double wall_s, const std::string& level = "info",
                 const std::string& text = "") {
  LogRecord r;
  r.kind = kind;
  r.step = step;
  r.tokens = tokens;
  r.wall_s = wall_s;
  r.level = level;
  r.text = text;
  return r;
}

bool find(const std::vector<std::pair<std::string, double>>& values, const std::string& key, double& out) {
  for (const auto& [k, v] : values)
    if (k == key) {
      out = v;
      return true;
    }
  return false;
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// "gpu3.power_w" -> the stats of GPU 3 (created in index order), field "power_w".
void apply_gpu_value(RunView& v, const std::string& key, double value) {
  const size_t dot = key.find('.');
  if (key.rfind("gpu", 0) != 0 || dot == std::string::npos || dot == 3) return;
  const std::string digits = key.substr(3, dot - 3);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return;
  const int index = std::atoi(digits.c_str());
  auto it = std::lower_bound(v.gpus.begin(), v.gpus.end(), index,
                             [](const GpuStats& g, int i) { return g.index < i; });
  if (it == v.gpus.end() || it->index != index) {
    it = v.gpus.insert(it, GpuStats{});
    it->index = index;
  }
  const std::string field = key.substr(dot + 1);
  if (field == "util") it->util = value;
  else if (field == "mem_used_gib") it->mem_used_gib = value;
  else if (field == "power_w") it->power_w = value;
  else if (field == "temp_c") it->temp_c = value;
  else if (field == "sm_clock_mhz") it->sm_clock_mhz = value;
}

void append_tail(const Series& from, Series& to) {
  if (to.size() > from.size()) {
    to = from;
    return;
  }
  to.insert(to.end(), from.begin() + static_cast<std::ptrdiff_t>(to.size()), from.end());
}

// A training step's records: the step itself, and a skipped/backoff record when the scaler's
// counters moved since the previous logged step (the engine reports them only as metrics).
void apply_train_step(RunView& v, const trainer::MetricsEvent& m, std::vector<LogRecord>& out) {
  const auto prev_skipped = v.latest.find("skipped_steps");
  const auto prev_scale = v.latest.find("loss_scale");
  const double skipped_before = prev_skipped == v.latest.end() ? 0 : prev_skipped->second;
  const bool had_scale = prev_scale != v.latest.end();
  const double scale_before = had_scale ? prev_scale->second : 0;

  for (const auto& key : RunView::series_keys()) {
    double value = 0;
    if (key != "val_loss" && find(m.values, key, value)) v.series(key)->push_back({m.step, m.tokens, m.wall_s, value});
  }
  for (const auto& [k, val] : m.values) v.latest[k] = val;
  v.eta_s = estimate_eta(v.loss, v.total_steps);

  LogRecord step = record("step", m.step, m.tokens, m.wall_s);
  step.eta_s = v.eta_s;
  step.values = m.values;
  out.push_back(std::move(step));

  double skipped = 0, scale = 0;
  const bool has_skipped = find(m.values, "skipped_steps", skipped);
  const bool has_scale = find(m.values, "loss_scale", scale);
  const std::string scale_change =
      had_scale && has_scale && scale != scale_before ? "; loss scale " + fmt_g(scale_before) + " -> " + fmt_g(scale)
                                                      : "";
  if (has_skipped && skipped > skipped_before) {
    LogRecord r = record("skipped", m.step, m.tokens, m.wall_s, "warn");
    const auto n = static_cast<long long>(skipped - skipped_before);
    r.text = std::to_string(n) + (n == 1 ? " step" : " steps") + " skipped (non-finite gradients) by step " +
             std::to_string(m.step) + ", " + std::to_string(static_cast<long long>(skipped)) + " in total" +
             scale_change;
    r.values = {{"skipped_steps", skipped}};
    if (has_scale) r.values.emplace_back("loss_scale", scale);
    out.push_back(r);
    append_event(v, std::move(r));
  } else if (had_scale && has_scale && scale < scale_before) {
    LogRecord r = record("backoff", m.step, m.tokens, m.wall_s);
    r.text = "loss scale backed off " + fmt_g(scale_before) + " -> " + fmt_g(scale);
    r.values = {{"loss_scale", scale}};
    out.push_back(r);
    append_event(v, std::move(r));
  }
}

}  // namespace

const std::vector<std::string>& RunView::series_keys() {
  static const std::vector<std::string> keys = {"loss", "val_loss", "grad_norm", "loss_scale",
                                                "lr",   "tokens_per_s", "mfu"};
  return keys;
}

const Series* RunView::series(const std::string& key) const {
  return const_cast<RunView*>(this)->series(key);
}

Series* RunView::series(const std::string& key) {
  if (key == "loss") return &loss;
  if (key == "val_loss") return &val_loss;
  if (key == "grad_norm") return &grad_norm;
  if (key == "loss_scale") return &loss_scale;
  if (key == "lr") return &lr;
  if (key == "tokens_per_s") return &tokens_per_s;
  if (key == "mfu") return &mfu;
  return nullptr;
}

void append_event(RunView& v, LogRecord r) {
  v.events.push_back(std::move(r));
  ++v.events_total;
  if (v.events.size() > RunView::MAX_EVENT_LINES) {
    v.events.erase(v.events.begin(),
                   v.events.begin() + static_cast<std::ptrdiff_t>(v.events.size() - RunView::MAX_EVENT_LINES));
  }
  ++v.version;
}

void drop_checkpoint(RunView& v, int64_t step) {
  auto& c = v.checkpoints;
  c.erase(std::remove_if(c.begin(), c.end(), [&](const CheckpointView& x) { return x.step == step; }), c.end());
  ++v.version;
}

std::vector<LogRecord> apply_event(RunView& v, const trainer::Event& e) {
  std::vector<LogRecord> out;
  ++v.version;
  if (auto* m = std::get_if<trainer::MetricsEvent>(&e)) {
    // Telemetry samples carry the engine's progress too, so the header moves between logged steps.
    v.step = std::max(v.step, m->step);
    v.tokens = std::max(v.tokens, m->tokens);
    v.elapsed_s = std::max(v.elapsed_s, m->wall_s);
    double value = 0;
    if (find(m->values, "val_loss", value)) {
      v.val_loss.push_back({m->step, m->tokens, m->wall_s, value});
      for (const auto& [k, val] : m->values) v.latest[k] = val;
      LogRecord r = record("eval", m->step, m->tokens, m->wall_s);
      r.values = m->values;
      r.text = format_metrics_line(*m, v.total_steps);
      out.push_back(r);
      append_event(v, std::move(r));
    } else if (find(m->values, "loss", value)) {
      apply_train_step(v, *m, out);
    } else {
      for (const auto& [k, val] : m->values) {
        v.latest[k] = val;
        apply_gpu_value(v, k, val);
      }
    }
  } else if (auto* c = std::get_if<trainer::CheckpointEvent>(&e)) {
    v.step = std::max(v.step, c->step);
    auto it = std::lower_bound(v.checkpoints.begin(), v.checkpoints.end(), c->step,
                               [](const CheckpointView& x, int64_t s) { return x.step < s; });
    if (it != v.checkpoints.end() && it->step == c->step) *it = {c->step, c->path, c->bytes};
    else v.checkpoints.insert(it, {c->step, c->path, c->bytes});
    for (int64_t gone : c->pruned) {
      if (gone != c->step) drop_checkpoint(v, gone);
    }
    LogRecord r = record("checkpoint", c->step, v.tokens, v.elapsed_s);
    r.path = c->path;
    r.text = "checkpoint saved at step " + std::to_string(c->step) + ": " + c->path + " (" +
             format_count(static_cast<double>(c->bytes)) + "B)";
    r.values = {{"bytes", static_cast<double>(c->bytes)}};
    out.push_back(r);
    append_event(v, std::move(r));
  } else if (auto* l = std::get_if<trainer::LogEvent>(&e)) {
    // "paused at step 15" arrives before step 15's metrics (they are read one step late).
    v.step = std::max(v.step, l->step);
    LogRecord r = record("log", l->step, v.tokens, v.elapsed_s, l->level.empty() ? "info" : l->level, l->text);
    out.push_back(r);
    append_event(v, std::move(r));
  } else if (auto* s = std::get_if<trainer::StartedEvent>(&e)) {
    if (v.status == "starting") v.status = "running";
    v.device = s->device;
    LogRecord r = record("started", v.step, v.tokens, v.elapsed_s);
    r.text = "started on " + s->device + ": " + std::to_string(s->params) + " parameters, vocab " +
             std::to_string(s->vocab_size);
    r.values = {{"params", static_cast<double>(s->params)}, {"vocab_size", static_cast<double>(s->vocab_size)}};
    out.push_back(r);
    append_event(v, std::move(r));
  } else if (auto* en = std::get_if<trainer::EndedEvent>(&e)) {
    v.status = trainer::status_name(en->status);
    v.end_message = en->message;
    v.step = std::max(v.step, en->step);
    v.eta_s = -1;
    const bool bad = en->status == trainer::RunStatus::Failed || en->status == trainer::RunStatus::Diverged;
    LogRecord r = record("ended", en->step, v.tokens, v.elapsed_s, bad ? "error" : "info");
    r.status = v.status;
    r.text = en->message;
    out.push_back(r);
    append_event(v, std::move(r));
  }
  return out;
}

double estimate_eta(const Series& s, int64_t total_steps) {
  if (s.size() < 2) return -1;
  // The median pace of the recent intervals: one long interval (a pause, a checkpoint, an
  // evaluation) does not make the estimate jump for the window's length.
  std::vector<double> pace;
  for (size_t i = s.size() - std::min(s.size(), ETA_WINDOW) + 1; i < s.size(); ++i) {
    const int64_t steps = s[i].step - s[i - 1].step;
    const double secs = s[i].wall_s - s[i - 1].wall_s;
    if (steps > 0 && secs >= 0) pace.push_back(secs / static_cast<double>(steps));
  }
  if (pace.empty()) return -1;
  std::nth_element(pace.begin(), pace.begin() + static_cast<std::ptrdiff_t>(pace.size() / 2), pace.end());
  const double per_step = pace[pace.size() / 2];
  if (!(per_step > 0)) return -1;
  return static_cast<double>(std::max<int64_t>(0, total_steps - s.back().step)) * per_step;
}

void copy_changes(const RunView& from, RunView& to) {
  if (to.run_id != from.run_id || to.version > from.version || to.events_total > from.events_total) {
    to = from;
    return;
  }
  if (to.version == from.version) return;
  // Every field of RunView that is not append-only is copied here; a new field must be added too.
  to.run_name = from.run_name;
  to.model = from.model;
  to.params = from.params;
  to.devices = from.devices;
  to.device = from.device;
  to.db_path = from.db_path;
  to.run_dir = from.run_dir;
  to.total_steps = from.total_steps;
  to.log_interval = from.log_interval;
  to.status = from.status;
  to.step = from.step;
  to.tokens = from.tokens;
  to.elapsed_s = from.elapsed_s;
  to.eta_s = from.eta_s;
  to.end_message = from.end_message;
  to.latest = from.latest;
  to.gpus = from.gpus;
  to.checkpoints = from.checkpoints;
  for (const auto& key : RunView::series_keys()) append_tail(*from.series(key), *to.series(key));
  const int64_t fresh = from.events_total - to.events_total;
  if (fresh >= static_cast<int64_t>(from.events.size())) {
    to.events = from.events;
  } else if (fresh > 0) {
    to.events.insert(to.events.end(), from.events.end() - fresh, from.events.end());
    if (to.events.size() > RunView::MAX_EVENT_LINES) {
      to.events.erase(to.events.begin(),
                      to.events.begin() + static_cast<std::ptrdiff_t>(to.events.size() - RunView::MAX_EVENT_LINES));
    }
  }
  to.events_total = from.events_total;
  to.version = from.version;
}

}  // namespace ui

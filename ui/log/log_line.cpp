#include "ui/log/log_line.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace ui {

namespace {

using Json = nlohmann::ordered_json;

bool find(const std::vector<std::pair<std::string, double>>& values, const char* key, double& out) {
  for (const auto& [k, v] : values)
    if (k == key) {
      out = v;
      return true;
    }
  return false;
}
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

}  // namespace

std::string format_duration(double seconds) {
  const long long s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

std::string format_count(double v) {
  if (v >= 1e6) return fmt("%.2fM", v / 1e6);
  if (v >= 1e4) return fmt("%.0fk", v / 1e3);
  if (v >= 1e3) return fmt("%.1fk", v / 1e3);
  return fmt("%.0f", v);
}

std::string format_grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt("%.1f ", b) + units[u];
}

std::string format_metrics_line(const trainer::MetricsEvent& m, int64_t total_steps, double eta_s) {
  double v = 0;
  std::string line;
  if (find(m.values, "val_loss", v)) {
    line = "eval step " + std::to_string(m.step) + " | val_loss " + fmt("%.4f", v);
    if (find(m.values, "val_ppl", v)) line += " | val_ppl " + fmt("%.2f", v);
    if (find(m.values, "val_loss_ema", v)) line += " | val_loss_ema " + fmt("%.4f", v);
    return line;
  }
  // Telemetry samples (GPU utilization, power, ...) go to the database, not to a log line.
  if (!find(m.values, "loss", v)) return "";
  line = "step " + std::to_string(m.step) + "/" + std::to_string(total_steps);
  line += " | loss " + fmt("%.4f", v);
  if (find(m.values, "aux_loss", v)) line += " | aux " + fmt("%.4f", v);
  if (find(m.values, "grad_norm", v)) line += " | grad_norm " + fmt("%.3f", v);
  // The scale only matters when scaling is on (it is 1 otherwise).
  if (find(m.values, "loss_scale", v) && v != 1.0) line += " | scale " + fmt("%.0f", v);
  if (find(m.values, "lr", v)) line += " | lr " + fmt("%.2e", v);
  if (find(m.values, "tokens_per_s", v)) line += " | " + format_count(v) + " tok/s";
  if (find(m.values, "mfu", v)) line += " | mfu " + fmt("%.1f", 100.0 * v) + "%";
  if (find(m.values, "mem_peak_gib", v)) line += " | mem " + fmt("%.1f", v) + " GiB";
  line += " | " + format_duration(m.wall_s);
  if (eta_s >= 0) line += " | eta " + format_duration(eta_s);
  return line;
}

std::string format_record_text(const LogRecord& r, int64_t total_steps) {
  const std::string at = " step " + std::to_string(r.step) + " | ";
  if (r.kind == "step") return format_metrics_line({r.step, r.tokens, r.wall_s, r.values}, total_steps, r.eta_s);
  if (r.kind == "eval") return format_metrics_line({r.step, r.tokens, r.wall_s, r.values}, total_steps);
  if (r.kind == "checkpoint") {
    double bytes = 0;
    find(r.values, "bytes", bytes);
    return "checkpoint" + at + r.path + " | " + format_count(bytes) + "B";
  }
  if (r.kind == "skipped" || r.kind == "backoff") return r.kind + at + r.text;
  if (r.kind == "started") return r.text;
  if (r.kind == "log") return r.level + ": " + r.text;
  return "";
}

std::string format_record_json(const LogRecord& r, int64_t total_steps, const std::string& run_name,
                               const std::string& time_utc) {
  Json j;
  j["event"] = r.kind;
  j["time"] = time_utc;
  j["run"] = run_name;
  j["step"] = r.step;
  auto value_of = [&](const char* key) {
    double v = 0;
    return find(r.values, key, v) ? number(v) : Json(nullptr);
  };
  // Counts (bytes, parameters, steps) are integers in the JSON too.
  auto count_of = [&](const char* key) {
    double v = 0;
    return find(r.values, key, v) && std::isfinite(v) ? Json(static_cast<int64_t>(std::llround(v))) : Json(nullptr);
  };
  if (r.kind == "step" || r.kind == "eval") {
    j["total_steps"] = total_steps;
    j["tokens"] = r.tokens;
    j["wall_s"] = number(r.wall_s);
    if (r.kind == "step") j["eta_s"] = r.eta_s >= 0 ? number(r.eta_s) : Json(nullptr);
    for (const auto& [k, v] : r.values) j[k] = number(v);
  } else if (r.kind == "checkpoint") {
    j["path"] = r.path;
    j["bytes"] = count_of("bytes");
  } else if (r.kind == "skipped") {
    j["text"] = r.text;
    j["skipped_steps"] = count_of("skipped_steps");
    j["loss_scale"] = value_of("loss_scale");
  } else if (r.kind == "backoff") {
    j["text"] = r.text;
    j["loss_scale"] = value_of("loss_scale");
  } else if (r.kind == "started") {
    j["text"] = r.text;
    j["params"] = count_of("params");
    j["vocab_size"] = count_of("vocab_size");
  } else if (r.kind == "ended") {
    j["status"] = r.status;
    j["message"] = r.text;
  } else {
    j["level"] = r.level;
    j["text"] = r.text;
  }
  // replace: a message with invalid UTF-8 (a file name, say) must not throw mid-run.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string format_run_json(const RunView& v, const std::string& resume_from, const std::string& config_json,
                            const std::string& time_utc) {
  Json j;
  j["event"] = "run";
  j["time"] = time_utc;
  j["run"] = v.run_name;
  j["step"] = v.step;
  j["id"] = v.run_id;
  j["model"] = v.model;
  j["params"] = v.params;
  j["total_steps"] = v.total_steps;
  j["database"] = v.db_path;
  j["resume_from"] = resume_from;
  Json config = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  j["config"] = config.is_object() ? std::move(config) : Json(nullptr);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ui

#include "ui/log/log_line.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace ui {

namespace {
bool find(const trainer::MetricsEvent& m, const char* key, double& out) {
  for (const auto& [k, v] : m.values)
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

std::string format_metrics_line(const trainer::MetricsEvent& m, int64_t total_steps) {
  double v = 0;
  std::string line;
  if (find(m, "val_loss", v)) {
    line = "eval step " + std::to_string(m.step) + " | val_loss " + fmt("%.4f", v);
    if (find(m, "val_ppl", v)) line += " | val_ppl " + fmt("%.2f", v);
    if (find(m, "val_loss_ema", v)) line += " | val_loss_ema " + fmt("%.4f", v);
    return line;
  }
  // Telemetry samples (GPU utilization, power, ...) go to the database, not to a log line.
  if (!find(m, "loss", v)) return "";
  line = "step " + std::to_string(m.step) + "/" + std::to_string(total_steps);
  if (find(m, "loss", v)) line += " | loss " + fmt("%.4f", v);
  if (find(m, "aux_loss", v)) line += " | aux " + fmt("%.4f", v);
  if (find(m, "grad_norm", v)) line += " | grad_norm " + fmt("%.3f", v);
  if (find(m, "lr", v)) line += " | lr " + fmt("%.2e", v);
  // The scale only matters when scaling is on (it is 1 otherwise).
  if (find(m, "loss_scale", v) && v != 1.0) line += " | scale " + fmt("%.0f", v);
  if (find(m, "tokens_per_s", v)) line += " | " + format_count(v) + " tok/s";
  if (find(m, "mfu", v)) line += " | mfu " + fmt("%.1f", 100.0 * v) + "%";
  if (find(m, "mem_peak_gib", v)) line += " | mem " + fmt("%.1f", v) + " GiB";
  line += " | " + format_duration(m.wall_s);
  return line;
}

}  // namespace ui

#include "ui/gui/metric_plots.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace ui {

bool add_plot_series(const RunHistory& h, std::map<std::string, SmoothedSeries>& smoothed, const std::string& key,
                     XAxis axis, double weight, const std::string& label, ImU32 color, std::vector<PlotSeries>& out) {
  const MetricSeries* s = h.find(key);
  if (!s || s->size() == 0) return false;
  PlotSeries p;
  p.label = label;
  p.color = color;
  p.raw = view_of(*s, h.timeline(), axis);
  // Only this series' own changes invalidate the plot's cached reduction.
  p.version = s->size() * 1000003u + s->truncations;
  // Evaluations are already averages over many batches and come a few per run: an EMA over them
  // would only drag each one towards its predecessors.
  if (weight > 0 && key.rfind("val_", 0) != 0) {
    SmoothedSeries& sm = smoothed[key];
    sm.update(*s, weight);
    p.smooth = p.raw;
    p.smooth.y = sm.y().data();
    p.smooth.pyramid = &sm.pyramid();
    p.version = p.version * 31 + static_cast<uint64_t>(weight * 1e6);
  }
  out.push_back(p);
  return true;
}

std::vector<std::string> indexed_keys(const RunHistory& h, const std::string& prefix, const std::string& suffix) {
  std::vector<std::pair<long, std::string>> found;
  for (const auto& kv : h.series()) {
    const std::string& k = kv.first;
    if (k.size() <= prefix.size() + suffix.size() || k.compare(0, prefix.size(), prefix) != 0 ||
        k.compare(k.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string mid = k.substr(prefix.size(), k.size() - prefix.size() - suffix.size());
    if (mid.empty() || mid.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(std::strtol(mid.c_str(), nullptr, 10), k);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

double last_value(const RunHistory& h, const std::string& key) {
  const MetricSeries* s = h.find(key);
  return s && s->size() ? s->y.back() : std::numeric_limits<double>::quiet_NaN();
}

double min_value(const RunHistory& h, const std::string& key) {
  const MetricSeries* s = h.find(key);
  if (!s || s->size() == 0) return std::numeric_limits<double>::quiet_NaN();
  const MinMax mm = s->pyramid.range(s->y.data(), 0, s->size());
  return mm.empty() ? std::numeric_limits<double>::quiet_NaN() : mm.lo;
}

double value_at_step(const RunHistory& h, const std::string& key, double step) {
  const MetricSeries* s = h.find(key);
  if (!s) return std::numeric_limits<double>::quiet_NaN();
  const auto& tl = h.timeline();
  const auto it = std::lower_bound(s->t.begin(), s->t.end(), step, [&](uint32_t ti, double v) { return tl.step[ti] < v; });
  if (it == s->t.end() || tl.step[*it] != step) return std::numeric_limits<double>::quiet_NaN();
  return s->y[static_cast<size_t>(it - s->t.begin())];
}

}  // namespace ui

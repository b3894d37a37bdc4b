#include "ui/gui/markers.h"

#include <algorithm>

namespace ui {

std::vector<double> steps_where_decreasing(const MetricSeries& s, const Timeline& tl) {
  std::vector<double> out;
  for (size_t i = 1; i < s.size(); ++i)
    if (s.y[i] < s.y[i - 1]) out.push_back(tl.step[s.t[i]]);
  return out;
}

std::vector<double> steps_where_increasing(const MetricSeries& s, const Timeline& tl) {
  std::vector<double> out;
  for (size_t i = 1; i < s.size(); ++i)
    if (s.y[i] > s.y[i - 1]) out.push_back(tl.step[s.t[i]]);
  return out;
}

void ChangeMarkers::update(const MetricSeries& s, const Timeline& tl) {
  if (s.size() < seen || s.truncations != truncations) {
    up.clear();
    down.clear();
    seen = 0;
    truncations = s.truncations;
  }
  for (size_t i = std::max<size_t>(seen, 1); i < s.size(); ++i) {
    if (s.y[i] > s.y[i - 1]) up.push_back(tl.step[s.t[i]]);
    if (s.y[i] < s.y[i - 1]) down.push_back(tl.step[s.t[i]]);
  }
  seen = s.size();
}

double x_at_step(const MetricSeries* reference, const Timeline& tl, double step, XAxis axis) {
  if (axis == XAxis::Step || !reference || reference->size() == 0) return step;
  const auto it = std::lower_bound(reference->t.begin(), reference->t.end(), step,
                                   [&](uint32_t ti, double v) { return tl.step[ti] < v; });
  const uint32_t ti = it == reference->t.end() ? reference->t.back() : *it;
  return tl.axis(axis)[ti];
}

}  // namespace ui

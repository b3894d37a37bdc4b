#include "ui/gui/smoothing.h"

#include <cmath>

namespace ui {

void ema_smooth(const double* y, size_t from, size_t n, double weight, EmaState& st, std::vector<double>& out) {
  for (size_t i = from; i < n; ++i) {
    const double v = y[i];
    if (!std::isfinite(v)) {
      out.push_back(v);
      continue;
    }
    st.acc = weight * st.acc + (1.0 - weight) * v;
    st.weight_pow *= weight;
    out.push_back(st.acc / (1.0 - st.weight_pow));
  }
}

bool SmoothedSeries::update(const MetricSeries& raw, double weight) {
  const bool restart = weight != weight_ || raw.truncations != truncations_ || raw.size() < y_.size();
  if (!restart && raw.size() == y_.size()) return false;
  if (restart) {
    weight_ = weight;
    truncations_ = raw.truncations;
    state_ = EmaState{};
    y_.clear();
    pyramid_.clear();
  }
  const size_t from = y_.size();
  y_.reserve(raw.size());
  ema_smooth(raw.y.data(), from, raw.size(), weight, state_, y_);
  for (size_t n = from + 1; n <= y_.size(); ++n) pyramid_.on_append(y_.data(), n);
  return true;
}

}  // namespace ui

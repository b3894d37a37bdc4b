// Exponential moving average smoothing of a metric, as TensorBoard does it: debiased, so the
// first points are not pulled towards zero. With weight w, for the k-th finite value v_k:
//   acc_k = w·acc_{k-1} + (1 − w)·v_k,  acc_0 = 0,   smoothed_k = acc_k / (1 − w^k)
// Non-finite values pass through unchanged and do not enter the average (one NaN loss would
// otherwise erase the rest of the curve).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ui/gui/series.h"

namespace ui {

struct EmaState {
  double acc = 0;
  double weight_pow = 1;  // w^k after k finite values
};

// Appends the smoothed values of y[from, n) to out, continuing from st. weight in [0, 1).
void ema_smooth(const double* y, size_t from, size_t n, double weight, EmaState& st, std::vector<double>& out);

// The smoothed copy of one MetricSeries, kept up to date incrementally: appended points cost O(new),
// a changed weight or a replaced tail (resume) recomputes from the start. Main thread.
class SmoothedSeries {
 public:
  // Brings the smoothed values in line with `raw` at `weight`. Returns true when anything changed.
  bool update(const MetricSeries& raw, double weight);
  const std::vector<double>& y() const { return y_; }
  const MinMaxPyramid& pyramid() const { return pyramid_; }

 private:
  double weight_ = -1;
  uint64_t truncations_ = 0;
  EmaState state_;
  std::vector<double> y_;
  MinMaxPyramid pyramid_;
};

}  // namespace ui

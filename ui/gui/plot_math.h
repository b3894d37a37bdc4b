// The arithmetic of plot axes: tick positions, the y range (plain, or ignoring outliers), the
// y transform of a log axis and number formats. Pure functions, tested without GL.
#pragma once

#include <string>
#include <vector>

#include "ui/gui/series.h"

namespace ui {

// About `target` ticks over [lo, hi] at 1, 2 or 5 × 10^k (all of them inside the range).
std::vector<double> nice_ticks(double lo, double hi, int target);
// Ticks of a log axis over [lo, hi] (positive values, value space): every decade, plus 2× and 5×
// when the range spans few decades, thinned to about `target`.
std::vector<double> log_ticks(double lo, double hi, int target);

// The y range of a plot from the values it shows (column mins and maxes of every series).
// ignore_outliers: the 2nd percentile of the mins to the 98th of the maxes, so a single early
// spike does not squash the rest of the curve. log_y: non-positive values are left out.
// Returns an empty MinMax when nothing qualifies.
MinMax y_range(const std::vector<double>& mins, const std::vector<double>& maxes, bool ignore_outliers, bool log_y);
// Widens [lo, hi] by `frac` of its span on each side (a flat series gets a span of its own);
// on a log axis the padding is applied to log10 of the bounds.
MinMax pad_range(MinMax r, double frac, bool log_y);

// "0.0123", "1.235", "3.2e-05", "1.2e+06": compact, about `digits` significant digits.
std::string format_value(double v, int digits = 4);
// Large magnitudes with a unit: "950", "2.5k", "12k", "1.25M", "3.4B", "1.2T" (3 significant digits).
std::string format_compact(double v);
// An x value on its axis: steps and tokens as counts ("12.5k", "1.2M"), wall time as a duration.
std::string format_x(double v, XAxis axis);

}  // namespace ui

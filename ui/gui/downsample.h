// Downsampling for drawing: the points of a visible x range reduced to one entry per pixel column
// holding that column's min and max (so a single spike always shows, unlike random sampling) and
// its first and last point (to connect neighbouring columns with true line segments).
// Cost: O(W log N) per series with the min/max pyramid (column edges by binary search, each
// column's min/max from the pyramid), never a pass over all points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ui/gui/series.h"

namespace ui {

// A read-only view of one series against one x axis: point i has x = axis[t ? t[i] : i], y[i].
struct SeriesView {
  const double* axis = nullptr;
  const uint32_t* t = nullptr;       // null: x is axis[i]
  const double* y = nullptr;
  size_t n = 0;
  const MinMaxPyramid* pyramid = nullptr;  // null: min/max by scanning (tests, small series)
  double x(size_t i) const { return axis[t ? t[i] : i]; }
};
SeriesView view_of(const MetricSeries& s, const Timeline& tl, XAxis axis);
// A view of plain arrays (x and y of n points, no pyramid).
SeriesView view_of(const std::vector<double>& x, const std::vector<double>& y);

// The points of one pixel column.
struct Column {
  int px = 0;                 // column index 0..width-1
  size_t count = 0;           // points in the column (>= 1)
  double y_min = 0, y_max = 0;  // over finite values; y_min > y_max when all were non-finite
  double x_first = 0, y_first = 0;
  double x_last = 0, y_last = 0;
};

struct Downsampled {
  std::vector<Column> columns;  // only columns holding points, in x order
  size_t points_in_range = 0;
  // The nearest point left of x0 and right of x1, so lines run to the plot's edges.
  bool has_before = false, has_after = false;
  double x_before = 0, y_before = 0, x_after = 0, y_after = 0;
};

// Column c covers x in [x0 + c·dx, x0 + (c+1)·dx), dx = (x1 - x0) / width, the last one closed at x1.
// Requires x ascending (non-decreasing) over the view. `twin`, when given, is a series with the same
// x (the smoothed copy): its columns come out in twin_out for the price of its min/max alone.
// Any thread; no allocation beyond the results.
Downsampled downsample(const SeriesView& s, double x0, double x1, int width, const SeriesView* twin = nullptr,
                       Downsampled* twin_out = nullptr);

// Index of the first point with x >= v (binary search).
size_t lower_index(const SeriesView& s, double v);
// Index of the first point with x > v.
size_t upper_index(const SeriesView& s, double v);
// The point whose x is nearest to v (hover readout); n when the view is empty.
size_t nearest_index(const SeriesView& s, double v);
// Min and max of y over points [a, b).
MinMax range_of(const SeriesView& s, size_t a, size_t b);

}  // namespace ui

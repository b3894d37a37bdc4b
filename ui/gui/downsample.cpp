#include "ui/gui/downsample.h"

#include <algorithm>
#include <cmath>

namespace ui {

SeriesView view_of(const MetricSeries& s, const Timeline& tl, XAxis axis) {
  SeriesView v;
  v.axis = tl.axis(axis).data();
  v.t = s.t.data();
  v.y = s.y.data();
  v.n = s.size();
  v.pyramid = &s.pyramid;
  return v;
}

SeriesView view_of(const std::vector<double>& x, const std::vector<double>& y) {
  SeriesView v;
  v.axis = x.data();
  v.y = y.data();
  v.n = std::min(x.size(), y.size());
  return v;
}

size_t lower_index(const SeriesView& s, double v) {
  size_t lo = 0, hi = s.n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (s.x(mid) < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

size_t upper_index(const SeriesView& s, double v) {
  size_t lo = 0, hi = s.n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (s.x(mid) <= v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

size_t nearest_index(const SeriesView& s, double v) {
  if (s.n == 0) return 0;
  const size_t i = lower_index(s, v);
  if (i == 0) return 0;
  if (i == s.n) return s.n - 1;
  return (v - s.x(i - 1) <= s.x(i) - v) ? i - 1 : i;
}

MinMax range_of(const SeriesView& s, size_t a, size_t b) {
  if (s.pyramid) return s.pyramid->range(s.y, a, b);
  MinMax r;
  for (size_t i = a; i < b; ++i) r.add(s.y[i]);
  return r;
}

Downsampled downsample(const SeriesView& s, double x0, double x1, int width) {
  Downsampled out;
  if (s.n == 0 || width <= 0 || !(x1 > x0)) return out;
  const size_t begin = lower_index(s, x0);
  const size_t end = upper_index(s, x1);
  if (begin > 0) {
    out.has_before = true;
    out.x_before = s.x(begin - 1);
    out.y_before = s.y[begin - 1];
  }
  if (end < s.n) {
    out.has_after = true;
    out.x_after = s.x(end);
    out.y_after = s.y[end];
  }
  if (begin >= end) return out;
  out.points_in_range = end - begin;
  const double dx = (x1 - x0) / width;
  // Column edges are computed one way only, so membership by edge and by binary search agree.
  auto edge = [&](int c) { return x0 + c * dx; };
  out.columns.reserve(std::min<size_t>(static_cast<size_t>(width), end - begin));
  size_t a = begin;
  while (a < end) {
    // The column of point a, then the first point beyond that column: one binary search per
    // non-empty column, so sparse ranges cost O(points) and dense ones O(W log N).
    const double xa = s.x(a);
    int c = static_cast<int>(std::floor((xa - x0) / dx));
    c = std::max(0, std::min(width - 1, c));
    while (c + 1 < width && xa >= edge(c + 1)) ++c;
    while (c > 0 && xa < edge(c)) --c;
    const size_t b = c + 1 < width ? std::min(end, std::max(a + 1, lower_index(s, edge(c + 1)))) : end;
    Column col;
    col.px = c;
    col.count = b - a;
    const MinMax mm = range_of(s, a, b);
    col.y_min = mm.lo;
    col.y_max = mm.hi;
    col.x_first = s.x(a);
    col.y_first = s.y[a];
    col.x_last = s.x(b - 1);
    col.y_last = s.y[b - 1];
    out.columns.push_back(col);
    a = b;
  }
  return out;
}

}  // namespace ui

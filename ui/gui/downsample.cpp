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

namespace {

// The first index in [lo, hi) with x >= v (x(lo - 1) < v is known), searched outwards from a
// guess: the previous column's point count predicts this one's, so the probes stay near the
// answer (on a uniform step axis the guess is exact: two probes per column instead of ~20).
size_t search_from(const SeriesView& s, size_t lo, size_t hi, size_t guess, double v) {
  guess = std::max(lo, std::min(hi, guess));
  size_t a = lo, b = hi;  // the answer is in [a, b]
  if (guess < hi && s.x(guess) < v) {
    // Forward: double the step until past v.
    size_t step = 1, at = guess;
    a = guess + 1;
    while (true) {
      at = guess + step;
      if (at >= hi) {
        b = hi;
        break;
      }
      if (s.x(at) >= v) {
        b = at;
        break;
      }
      a = at + 1;
      step *= 2;
    }
  } else {
    // Backward from the guess (x(guess) >= v, or guess == hi).
    b = guess;
    size_t step = 1;
    while (true) {
      if (guess < lo + step) {
        a = lo;
        break;
      }
      const size_t at = guess - step;
      if (s.x(at) < v) {
        a = at + 1;
        break;
      }
      b = at;
      step *= 2;
    }
  }
  while (a < b) {
    const size_t mid = a + (b - a) / 2;
    if (s.x(mid) < v) a = mid + 1;
    else b = mid;
  }
  return a;
}

void fill_column(Column& col, const double* y, const MinMaxPyramid* pyr, size_t a, size_t b) {
  MinMax mm;
  if (pyr) {
    mm = pyr->range(y, a, b);
  } else {
    for (size_t i = a; i < b; ++i) mm.add(y[i]);
  }
  col.y_min = mm.lo;
  col.y_max = mm.hi;
  col.y_first = y[a];
  col.y_last = y[b - 1];
}

}  // namespace

Downsampled downsample(const SeriesView& s, double x0, double x1, int width, const SeriesView* twin,
                       Downsampled* twin_out) {
  Downsampled out;
  if (twin_out) *twin_out = Downsampled{};
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
  if (twin_out) {
    *twin_out = out;
    if (begin > 0) twin_out->y_before = twin->y[begin - 1];
    if (end < s.n) twin_out->y_after = twin->y[end];
  }
  if (begin >= end) return out;
  out.points_in_range = end - begin;
  const double dx = (x1 - x0) / width;
  // Column edges are computed one way only, so membership by edge and by binary search agree.
  auto edge = [&](int c) { return x0 + c * dx; };
  out.columns.reserve(std::min<size_t>(static_cast<size_t>(width), end - begin));
  if (twin_out) {
    twin_out->points_in_range = out.points_in_range;
    twin_out->columns.reserve(out.columns.capacity());
  }
  size_t a = begin;
  size_t last_count = 1;
  while (a < end) {
    // The column of point a, then the first point beyond that column: sparse ranges cost O(points),
    // dense ones O(W log(N / W)) for the edges plus the pyramid's O(log) per column.
    const double xa = s.x(a);
    int c = static_cast<int>(std::floor((xa - x0) / dx));
    c = std::max(0, std::min(width - 1, c));
    while (c + 1 < width && xa >= edge(c + 1)) ++c;
    while (c > 0 && xa < edge(c)) --c;
    const size_t b = c + 1 < width ? search_from(s, a + 1, end, a + last_count, edge(c + 1)) : end;
    last_count = b - a;
    Column col;
    col.px = c;
    col.count = b - a;
    col.x_first = s.x(a);
    col.x_last = s.x(b - 1);
    fill_column(col, s.y, s.pyramid, a, b);
    out.columns.push_back(col);
    // The twin (the smoothed copy) has the same x, hence the same columns; only its y differ.
    if (twin_out) {
      fill_column(col, twin->y, twin->pyramid, a, b);
      twin_out->columns.push_back(col);
    }
    a = b;
  }
  return out;
}

}  // namespace ui

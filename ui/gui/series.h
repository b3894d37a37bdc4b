// The metric history of one run as the plots read it: a timeline of (step, tokens, wall) per
// metrics event, and per metric key a MetricSeries of (timeline index, value) points with a min/max
// pyramid for O(W log N) downsampling. No GL, no ImGui: tested in tests/ui.
//
// Why the full series lives in memory instead of being re-fetched from SQLite on zoom: a point
// costs 12 bytes (u32 timeline index + f64 value) plus ~4 bytes of pyramid, so a 1M-point series is
// 16 MB and the dashboard's ~15 series of a million-step run about 250 MB; a typical run (10k-100k
// logged steps) is a few MB. With everything resident, zoom and pan are answered by the pyramid in
// microseconds on the main thread, while a re-fetch would mean a query per zoom gesture, a
// round trip through the reader thread and a visible blur until it returns.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace ui {

// The x axis of a plot.
enum class XAxis { Step = 0, Tokens = 1, Wall = 2 };
const char* x_axis_name(XAxis a);

struct MinMax {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  bool empty() const { return lo > hi; }
  // Non-finite values are not part of any range (a NaN loss would make every range NaN).
  void add(double v) {
    if (!std::isfinite(v)) return;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  void merge(const MinMax& o) {
    if (o.lo < lo) lo = o.lo;
    if (o.hi > hi) hi = o.hi;
  }
};

// Min and max of every aligned block of BLOCK << k values, for every level k. Appending is
// amortised O(1); a range query is O(BLOCK + log N). Level 0 starts at 8-value blocks, so the
// pyramid costs about a quarter of a double per value.
class MinMaxPyramid {
 public:
  static constexpr size_t BLOCK = 8;
  // Call after each append: values[0, n) is the whole series now (the pyramid keeps no copy).
  void on_append(const double* values, size_t n);
  // Forget everything from value n on (a resumed run replaces the tail).
  void truncate(size_t n);
  void clear() { levels_.clear(); }
  // Min and max of values[a, b).
  MinMax range(const double* values, size_t a, size_t b) const;
  size_t levels() const { return levels_.size(); }

 private:
  std::vector<std::vector<MinMax>> levels_;  // levels_[k][i]: values[i*(BLOCK<<k), (i+1)*(BLOCK<<k))
};

// One metric: its points in arrival order, x looked up in the run's Timeline. Within a series the
// points are ordered by every x axis (steps, tokens and wall time only grow within an attempt, and
// RunHistory drops an abandoned attempt's tail before the resumed points arrive).
struct MetricSeries {
  std::vector<uint32_t> t;   // timeline index per point
  std::vector<double> y;     // value per point
  MinMaxPyramid pyramid;     // over y
  uint64_t truncations = 0;  // grows when earlier points are replaced (caches derived from y restart)
  void push(uint32_t ti, double v) {
    t.push_back(ti);
    y.push_back(v);
    pyramid.on_append(y.data(), y.size());
  }
  void truncate(size_t n) {
    if (n >= y.size()) return;
    ++truncations;
    t.resize(n);
    y.resize(n);
    pyramid.truncate(n);
  }
  size_t size() const { return y.size(); }
};

// (step, tokens, wall seconds) of every metrics event, in arrival order.
struct Timeline {
  std::vector<double> step, tokens, wall;
  const std::vector<double>& axis(XAxis a) const { return a == XAxis::Step ? step : a == XAxis::Tokens ? tokens : wall; }
  size_t size() const { return step.size(); }
};

// The whole history of one run, built from metric rows in the order they were written (rowid).
// A resumed run is one continuous history: when a metric's step goes back, the points of the
// abandoned attempt from that step on are dropped. A repeated step replaces the earlier point,
// except for telemetry (gpu<i>.*, sampled every second, often several times within one step).
class RunHistory {
 public:
  void append(int64_t step, int64_t tokens, double wall_s, const std::string& key, double value);
  const MetricSeries* find(const std::string& key) const;
  const std::map<std::string, MetricSeries>& series() const { return series_; }
  const Timeline& timeline() const { return timeline_; }
  // Grows with every append; plots compare it to decide whether cached layouts are stale.
  uint64_t version() const { return version_; }
  // Points across all series.
  size_t points() const { return points_; }
  // Forgets every point (to read the run again from its first row); series keep their keys, empty.
  void clear();

 private:
  uint32_t timeline_index(int64_t step, int64_t tokens, double wall_s);
  Timeline timeline_;
  std::map<std::string, MetricSeries> series_;
  uint64_t version_ = 0;
  size_t points_ = 0;
};

// True for the per-GPU telemetry keys gpu<i>.<what>.
bool is_telemetry_key(const std::string& key);

}  // namespace ui

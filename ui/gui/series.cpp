#include "ui/gui/series.h"

#include <algorithm>
#include <cctype>

namespace ui {

const char* x_axis_name(XAxis a) {
  switch (a) {
    case XAxis::Step: return "step";
    case XAxis::Tokens: return "tokens";
    case XAxis::Wall: return "wall time";
  }
  return "?";
}

void MinMaxPyramid::on_append(const double* values, size_t n) {
  if (n == 0 || n % BLOCK != 0) return;
  MinMax block;
  for (size_t i = n - BLOCK; i < n; ++i) block.add(values[i]);
  if (levels_.empty()) levels_.emplace_back();
  levels_[0].push_back(block);
  // Each completed pair at level k makes one entry at level k + 1.
  for (size_t k = 0; levels_[k].size() % 2 == 0; ++k) {
    const auto& lv = levels_[k];
    MinMax pair = lv[lv.size() - 2];
    pair.merge(lv.back());
    if (levels_.size() == k + 1) levels_.emplace_back();
    levels_[k + 1].push_back(pair);
  }
}

void MinMaxPyramid::truncate(size_t n) {
  // Blocks that end at or before n are unchanged; the rest go.
  for (size_t k = 0; k < levels_.size(); ++k) {
    const size_t keep = n / (BLOCK << k);
    if (levels_[k].size() > keep) levels_[k].resize(keep);
  }
  while (!levels_.empty() && levels_.back().empty()) levels_.pop_back();
}

MinMax MinMaxPyramid::range(const double* values, size_t a, size_t b) const {
  MinMax r;
  if (a >= b) return r;
  const size_t A = (a + BLOCK - 1) / BLOCK * BLOCK;  // first block boundary at or after a
  const size_t B = b / BLOCK * BLOCK;                // last block boundary at or before b
  if (A >= B || levels_.empty()) {
    for (size_t i = a; i < b; ++i) r.add(values[i]);
    return r;
  }
  for (size_t i = a; i < A; ++i) r.add(values[i]);
  for (size_t i = B; i < b; ++i) r.add(values[i]);
  // Whole blocks [l, h) of level 0, climbing like a bottom-up segment tree: an odd left end or an
  // odd right end is taken at this level, the rest pairs up into the next.
  size_t l = A / BLOCK, h = B / BLOCK;
  for (size_t k = 0; l < h && k < levels_.size(); ++k) {
    const auto& lv = levels_[k];
    if (l & 1) r.merge(lv[l++]);
    if (h & 1) r.merge(lv[--h]);
    l >>= 1;
    h >>= 1;
  }
  return r;
}

bool is_telemetry_key(const std::string& key) {
  return key.size() > 4 && key.compare(0, 3, "gpu") == 0 && std::isdigit(static_cast<unsigned char>(key[3])) &&
         key.find('.') != std::string::npos;
}

uint32_t RunHistory::timeline_index(int64_t step, int64_t tokens, double wall_s) {
  // Rows of one event arrive together, so the newest few entries catch nearly every repeat.
  const size_t n = timeline_.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const size_t i = n - back;
    if (timeline_.step[i] == static_cast<double>(step) && timeline_.tokens[i] == static_cast<double>(tokens) &&
        timeline_.wall[i] == wall_s)
      return static_cast<uint32_t>(i);
  }
  timeline_.step.push_back(static_cast<double>(step));
  timeline_.tokens.push_back(static_cast<double>(tokens));
  timeline_.wall.push_back(wall_s);
  return static_cast<uint32_t>(n);
}

void RunHistory::append(int64_t step, int64_t tokens, double wall_s, const std::string& key, double value) {
  MetricSeries& s = series_[key];
  if (!s.y.empty()) {
    const double st = static_cast<double>(step);
    const double last = timeline_.step[s.t.back()];
    if (st < last) {
      // A resumed attempt: everything this metric logged from `step` on belongs to the abandoned one.
      const auto first = std::lower_bound(s.t.begin(), s.t.end(), st,
                                          [&](uint32_t ti, double v) { return timeline_.step[ti] < v; });
      const size_t keep = static_cast<size_t>(first - s.t.begin());
      points_ -= s.size() - keep;
      s.truncate(keep);
    } else if (st == last && !is_telemetry_key(key)) {
      --points_;
      s.truncate(s.size() - 1);
    }
  }
  s.push(timeline_index(step, tokens, wall_s), value);
  ++points_;
  ++version_;
}

const MetricSeries* RunHistory::find(const std::string& key) const {
  auto it = series_.find(key);
  return it == series_.end() ? nullptr : &it->second;
}

void RunHistory::clear() {
  timeline_ = Timeline{};
  // Each series is emptied, not erased: its truncation count moves on, so every cache keyed on a
  // series' size and truncations (smoothing, plot reductions) starts over even if the history is
  // read back to the same number of points.
  for (auto& [key, s] : series_) s.truncate(0);
  points_ = 0;
  ++version_;
}

}  // namespace ui

// The plot's data path without a window: the min/max pyramid, per-pixel-column downsampling,
// EMA smoothing and a resumed run's continuous history.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ui/gui/downsample.h"
#include "ui/gui/markers.h"
#include "ui/gui/series.h"
#include "ui/gui/smoothing.h"

namespace {

ui::MetricSeries make_series(const std::vector<double>& y) {
  ui::MetricSeries s;
  for (size_t i = 0; i < y.size(); ++i) s.push(static_cast<uint32_t>(i), y[i]);
  return s;
}

std::vector<double> iota_x(size_t n) {
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  return x;
}

}  // namespace

TEST(MinMaxPyramid, RangeMatchesBruteForceEverywhere) {
  std::mt19937 rng(42);
  std::normal_distribution<double> nd;
  // 1003 values: not a multiple of the block, so partial blocks at both ends are exercised.
  std::vector<double> y(1003);
  for (auto& v : y) v = nd(rng);
  y[517] = NAN;  // non-finite values are no part of any range
  const ui::MetricSeries s = make_series(y);
  std::uniform_int_distribution<size_t> pick(0, y.size());
  for (int trial = 0; trial < 3000; ++trial) {
    size_t a = pick(rng), b = pick(rng);
    if (a > b) std::swap(a, b);
    ui::MinMax want;
    for (size_t i = a; i < b; ++i) want.add(y[i]);
    const ui::MinMax got = s.pyramid.range(y.data(), a, b);
    ASSERT_EQ(got.lo, want.lo) << "[" << a << ", " << b << ")";
    ASSERT_EQ(got.hi, want.hi) << "[" << a << ", " << b << ")";
  }
}

TEST(MinMaxPyramid, TruncateThenGrowStaysExact) {
  std::vector<double> y;
  for (int i = 0; i < 300; ++i) y.push_back(std::sin(i * 0.1) * i);
  ui::MetricSeries s = make_series(y);
  s.truncate(133);
  y.resize(133);
  for (int i = 0; i < 200; ++i) {
    y.push_back(-i * 0.5);
    s.push(static_cast<uint32_t>(y.size() - 1), y.back());
  }
  for (size_t a = 0; a < y.size(); a += 7)
    for (size_t b = a; b <= y.size(); b += 13) {
      ui::MinMax want;
      for (size_t i = a; i < b; ++i) want.add(y[i]);
      const ui::MinMax got = s.pyramid.range(s.y.data(), a, b);
      ASSERT_EQ(got.lo, want.lo);
      ASSERT_EQ(got.hi, want.hi);
    }
}

// Every pixel column's min and max equal a brute-force pass over the points in that column, and
// the columns' counts add up to the points in range.
TEST(Downsample, KeepsEveryMinAndMaxPerPixelColumn) {
  std::mt19937 rng(7);
  std::normal_distribution<double> nd;
  const size_t n = 200000;
  ui::RunHistory run;
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) {
    y[i] = nd(rng);
    run.append(static_cast<int64_t>(i) * 10, static_cast<int64_t>(i) * 4096, i * 0.25, "loss", y[i]);
  }
  const ui::MetricSeries& s = *run.find("loss");
  for (ui::XAxis axis : {ui::XAxis::Step, ui::XAxis::Tokens, ui::XAxis::Wall}) {
    const ui::SeriesView v = ui::view_of(s, run.timeline(), axis);
    const auto& ax = run.timeline().axis(axis);
    const double x0 = ax[1234] + 0.5, x1 = ax[187654];
    const int width = 977;
    const ui::Downsampled d = ui::downsample(v, x0, x1, width);
    std::vector<ui::MinMax> want(width);
    std::vector<size_t> count(width, 0);
    const double dx = (x1 - x0) / width;
    size_t in_range = 0;
    for (size_t i = 0; i < n; ++i) {
      const double x = ax[i];
      if (x < x0 || x > x1) continue;
      ++in_range;
      int c = 0;
      while (c + 1 < width && x >= x0 + (c + 1) * dx) ++c;  // the edges' definition, by hand
      want[c].add(y[i]);
      ++count[c];
    }
    ASSERT_EQ(d.points_in_range, in_range);
    size_t seen = 0;
    int prev_px = -1;
    for (const auto& col : d.columns) {
      ASSERT_GT(col.px, prev_px) << "columns in order, one entry each";
      prev_px = col.px;
      EXPECT_EQ(col.count, count[col.px]) << "column " << col.px;
      EXPECT_EQ(col.y_min, want[col.px].lo) << "column " << col.px;
      EXPECT_EQ(col.y_max, want[col.px].hi) << "column " << col.px;
      seen += col.count;
    }
    EXPECT_EQ(seen, in_range);
    for (int c = 0; c < width; ++c)
      if (count[c] == 0) {
        for (const auto& col : d.columns) EXPECT_NE(col.px, c);
      }
    EXPECT_TRUE(d.has_before);
    EXPECT_TRUE(d.has_after);
  }
}

TEST(Downsample, SingleSpikeAmongAMillionPointsIsAlwaysVisible) {
  const size_t n = 1000000;
  std::vector<double> y(n, 2.0);
  y[654321] = 50.0;
  const ui::MetricSeries s = make_series(y);
  const std::vector<double> x = iota_x(n);
  ui::SeriesView v;
  v.axis = x.data();
  v.t = s.t.data();
  v.y = s.y.data();
  v.n = s.size();
  v.pyramid = &s.pyramid;
  for (int width : {97, 640, 1920}) {
    const ui::Downsampled d = ui::downsample(v, 0, static_cast<double>(n - 1), width);
    double top = -1;
    for (const auto& c : d.columns) top = std::max(top, c.y_max);
    EXPECT_EQ(top, 50.0) << "width " << width;
    EXPECT_LE(d.columns.size(), static_cast<size_t>(width));
  }
}

TEST(Downsample, SparseRangeGivesTheExactPoints) {
  const std::vector<double> x = {0, 10, 20, 30, 40};
  const std::vector<double> y = {5, 4, 3, 2, 1};
  const ui::Downsampled d = ui::downsample(ui::view_of(x, y), 5, 35, 300);
  ASSERT_EQ(d.columns.size(), 3u);
  EXPECT_EQ(d.columns[0].x_first, 10);
  EXPECT_EQ(d.columns[2].y_last, 2);
  EXPECT_TRUE(d.has_before);
  EXPECT_EQ(d.x_before, 0);
  EXPECT_EQ(d.y_after, 1);
  EXPECT_EQ(ui::nearest_index(ui::view_of(x, y), 26), 3u);
  EXPECT_EQ(ui::nearest_index(ui::view_of(x, y), -5), 0u);
  EXPECT_EQ(ui::nearest_index(ui::view_of(x, y), 99), 4u);
}

TEST(Smoothing, MatchesHandComputation) {
  // w = 0.5: acc 0.5, 1.25, 2.625; debias 0.5, 0.75, 0.875 -> 1, 1.6667, 3.
  const std::vector<double> y = {1, 2, 4};
  ui::EmaState st;
  std::vector<double> out;
  ui::ema_smooth(y.data(), 0, y.size(), 0.5, st, out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_DOUBLE_EQ(out[0], 1.0);
  EXPECT_DOUBLE_EQ(out[1], 1.25 / 0.75);
  EXPECT_DOUBLE_EQ(out[2], 3.0);
  // Weight 0 is the raw series; a NaN passes through and leaves the average alone.
  const std::vector<double> z = {3, NAN, 5};
  ui::EmaState s0;
  std::vector<double> raw;
  ui::ema_smooth(z.data(), 0, z.size(), 0.0, s0, raw);
  EXPECT_EQ(raw[0], 3);
  EXPECT_TRUE(std::isnan(raw[1]));
  EXPECT_EQ(raw[2], 5);
  ui::EmaState s9;
  std::vector<double> sm;
  ui::ema_smooth(z.data(), 0, z.size(), 0.9, s9, sm);
  // acc 0.3 / 0.1 = 3; then acc 0.27 + 0.5 = 0.77 over 1 - 0.81 = 0.19.
  EXPECT_DOUBLE_EQ(sm[0], 3.0);
  EXPECT_DOUBLE_EQ(sm[2], (0.9 * 0.3 + 0.1 * 5) / (1 - 0.81));
}

TEST(Smoothing, IncrementalEqualsFromScratchAndRestartsOnResume) {
  std::vector<double> y;
  ui::MetricSeries s;
  ui::SmoothedSeries sm;
  for (int i = 0; i < 100; ++i) {
    s.push(static_cast<uint32_t>(i), std::cos(i * 0.3) + i * 0.01);
    if (i % 17 == 0) sm.update(s, 0.8);
  }
  sm.update(s, 0.8);
  ui::EmaState st;
  std::vector<double> full;
  ui::ema_smooth(s.y.data(), 0, s.size(), 0.8, st, full);
  ASSERT_EQ(sm.y().size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) ASSERT_DOUBLE_EQ(sm.y()[i], full[i]);
  // A replaced tail (resume) recomputes; so does a new weight.
  s.truncate(40);
  for (int i = 0; i < 70; ++i) s.push(static_cast<uint32_t>(40 + i), 7.0);
  EXPECT_TRUE(sm.update(s, 0.8));
  EXPECT_FALSE(sm.update(s, 0.8));
  full.clear();
  st = {};
  ui::ema_smooth(s.y.data(), 0, s.size(), 0.8, st, full);
  for (size_t i = 0; i < full.size(); ++i) ASSERT_DOUBLE_EQ(sm.y()[i], full[i]);
  EXPECT_EQ(sm.pyramid().range(sm.y().data(), 0, sm.y().size()).hi,
            *std::max_element(full.begin(), full.end()));
}

// A run resumed from its step-20 checkpoint after an attempt that logged to step 35: the
// abandoned attempt's points after step 20 are not drawn; telemetry sampled twice in one step is.
TEST(RunHistory, ResumedRunIsOneContinuousHistory) {
  ui::RunHistory run;
  for (int s = 5; s <= 35; s += 5) run.append(s, s * 100, s * 1.0, "loss", 10.0 - s * 0.1);
  run.append(30, 3000, 30.0, "val_loss", 7.5);
  run.append(30, 3000, 30.0, "gpu0.util", 90);
  run.append(30, 3000, 30.0, "gpu0.util", 91);
  // The resumed attempt: steps 25, 30, 35, 40 again (wall continues from the checkpoint's).
  for (int s = 25; s <= 40; s += 5) run.append(s, s * 100, s * 1.0 + 0.5, "loss", 1.0 + s * 0.01);
  run.append(30, 3000, 30.5, "val_loss", 0.75);
  const ui::MetricSeries& loss = *run.find("loss");
  std::vector<double> steps;
  for (auto ti : loss.t) steps.push_back(run.timeline().step[ti]);
  EXPECT_EQ(steps, (std::vector<double>{5, 10, 15, 20, 25, 30, 35, 40}));
  EXPECT_DOUBLE_EQ(loss.y[3], 10.0 - 2.0);   // the kept attempt before the checkpoint
  EXPECT_DOUBLE_EQ(loss.y[4], 1.25);         // the resumed attempt from step 25 on
  ASSERT_EQ(run.find("val_loss")->size(), 1u);
  EXPECT_DOUBLE_EQ(run.find("val_loss")->y[0], 0.75);
  EXPECT_EQ(run.find("gpu0.util")->size(), 2u);
  EXPECT_EQ(run.points(), 8u + 1u + 2u);
  // x stays ordered on every axis, so binary search works after the resume.
  for (ui::XAxis a : {ui::XAxis::Step, ui::XAxis::Tokens, ui::XAxis::Wall}) {
    const auto v = ui::view_of(loss, run.timeline(), a);
    for (size_t i = 1; i < v.n; ++i) EXPECT_LE(v.x(i - 1), v.x(i));
  }
}

TEST(Markers, BackoffsSkipsAndPlacementOnOtherAxes) {
  ui::RunHistory run;
  const double scale[] = {65536, 65536, 32768, 32768, 65536, 16384};
  const double skipped[] = {0, 0, 1, 1, 1, 3};
  for (int i = 0; i < 6; ++i) {
    run.append((i + 1) * 10, (i + 1) * 1000, (i + 1) * 2.0, "loss_scale", scale[i]);
    run.append((i + 1) * 10, (i + 1) * 1000, (i + 1) * 2.0, "skipped_steps", skipped[i]);
  }
  EXPECT_EQ(ui::steps_where_decreasing(*run.find("loss_scale"), run.timeline()), (std::vector<double>{30, 60}));
  EXPECT_EQ(ui::steps_where_increasing(*run.find("skipped_steps"), run.timeline()), (std::vector<double>{30, 60}));
  ui::ChangeMarkers cm;
  cm.update(*run.find("loss_scale"), run.timeline());
  EXPECT_EQ(cm.down, (std::vector<double>{30, 60}));
  EXPECT_EQ(cm.up, (std::vector<double>{50}));
  run.append(70, 7000, 14.0, "loss_scale", 8192);  // incremental: only the new point is looked at
  cm.update(*run.find("loss_scale"), run.timeline());
  EXPECT_EQ(cm.down, (std::vector<double>{30, 60, 70}));
  EXPECT_EQ(ui::x_at_step(run.find("loss_scale"), run.timeline(), 40, ui::XAxis::Tokens), 4000);
  EXPECT_EQ(ui::x_at_step(run.find("loss_scale"), run.timeline(), 35, ui::XAxis::Wall), 8.0);
  EXPECT_EQ(ui::x_at_step(run.find("loss_scale"), run.timeline(), 35, ui::XAxis::Step), 35);
}

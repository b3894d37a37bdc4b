// Axis arithmetic of the plot widget: ticks, the y range with and without outliers, formats.
#include <gtest/gtest.h>

#include <cmath>

#include "ui/gui/plot_math.h"

TEST(PlotMath, NiceTicksAreRoundAndInside) {
  EXPECT_EQ(ui::nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(ui::nice_ticks(0.13, 0.91, 4), (std::vector<double>{0.2, 0.4, 0.6, 0.8}));
  const auto t = ui::nice_ticks(-1.05, 1.05, 4);
  EXPECT_EQ(t, (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  EXPECT_TRUE(ui::nice_ticks(1, 1, 5).empty());
  EXPECT_TRUE(ui::nice_ticks(0, NAN, 5).empty());
}

TEST(PlotMath, LogTicksByDecade) {
  EXPECT_EQ(ui::log_ticks(1, 1e6, 8), (std::vector<double>{1, 10, 100, 1e3, 1e4, 1e5, 1e6}));
  EXPECT_EQ(ui::log_ticks(1.5, 60, 8), (std::vector<double>{2, 5, 10, 20, 50}));
  // 30 decades thin out to every few.
  EXPECT_LE(ui::log_ticks(1e-15, 1e15, 6).size(), 8u);
  EXPECT_TRUE(ui::log_ticks(0, 10, 5).empty());
}

TEST(PlotMath, IgnoringOutliersDropsASpikeButNotTheCurve) {
  std::vector<double> mins, maxes;
  for (int i = 0; i < 200; ++i) {
    mins.push_back(2.0 + i * 0.001);
    maxes.push_back(2.1 + i * 0.001);
  }
  maxes[3] = 1e4;  // one column with a spike
  const ui::MinMax all = ui::y_range(mins, maxes, false, false);
  EXPECT_EQ(all.hi, 1e4);
  const ui::MinMax robust = ui::y_range(mins, maxes, true, false);
  EXPECT_LT(robust.hi, 3.0);
  EXPECT_GE(robust.lo, 2.0);
  // Log axis: non-positive values do not count.
  const ui::MinMax logr = ui::y_range({-1, 0, 1e-3}, {5, 0, 10}, false, true);
  EXPECT_EQ(logr.lo, 1e-3);
  EXPECT_EQ(logr.hi, 10);
  EXPECT_TRUE(ui::y_range({NAN}, {NAN}, false, false).empty());
}

TEST(PlotMath, PaddingAndFlatSeries) {
  const ui::MinMax p = ui::pad_range({0, 10}, 0.05, false);
  EXPECT_DOUBLE_EQ(p.lo, -0.5);
  EXPECT_DOUBLE_EQ(p.hi, 10.5);
  const ui::MinMax flat = ui::pad_range({3, 3}, 0.05, false);
  EXPECT_LT(flat.lo, 3);
  EXPECT_GT(flat.hi, 3);
  const ui::MinMax lg = ui::pad_range({1, 100}, 0.5, true);
  EXPECT_NEAR(lg.lo, 0.1, 1e-12);
  EXPECT_NEAR(lg.hi, 1000, 1e-9);
}

TEST(PlotMath, Formats) {
  EXPECT_EQ(ui::format_value(0.0123456), "0.01235");
  EXPECT_EQ(ui::format_value(65536), "6.554e+04");
  EXPECT_EQ(ui::format_value(NAN), "nan");
  EXPECT_EQ(ui::format_x(950, ui::XAxis::Step), "950");
  EXPECT_EQ(ui::format_x(1250000, ui::XAxis::Tokens), "1.25M");
  EXPECT_EQ(ui::format_x(185, ui::XAxis::Wall), "3m05s");
  EXPECT_EQ(ui::format_x(3.4e9, ui::XAxis::Tokens), "3.4B");
  EXPECT_EQ(ui::format_compact(2500), "2.5k");
  EXPECT_EQ(ui::format_compact(-12000), "-12k");
  EXPECT_EQ(ui::format_compact(1.2e12), "1.2T");
}

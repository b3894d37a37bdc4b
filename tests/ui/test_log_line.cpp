#include <gtest/gtest.h>

#include "ui/log/log_line.h"

TEST(LogLine, TrainStepFormat) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"loss", 3.41234}, {"grad_norm", 0.8412}, {"lr", 2.9e-4}, {"tokens_per_s", 452300}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000),
            "step 120/5000 | loss 3.4123 | grad_norm 0.841 | lr 2.90e-04 | 452k tok/s | 1m12s");
}

TEST(LogLine, MoeAuxLossFollowsLoss) {
  trainer::MetricsEvent m{5, 0, 3, {{"loss", 2.5}, {"aux_loss", 0.06597}, {"grad_norm", 0.5}}};
  EXPECT_EQ(ui::format_metrics_line(m, 20), "step 5/20 | loss 2.5000 | aux 0.0660 | grad_norm 0.500 | 3s");
}

TEST(LogLine, ScaleAndEmaShownWhenInUse) {
  trainer::MetricsEvent step{7, 0, 2, {{"loss", 2.0}, {"lr", 1e-3}, {"loss_scale", 32768}}};
  EXPECT_EQ(ui::format_metrics_line(step, 10), "step 7/10 | loss 2.0000 | lr 1.00e-03 | scale 32768 | 2s");
  trainer::MetricsEvent off{7, 0, 2, {{"loss", 2.0}, {"loss_scale", 1.0}}};
  EXPECT_EQ(ui::format_metrics_line(off, 10), "step 7/10 | loss 2.0000 | 2s");
  trainer::MetricsEvent eval{10, 0, 3, {{"val_loss", 2.5}, {"val_ppl", 12.18}, {"val_loss_ema", 2.4}}};
  EXPECT_EQ(ui::format_metrics_line(eval, 10), "eval step 10 | val_loss 2.5000 | val_ppl 12.18 | val_loss_ema 2.4000");
}

TEST(LogLine, MfuAndPeakMemoryOnGpuRuns) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"loss", 3.5}, {"tokens_per_s", 452300}, {"mfu", 0.5134}, {"mem_peak_gib", 9.06}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000), "step 120/5000 | loss 3.5000 | 452k tok/s | mfu 51.3% | mem 9.1 GiB | 1m12s");
}

TEST(LogLine, TelemetrySamplesMakeNoLine) {
  trainer::MetricsEvent m{120, 0, 72.4, {{"gpu0.util", 97}, {"gpu0.power_w", 650}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000), "");
}

TEST(LogLine, EvalFormat) {
  trainer::MetricsEvent m{200, 0, 10, {{"val_loss", 2.25}, {"val_ppl", 9.4877}}};
  EXPECT_EQ(ui::format_metrics_line(m, 5000), "eval step 200 | val_loss 2.2500 | val_ppl 9.49");
}

TEST(LogLine, Durations) {
  EXPECT_EQ(ui::format_duration(42.2), "42s");
  EXPECT_EQ(ui::format_duration(185), "3m05s");
  EXPECT_EQ(ui::format_duration(3725), "1h02m");
  EXPECT_EQ(ui::format_count(830), "830");
  EXPECT_EQ(ui::format_count(1260), "1.3k");
  EXPECT_EQ(ui::format_count(2.5e6), "2.50M");
}

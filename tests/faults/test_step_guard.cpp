// StepGuard alone (docs/reliability.md, guarantee 6): non-finite values are skipped and never enter
// the window, so detection keeps working after a NaN (llm.c's detector stays NaN forever); spikes are
// judged only after warm-up with a full window; K skips in a row diverge; the state round-trips
// exactly; and the config keys are validated with clear errors.
#include <gtest/gtest.h>

#include <cmath>

#include "trainer/config.h"
#include "trainer/step_guard.h"

namespace {

using trainer::StepGuard;
using trainer::StepGuardOptions;

StepGuardOptions opts(double z = 6, int64_t window = 8, bool skip = true, int64_t max_skipped = 3, int64_t warmup = 0) {
  StepGuardOptions o;
  o.zscore = z;
  o.window = window;
  o.skip_spikes = skip;
  o.max_skipped = max_skipped;
  o.warmup_steps = warmup;
  return o;
}

// A noisy plateau around 3.0.
double plateau(int64_t step) { return 3.0 + 0.05 * std::sin(static_cast<double>(step) * 1.7); }

TEST(StepGuard, NanIsSkippedAndDetectionGoesOnAfterIt) {
  StepGuard g(opts());
  for (int64_t s = 1; s <= 10; ++s) EXPECT_FALSE(g.record(s, plateau(s), 1.0).skip) << s;
  auto v = g.record(11, NAN, 1.0);
  EXPECT_TRUE(v.nonfinite && v.skip);
  EXPECT_EQ(g.skipped_in_a_row(), 1);
  v = g.record(12, plateau(12), INFINITY);  // an inf gradient, finite loss
  EXPECT_TRUE(v.nonfinite && v.skip);
  EXPECT_FALSE(g.record(13, plateau(13), 1.0).skip);
  EXPECT_EQ(g.skipped_in_a_row(), 0);
  // The window holds no NaN: a spike right after is still seen, with finite statistics.
  v = g.record(14, 20 * plateau(14), 1.0);
  EXPECT_TRUE(v.spike && v.skip);
  EXPECT_TRUE(std::isfinite(v.mean) && std::isfinite(v.stddev) && v.zscore > 6) << v.zscore;
  v = g.record(15, NAN, NAN);
  EXPECT_TRUE(v.nonfinite);
  EXPECT_EQ(g.skipped_total(), 4);
}

TEST(StepGuard, SpikesOnlyAfterWarmupWithAFullWindowAndFlagOnlyKeepsTraining) {
  StepGuard g(opts(6, 8, /*skip=*/false, 3, /*warmup=*/20));
  for (int64_t s = 1; s <= 20; ++s) g.record(s, plateau(s), 1.0);
  EXPECT_FALSE(g.record(20, 50.0, 1.0).spike) << "flagged during warm-up";
  StepGuard h(opts(6, 8, false, 3, 0));
  for (int64_t s = 1; s <= 5; ++s) h.record(s, plateau(s), 1.0);
  EXPECT_FALSE(h.record(6, 50.0, 1.0).spike) << "flagged before the window was full";
  StepGuard f(opts(6, 8, false, 3, 0));
  for (int64_t s = 1; s <= 10; ++s) f.record(s, plateau(s), 1.0);
  auto v = f.record(11, 20 * plateau(11), 1.0);
  EXPECT_TRUE(v.spike);
  EXPECT_FALSE(v.skip);
  EXPECT_EQ(f.spikes_total(), 1);
  EXPECT_EQ(f.skipped_total(), 0);
  // An ordinary wobble is no spike.
  EXPECT_FALSE(f.record(12, plateau(12) + 0.04, 1.0).spike);
}

TEST(StepGuard, SkipsInARowDivergeAndAFiniteStepResetsTheCount) {
  StepGuard g(opts(0, 8, false, 3, 0));
  EXPECT_FALSE(g.record(1, NAN, 1).diverged);
  EXPECT_FALSE(g.record(2, NAN, 1).diverged);
  EXPECT_FALSE(g.record(3, 2.0, 1).diverged);
  EXPECT_FALSE(g.record(4, NAN, 1).diverged);
  EXPECT_FALSE(g.record(5, NAN, 1).diverged);
  EXPECT_TRUE(g.record(6, NAN, 1).diverged);
  StepGuard never(opts(0, 8, false, 0, 0));
  for (int64_t s = 1; s <= 50; ++s) EXPECT_FALSE(never.record(s, NAN, 1).diverged);
}

// The loss scaler's overflows above a scale of 1 are skipped without counting towards the limit:
// with a high train.loss_scale_init they come many in a row at the start of a healthy run.
TEST(StepGuard, LossScalerBackoffsAreSkippedWithoutCountingTowardsDivergence) {
  StepGuard g(opts(0, 8, false, 3, 0));
  for (int64_t s = 1; s <= 30; ++s) {
    const auto v = g.record(s, 2.0, INFINITY, /*scaler_backoff=*/true);
    EXPECT_TRUE(v.skip);
    EXPECT_FALSE(v.diverged) << s;
  }
  EXPECT_EQ(g.skipped_in_a_row(), 0);
  EXPECT_EQ(g.skipped_total(), 0);
  // Neither do they break a run of counted skips; a non-finite loss counts even during a back-off.
  EXPECT_FALSE(g.record(31, NAN, 1).diverged);
  EXPECT_FALSE(g.record(32, 2.0, INFINITY, true).diverged);
  EXPECT_FALSE(g.record(33, NAN, INFINITY, true).diverged);
  EXPECT_EQ(g.skipped_in_a_row(), 2);
  EXPECT_TRUE(g.record(34, 2.0, INFINITY).diverged);  // an overflow at a scale of 1 or below counts
}

TEST(StepGuard, LossSkipsMatchesRecordWithoutChangingState) {
  StepGuard g(opts());
  for (int64_t s = 1; s <= 10; ++s) g.record(s, plateau(s), 1.0);
  const std::string before = g.state();
  EXPECT_TRUE(g.loss_skips(11, 40.0));
  EXPECT_TRUE(g.loss_skips(11, NAN));
  EXPECT_FALSE(g.loss_skips(11, plateau(11)));
  EXPECT_EQ(g.state(), before);
}

TEST(StepGuard, StateRoundTripsBitForBit) {
  StepGuard a(opts(4, 6, true, 5, 0));
  for (int64_t s = 1; s <= 9; ++s) a.record(s, plateau(s) + 1e-13 * static_cast<double>(s), 1.0);
  a.record(10, NAN, 1.0);
  StepGuard b(opts(4, 6, true, 5, 0));
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  // Both now decide the same, to the last bit of the z-score.
  for (double loss : {plateau(11), 3.3, 30.0}) {
    const auto va = a.record(11, loss, 1.0), vb = b.record(11, loss, 1.0);
    EXPECT_EQ(va.skip, vb.skip);
    EXPECT_EQ(va.zscore, vb.zscore);
  }
  EXPECT_THROW(b.load_state("v2;1;2"), std::runtime_error);
  EXPECT_THROW(b.load_state("v1;x;0;0;"), std::runtime_error);
}

TEST(StepGuard, ConfigKeysAreValidatedByName) {
  auto r = trainer::parse_config("", "<test>",
                                 {"data.train=[\"text:/x/*.txt\"]", "train.nonfinite=\"ignore\"",
                                  "train.max_nonfinite_steps=-1", "train.spike_zscore=-2.0", "train.spike_window=1",
                                  "train.spike_action=\"drop\"", "run.save_retries=-1"});
  ASSERT_FALSE(r.ok());
  std::string all;
  for (const auto& e : r.errors) all += e + "\n";
  for (const char* key : {"train.nonfinite: must be one of auto, skip, fail (got \"ignore\")",
                          "train.max_nonfinite_steps: must be >= 0 (got -1)", "train.spike_zscore: must be >= 0",
                          "train.spike_window: must be >= 2 (got 1)", "train.spike_action: must be one of flag, skip",
                          "run.save_retries: must be >= 0 (got -1)"})
    EXPECT_NE(all.find(key), std::string::npos) << key << " not in:\n" << all;
  auto skip_off = trainer::parse_config("", "<test>",
                                        {"data.train=[\"text:/x/*.txt\"]", "train.spike_action=\"skip\"",
                                         "train.spike_zscore=0.0"});
  ASSERT_FALSE(skip_off.ok());
  EXPECT_NE(skip_off.errors[0].find("train.spike_action: \"skip\" needs spike detection on"), std::string::npos)
      << skip_off.errors[0];
  auto retries = trainer::parse_config("", "<test>",
                                       {"data.train=[\"text:/x/*.txt\"]", "run.save_retries=10",
                                        "run.save_retry_delay_s=100.0", "run.collective_timeout_s=600.0"});
  ASSERT_FALSE(retries.ok());
  EXPECT_NE(retries.errors[0].find("run.save_retry_delay_s: save_retries x save_retry_delay_s must stay below"),
            std::string::npos)
      << retries.errors[0];
}

}  // namespace

#include <gtest/gtest.h>

#include <cmath>

#include "trainer/lr_schedule.h"

TEST(LrSchedule, WarmupThenCosineToFloor) {
  trainer::TrainConfig c;
  c.lr = 1.0;
  c.lr_final_frac = 0.1;
  c.steps = 110;
  c.warmup_steps = 10;
  c.schedule = "cosine";
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 4), 0.5);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 10), 1.0);
  // Half way through the decay: floor + (peak - floor) / 2.
  EXPECT_NEAR(trainer::lr_at(c, 60), 0.55, 1e-12);
  EXPECT_NEAR(trainer::lr_at(c, 110), 0.1, 1e-12);
  EXPECT_NEAR(trainer::lr_at(c, 35), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.25)), 1e-12);
}

TEST(LrSchedule, ConstantAndWsd) {
  trainer::TrainConfig c;
  c.lr = 2.0;
  c.lr_final_frac = 0.0;
  c.steps = 100;
  c.warmup_steps = 4;
  c.schedule = "constant";
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 1), 1.0);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 99), 2.0);
  c.schedule = "wsd";
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 50), 2.0);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 80), 2.0);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 90), 1.0);
  EXPECT_DOUBLE_EQ(trainer::lr_at(c, 100), 0.0);
}

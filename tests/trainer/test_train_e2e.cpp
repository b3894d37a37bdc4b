// End to end through the Session, as the app drives it: a tiny GPT learns a synthetic corpus with
// a learnable pattern; the same seed gives the same losses; N steps + resume + N steps give
// bit-identical losses and weights to 2N uninterrupted steps; stop saves a checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/trainer/train_harness.h"

using namespace train_harness;

TEST(TrainE2E, LossFallsFarBelowItsStart) {
  TempDir dir;
  auto cfg = make_config(dir, 200);
  auto r = run(cfg, dir.path() + "/run");
  ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
  ASSERT_EQ(r.losses.size(), 200u);
  EXPECT_GT(r.losses.front(), 5.0);  // untrained: near ln 257 = 5.55
  double last10 = 0;
  for (size_t i = r.losses.size() - 10; i < r.losses.size(); ++i) last10 += r.losses[i] / 10;
  EXPECT_LT(last10, 1.0) << "first " << r.losses.front() << ", mean of last 10 " << last10;
  ASSERT_EQ(r.val_losses.size(), 1u);  // at the end
  EXPECT_LT(r.val_losses.back(), 1.5);
  ASSERT_EQ(r.checkpoints.size(), 1u);  // the final one
}

TEST(TrainE2E, SameSeedSameLosses) {
  TempDir dir;
  auto cfg = make_config(dir, 30);
  auto a = run(cfg, dir.path() + "/a");
  auto b = run(cfg, dir.path() + "/b");
  EXPECT_EQ(a.losses, b.losses);
  cfg.seed = 99;
  auto c = run(cfg, dir.path() + "/c");
  EXPECT_NE(a.losses, c.losses);
}

// N steps + resume + N steps == 2N steps, bit for bit: losses, weights, and the optimizer, EMA
// and loss-scaler state, for AdamW and for Muon, with gradient accumulation.
TEST(TrainE2E, ResumeIsBitIdentical) {
  const std::vector<std::vector<std::string>> variants = {
      {"train.grad_accum=2"},
      {"train.grad_accum=2", "train.ema_decay=0.9", "train.optimizer=\"muon\"", "train.loss_scaling=\"dynamic\"",
       "train.loss_scale_growth_interval=4", "run.eval_interval=10"},
  };
  for (const auto& extra : variants) {
    TempDir dir;
    const int64_t N = 15;
    std::vector<std::string> o = {"run.save_interval=15"};
    o.insert(o.end(), extra.begin(), extra.end());
    auto cfg = make_config(dir, 2 * N, o);
    auto full = run(cfg, dir.path() + "/full");
    ASSERT_EQ(full.ended.status, trainer::RunStatus::Finished) << full.ended.message;
    ASSERT_EQ(full.checkpoints.size(), 2u);
    const std::string mid = full.checkpoints[0];
    EXPECT_NE(mid.find("step_00000015"), std::string::npos) << mid;

    auto resumed = run(cfg, dir.path() + "/resumed", mid);
    ASSERT_EQ(resumed.ended.status, trainer::RunStatus::Finished) << resumed.ended.message;
    ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(resumed.losses[i], full.losses[N + i]) << "step " << N + i + 1;

    auto a = trainer::load_checkpoint(full.checkpoints.back());
    auto b = trainer::load_checkpoint(resumed.checkpoints.back());
    ASSERT_EQ(a.weights.size(), b.weights.size());
    for (size_t i = 0; i < a.weights.size(); ++i)
      EXPECT_TRUE(torch::equal(a.weights[i].second, b.weights[i].second)) << a.weights[i].first;
    ASSERT_EQ(a.state.size(), b.state.size());
    for (size_t i = 0; i < a.state.size(); ++i) {
      EXPECT_EQ(a.state[i].first, b.state[i].first);
      EXPECT_TRUE(torch::equal(a.state[i].second, b.state[i].second)) << a.state[i].first;
    }
    for (const char* k : {"scaler.scale", "scaler.growth_tracker", "scaler.skipped"}) EXPECT_EQ(a.meta[k], b.meta[k]) << k;
  }
}

TEST(TrainE2E, EmaValidationAndScalerMetrics) {
  TempDir dir;
  auto cfg = make_config(dir, 20, {"train.ema_decay=0.8", "train.loss_scaling=\"dynamic\"",
                                   "train.loss_scale_growth_interval=5", "run.eval_interval=10"});
  trainer::Session s(cfg, trainer::SessionOptions(dir.path() + "/run"));
  s.start();
  std::vector<double> scales, val, val_ema;
  while (auto ev = s.events().pop()) {
    if (auto* m = std::get_if<trainer::MetricsEvent>(&*ev)) {
      for (const auto& [k, v] : m->values) {
        if (k == "loss_scale") scales.push_back(v);
        if (k == "val_loss") val.push_back(v);
        if (k == "val_loss_ema") val_ema.push_back(v);
      }
    }
  }
  s.join();
  ASSERT_EQ(scales.size(), 20u);
  // 65536 doubles every 5 finite steps: 131072 after step 5, ..., 1048576 after step 20.
  EXPECT_EQ(scales[4], 131072.0);
  EXPECT_EQ(scales[19], 1048576.0);
  ASSERT_EQ(val.size(), 2u);
  ASSERT_EQ(val_ema.size(), 2u);
  EXPECT_NE(val[1], val_ema[1]);  // the EMA weights are different weights
  EXPECT_TRUE(std::isfinite(val_ema[1]));
}

TEST(TrainE2E, StopCommandSavesAndEndsStopped) {
  TempDir dir;
  auto cfg = make_config(dir, 1000);
  auto r = run(cfg, dir.path() + "/run", "", /*stop_after_step=*/5);
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Stopped);
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_LT(r.losses.size(), 1000u);
  auto ck = trainer::load_checkpoint(r.checkpoints[0]);
  EXPECT_EQ(ck.step, static_cast<int64_t>(r.losses.size()));
}

TEST(TrainE2E, BadDataFailsTheRunWithTheReason) {
  TempDir dir;
  auto cfg = make_config(dir, 10);
  storage::files::remove_tree(dir.path() + "/corpus");
  auto r = run(cfg, dir.path() + "/run");
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_NE(r.ended.message.find("data.train[0]"), std::string::npos) << r.ended.message;
}

// End to end through the Session, as the app drives it: a tiny GPT learns a synthetic corpus with
// a learnable pattern; the same seed gives the same losses; N steps + resume + N steps give
// bit-identical losses and weights to 2N uninterrupted steps; stop saves a checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/trainer/train_harness.h"
#include "trainer/resume_check.h"

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

// With train.muon_experts, Muon takes the MoE experts' stacked weights (a momentum per stack, no
// AdamW moments); without it AdamW keeps them (and Muon the router). A resume may not switch it: the
// saved state is the other optimizer's. A checkpoint fingerprinted before the key existed counts as
// off (Muon left the experts to AdamW then).
TEST(TrainE2E, MuonTakesTheExpertsWhenAsked) {
  TempDir dir;
  const std::vector<std::string> moe = {"model.moe_experts=4", "model.moe_expert_hidden=32",
                                        "train.optimizer=\"muon\"", "run.save_interval=5"};
  auto has = [](const trainer::CheckpointData& d, const std::string& key) {
    for (const auto& [k, t] : d.state)
      if (k == key) return true;
    return false;
  };
  const std::vector<std::string> experts = {"blocks.0.moe.gate", "blocks.0.moe.up", "blocks.0.moe.down",
                                            "blocks.1.moe.gate", "blocks.1.moe.up", "blocks.1.moe.down"};
  std::vector<std::string> on_keys = moe, off_keys = moe;
  on_keys.push_back("train.muon_experts=true");
  const auto on = make_config(dir, 10, on_keys), off = make_config(dir, 10, off_keys);
  std::string off_checkpoint;
  for (const bool muon_experts : {true, false}) {
    SCOPED_TRACE(muon_experts ? "muon_experts = true" : "muon_experts = false");
    auto r = run(muon_experts ? on : off, dir.path() + (muon_experts ? "/on" : "/off"));
    ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
    ASSERT_EQ(r.checkpoints.size(), 2u);
    EXPECT_LT(r.losses.back(), r.losses.front());
    const auto ck = trainer::load_checkpoint(r.checkpoints[0]);
    for (const auto& e : experts) {
      EXPECT_EQ(has(ck, "muon_momentum." + e), muon_experts) << e;
      EXPECT_EQ(has(ck, "exp_avg." + e), !muon_experts) << e;
    }
    EXPECT_TRUE(has(ck, "muon_momentum.blocks.0.moe.router"));
    if (!muon_experts) off_checkpoint = r.checkpoints[0];
  }
  auto refused = run(on, dir.path() + "/switched", off_checkpoint);
  EXPECT_EQ(refused.ended.status, trainer::RunStatus::Failed);
  EXPECT_NE(refused.ended.message.find("train.muon_experts: the checkpoint has off, this run has on"), std::string::npos)
      << refused.ended.message;
  auto compat = trainer::read_compat(off_checkpoint);
  compat.erase("train.muon_experts");  // as written before the key
  EXPECT_TRUE(trainer::resume_mismatches(compat, trainer::resume_fingerprint(off, 1)).empty());
  const auto lines = trainer::resume_mismatches(compat, trainer::resume_fingerprint(on, 1));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("train.muon_experts"), std::string::npos) << lines[0];
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

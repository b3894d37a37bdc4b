// NaN, inf and loss spikes injected into real (tiny, CPU) runs (docs/reliability.md, guarantee 6):
// the step is skipped on every rank with weights and optimizer state exactly as before it, the skip
// is logged with its step, detection still works at later steps, a spike is flagged (and skipped
// when configured) with a window that survives a resume bit for bit, and K skips in a row end the
// run as diverged.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "tests/support/temp_dir.h"
#include "tests/trainer/train_harness.h"

namespace {

using testing_support::TempDir;

struct FaultArmed {
  explicit FaultArmed(const std::string& spec) { setenv("DELTADECK_FAULT", spec.c_str(), 1); }
  ~FaultArmed() { unsetenv("DELTADECK_FAULT"); }
};

struct Outcome {
  trainer::EndedEvent ended;
  std::map<int64_t, trainer::CheckpointEvent> checkpoints;  // by step
  std::vector<trainer::LogEvent> warnings;
  std::vector<double> losses;
};

Outcome run(const trainer::RunConfig& cfg, const std::string& dir, const std::string& resume = "") {
  trainer::Session s(cfg, trainer::SessionOptions(dir, resume));
  s.start();
  Outcome o;
  while (auto ev = s.events().pop()) {
    if (auto* c = std::get_if<trainer::CheckpointEvent>(&*ev)) o.checkpoints[c->step] = *c;
    if (auto* l = std::get_if<trainer::LogEvent>(&*ev); l && (l->level == "warn" || l->level == "error"))
      o.warnings.push_back(*l);
    if (auto* m = std::get_if<trainer::MetricsEvent>(&*ev))
      for (const auto& [k, v] : m->values)
        if (k == "loss") o.losses.push_back(v);
    if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) o.ended = *e;
  }
  s.join();
  return o;
}

// The optimizer's tensors of a checkpoint (RNG states excluded: the data loader's draws go on).
trainer::NamedTensors optimizer_state(const std::string& dir) {
  trainer::NamedTensors out;
  for (auto& [name, t] : trainer::load_checkpoint(dir).state)
    if (name.rfind("rng.", 0) != 0) out.emplace_back(name, t);
  return out;
}

bool same(const trainer::NamedTensors& a, const trainer::NamedTensors& b) {
  if (a.size() != b.size() || a.empty()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !torch::equal(a[i].second, b[i].second)) return false;
  return true;
}

// Step s was skipped exactly: the weights file (same metadata at every step) hashes the same, and
// the optimizer's moments and step count are unchanged.
void expect_unchanged_by(const Outcome& o, int64_t s) {
  SCOPED_TRACE("step " + std::to_string(s));
  ASSERT_TRUE(o.checkpoints.count(s - 1) && o.checkpoints.count(s));
  EXPECT_EQ(o.checkpoints.at(s - 1).sha256, o.checkpoints.at(s).sha256) << "weights changed by a skipped step";
  EXPECT_TRUE(same(optimizer_state(o.checkpoints.at(s - 1).path), optimizer_state(o.checkpoints.at(s).path)));
  EXPECT_EQ(trainer::load_checkpoint(o.checkpoints.at(s - 1).path).meta.at("optimizer.steps"),
            trainer::load_checkpoint(o.checkpoints.at(s).path).meta.at("optimizer.steps"));
}

void expect_changed_by(const Outcome& o, int64_t s) {
  ASSERT_TRUE(o.checkpoints.count(s - 1) && o.checkpoints.count(s));
  EXPECT_NE(o.checkpoints.at(s - 1).sha256, o.checkpoints.at(s).sha256) << "step " << s << " did not train";
}

bool logged_skip(const Outcome& o, int64_t s) {
  for (const auto& l : o.warnings)
    if (l.step == s && l.text.find("step " + std::to_string(s) + " skipped") != std::string::npos) return true;
  return false;
}

TEST(NonFinite, NanLossIsSkippedAndDetectionGoesOn) {
  TempDir dir;
  auto cfg =
      train_harness::make_config(dir, 8, {"run.save_interval=1", "run.keep_checkpoints=100", "train.warmup_steps=1"});
  FaultArmed fault("nan@loss,step=3;nan@loss,step=6");
  const Outcome o = run(cfg, dir.path() + "/run");
  EXPECT_EQ(o.ended.status, trainer::RunStatus::Finished) << o.ended.message;
  expect_unchanged_by(o, 3);
  expect_unchanged_by(o, 6);
  for (int64_t s : {2, 4, 5, 7, 8}) expect_changed_by(o, s);
  EXPECT_TRUE(logged_skip(o, 3) && logged_skip(o, 6));
  EXPECT_FALSE(logged_skip(o, 4));
  // The skips are counted in the metrics and the guard's state is checkpointed.
  EXPECT_NE(trainer::load_checkpoint(o.checkpoints.at(8).path).meta.at("guard.state").find("v1;0;2;"),
            std::string::npos);
}

// Inf in one gradient of rank 1 only, on two Gloo ranks: both skip (the gradients are averaged
// before the decision). With ZeRO-1 each rank updates its own slice and all-gathers, so ranks that
// decided differently would leave the all-gather unmatched and the run would hang into the
// collective timeout instead of finishing.
TEST(NonFinite, InfGradientOnOneRankIsSkippedByEveryRank) {
  for (const char* zero1 : {"false", "true"}) {
    SCOPED_TRACE(std::string("run.zero1=") + zero1);
    TempDir dir;
    auto cfg = train_harness::make_config(
        dir, 6, {"run.save_interval=1", "run.keep_checkpoints=100", "train.warmup_steps=1", "run.devices=\"cpu:2\"",
                 std::string("run.zero1=") + zero1, "run.collective_timeout_s=20.0"});
    FaultArmed fault("inf@grad,step=3,rank=1;nan@loss,step=5,rank=0");
    const Outcome o = run(cfg, dir.path() + "/run");
    EXPECT_EQ(o.ended.status, trainer::RunStatus::Finished) << o.ended.message;
    expect_unchanged_by(o, 3);
    expect_unchanged_by(o, 5);
    expect_changed_by(o, 4);
    expect_changed_by(o, 6);
    EXPECT_TRUE(logged_skip(o, 3) && logged_skip(o, 5));
    // The reported loss of the inf step is the finite average loss: only the gradient was bad.
    ASSERT_EQ(o.losses.size(), 6u);
    EXPECT_TRUE(std::isfinite(o.losses[2])) << o.losses[2];
  }
}

TEST(NonFinite, TooManyInARowEndTheRunAsDiverged) {
  TempDir dir;
  auto cfg = train_harness::make_config(
      dir, 20, {"run.save_interval=2", "train.warmup_steps=1", "run.keep_checkpoints=100", "train.max_nonfinite_steps=3"});
  FaultArmed fault("nan@loss,step=5;nan@loss,step=6;nan@loss,step=7;nan@loss,step=8");
  const Outcome o = run(cfg, dir.path() + "/run");
  EXPECT_EQ(o.ended.status, trainer::RunStatus::Diverged);
  EXPECT_EQ(o.ended.step, 7);
  EXPECT_NE(o.ended.message.find("3 skipped steps in a row"), std::string::npos) << o.ended.message;
  EXPECT_NE(o.ended.message.find("train.max_nonfinite_steps = 3"), std::string::npos) << o.ended.message;
  // No checkpoint of the diverged state: the newest holds the weights from before the skips.
  EXPECT_EQ(o.checkpoints.rbegin()->first, 6);
  EXPECT_EQ(o.checkpoints.at(4).sha256, o.checkpoints.at(6).sha256);
}

// A loss scale far above what fp32 holds: the first steps overflow and the scaler backs off. Those
// are the scaler finding its range, so they do not end the run as diverged, however few skips in a
// row train.max_nonfinite_steps allows.
TEST(NonFinite, LossScalerBackoffsDoNotCountTowardsDivergence) {
  TempDir dir;
  auto cfg = train_harness::make_config(
      dir, 12, {"train.warmup_steps=1", "train.loss_scaling=\"dynamic\"", "train.loss_scale_init=3e38",
                "train.max_nonfinite_steps=1", "run.save_interval=12"});
  const Outcome o = run(cfg, dir.path() + "/run");
  EXPECT_EQ(o.ended.status, trainer::RunStatus::Finished) << o.ended.message;
  ASSERT_EQ(o.checkpoints.count(12), 1u);
  const auto meta = trainer::load_checkpoint(o.checkpoints.at(12).path).meta;
  EXPECT_GE(std::stod(meta.at("scaler.skipped")), 2.0);  // the scaler did skip, more than the limit allows
  EXPECT_LT(std::stod(meta.at("scaler.scale")), 1e38);  // halved at least twice
  EXPECT_NE(meta.at("guard.state").find("v1;0;0;"), std::string::npos) << meta.at("guard.state");
}

TEST(NonFinite, FailModeFailsTheRunNamingTheStep) {
  TempDir dir;
  auto cfg = train_harness::make_config(dir, 8, {"train.warmup_steps=1", "train.nonfinite=\"fail\""});
  FaultArmed fault("nan@loss,step=4");
  const Outcome o = run(cfg, dir.path() + "/run");
  EXPECT_EQ(o.ended.status, trainer::RunStatus::Failed);
  EXPECT_NE(o.ended.message.find("not finite at step 4"), std::string::npos) << o.ended.message;
}

std::vector<std::string> spike_config(const std::string& action) {
  return {"run.save_interval=1",   "run.keep_checkpoints=100", "train.warmup_steps=1",
          "train.spike_window=5", "train.spike_zscore=6.0",    "train.spike_action=\"" + action + "\""};
}

TEST(LossSpike, FlaggedOrSkippedAsConfigured) {
  {
    TempDir dir;
    auto cfg = train_harness::make_config(dir, 10, spike_config("flag"));
    FaultArmed fault("spike@loss,step=8");
    const Outcome o = run(cfg, dir.path() + "/run");
    EXPECT_EQ(o.ended.status, trainer::RunStatus::Finished) << o.ended.message;
    bool flagged = false;
    for (const auto& l : o.warnings)
      flagged = flagged || (l.step == 8 && l.text.find("loss spike at step 8") != std::string::npos);
    EXPECT_TRUE(flagged);
    expect_changed_by(o, 8);  // flagged only: trained on
  }
  {
    TempDir dir;
    auto cfg = train_harness::make_config(dir, 10, spike_config("skip"));
    FaultArmed fault("spike@loss,step=8");
    const Outcome o = run(cfg, dir.path() + "/run");
    EXPECT_EQ(o.ended.status, trainer::RunStatus::Finished) << o.ended.message;
    expect_unchanged_by(o, 8);
    EXPECT_TRUE(logged_skip(o, 8));
    expect_changed_by(o, 9);
  }
}

// The window is part of the checkpoint: resumed at step 6, a window of 5 would not refill before
// step 10 (steps 7..9 are 3 losses), so only a restored window flags and skips the spike at 10,
// and the resumed run matches the uninterrupted one bit for bit.
TEST(LossSpike, WindowSurvivesAResumeBitForBit) {
  TempDir dir;
  FaultArmed fault("spike@loss,step=10");
  auto cfg = train_harness::make_config(dir, 12, spike_config("skip"));
  const Outcome full = run(cfg, dir.path() + "/full");
  ASSERT_TRUE(full.checkpoints.count(6));
  const Outcome resumed = run(cfg, dir.path() + "/resumed", full.checkpoints.at(6).path);
  EXPECT_TRUE(logged_skip(full, 10));
  EXPECT_TRUE(logged_skip(resumed, 10)) << "the resumed run's window did not see the spike";
  ASSERT_EQ(resumed.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.losses[i], full.losses[6 + i]) << "step " << 7 + i;
  EXPECT_EQ(resumed.checkpoints.at(12).sha256, full.checkpoints.at(12).sha256);
}

}  // namespace

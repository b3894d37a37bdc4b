// A hung or failing rank (docs/reliability.md, guarantee 9), with Gloo ranks as threads: the others
// stop within the collective timeout plus a minute, the run fails naming the rank and the
// operation, and the last checkpoint stays intact (its checksums verify). The two-process case (one
// process killed) is dead_node_e2e.sh.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "tests/support/temp_dir.h"
#include "tests/trainer/train_harness.h"

namespace {

using testing_support::TempDir;
using Clock = std::chrono::steady_clock;

struct FaultArmed {
  explicit FaultArmed(const std::string& spec) { setenv("DELTADECK_FAULT", spec.c_str(), 1); }
  ~FaultArmed() { unsetenv("DELTADECK_FAULT"); }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(RankFaults, ARankSleepingInsideAStepFailsTheRunInTime) {
  TempDir dir;
  const double timeout_s = 3;
  auto cfg = train_harness::make_config(dir, 50, {"run.devices=\"cpu:2\"", "run.save_interval=2",
                                                  "run.collective_timeout_s=3.0", "train.warmup_steps=1"});
  FaultArmed fault("hang@backward,rank=1,step=4");
  const auto t0 = Clock::now();
  auto r = train_harness::run(cfg, dir.path() + "/run");
  const double took = seconds_since(t0);
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_LT(took, timeout_s + 60) << "the healthy rank did not give up in time";
  // rank 0 waited for rank 1 in the gradient all-reduce and says so.
  EXPECT_NE(r.ended.message.find("rank 0 of 2"), std::string::npos) << r.ended.message;
  EXPECT_NE(r.ended.message.find("averaging gradients"), std::string::npos) << r.ended.message;
  ASSERT_FALSE(r.checkpoints.empty());
  EXPECT_EQ(trainer::load_checkpoint(r.checkpoints.back()).step, 2);
  EXPECT_EQ(trainer::checkpoint_problem(r.checkpoints.back()), "");
  EXPECT_EQ(trainer::choose_checkpoint(dir.path() + "/run").dir, r.checkpoints.back());
  std::printf("hung rank: the run failed after %.1f s (collective timeout %.0f s): %s\n", took, timeout_s,
              r.ended.message.c_str());
}

TEST(RankFaults, ARankThrowingStopsThePeerAtOnce) {
  TempDir dir;
  auto cfg = train_harness::make_config(dir, 50, {"run.devices=\"cpu:2\"", "run.save_interval=2",
                                                  "run.collective_timeout_s=120.0", "train.warmup_steps=1"});
  FaultArmed fault("throw@optimizer,rank=1,step=5");
  const auto t0 = Clock::now();
  auto r = train_harness::run(cfg, dir.path() + "/run");
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_LT(seconds_since(t0), 60.0) << "the peer waited for the collective timeout";
  EXPECT_NE(r.ended.message.find("injected fault at optimizer (rank 1, step 5)"), std::string::npos)
      << r.ended.message;
  EXPECT_EQ(trainer::checkpoint_problem(r.checkpoints.back()), "");
  EXPECT_EQ(trainer::load_checkpoint(r.checkpoints.back()).step, 4);
}

}  // namespace

// What the app offers after a run fails in a way this process cannot recover from (ui/gui/recovery.h),
// and the history reset a resume needs (ui/gui/series.h).
#include <gtest/gtest.h>

#include "ui/gui/recovery.h"
#include "ui/gui/series.h"
#include "ui/gui/smoothing.h"

TEST(GuiRecovery, WhichDevicesUseTheGpu) {
  const std::vector<std::string> cpu_only = {"cpu (2 cores)"};
  const std::vector<std::string> with_gpu = {"cpu (16 cores)", "cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90)"};
  EXPECT_FALSE(ui::devices_use_gpu("cpu", with_gpu));
  EXPECT_FALSE(ui::devices_use_gpu("cpu:4", with_gpu));
  EXPECT_TRUE(ui::devices_use_gpu("auto", with_gpu));
  EXPECT_FALSE(ui::devices_use_gpu("auto", cpu_only));
  EXPECT_TRUE(ui::devices_use_gpu("0", cpu_only));
  EXPECT_TRUE(ui::devices_use_gpu("0,1", with_gpu));
  EXPECT_TRUE(ui::devices_use_gpu("all", with_gpu));
}

TEST(GuiRecovery, GpuRunsAreRefusedOnlyWhileTheGpuIsBlocked) {
  const std::vector<std::string> with_gpu = {"cpu (16 cores)", "cuda:0 (H100)", "cuda:1 (H100)"};
  EXPECT_EQ(ui::gpu_refusal("0,1", with_gpu, ""), "");
  EXPECT_EQ(ui::gpu_refusal("cpu", with_gpu, "rank 1 failed in a multi-GPU run (x)"), "");
  const std::string why = ui::gpu_refusal("auto", with_gpu, "rank 1 failed in a multi-GPU run (x)");
  EXPECT_EQ(why.rfind("this process can no longer use the GPU: rank 1 failed in a multi-GPU run (x).", 0), 0u) << why;
  EXPECT_NE(why.find("new deltadeck process"), std::string::npos);
}

TEST(GuiRecovery, TheResumeCommandIsOneAShellTakesAsIs) {
  EXPECT_EQ(ui::shell_quote("runs"), "runs");
  EXPECT_EQ(ui::shell_quote("/tmp/a b"), "'/tmp/a b'");
  EXPECT_EQ(ui::shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(ui::shell_quote(""), "''");
  EXPECT_EQ(ui::resume_command("/opt/dd/deltadeck", 12, "/data/my runs"),
            "/opt/dd/deltadeck train --resume 12 --runs-dir '/data/my runs'");
}

// A run read again from its start after a resume: caches keyed on a series' size and truncations
// must see a change even when the new history has as many points as the old one.
TEST(GuiRecovery, AClearedHistoryInvalidatesCachesOfTheSameSize) {
  ui::RunHistory h;
  for (int i = 1; i <= 20; ++i) h.append(i, i * 10, i * 0.1, "loss", 5.0 - i * 0.1);
  ui::SmoothedSeries sm;
  sm.update(*h.find("loss"), 0.5);
  const uint64_t before = h.find("loss")->truncations;
  const double old_first = sm.y()[0];
  h.clear();
  EXPECT_EQ(h.points(), 0u);
  EXPECT_EQ(h.timeline().size(), 0u);
  for (int i = 1; i <= 20; ++i) h.append(i, i * 10, i * 0.1, "loss", 1.0);
  const ui::MetricSeries& s = *h.find("loss");
  EXPECT_EQ(s.size(), 20u);
  EXPECT_GT(s.truncations, before);
  EXPECT_TRUE(sm.update(s, 0.5));
  EXPECT_NE(sm.y()[0], old_first);
  EXPECT_DOUBLE_EQ(sm.y()[19], 1.0);
}

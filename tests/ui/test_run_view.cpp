// The RunView reducer and its incremental copy: what every front end draws from.
#include <gtest/gtest.h>

#include "ui/run_view.h"

namespace {

trainer::MetricsEvent step_event(int64_t step, double loss, double wall_s,
                                 std::vector<std::pair<std::string, double>> extra = {}) {
  trainer::MetricsEvent m{step, step * 100, wall_s, {{"loss", loss}, {"grad_norm", 0.5}, {"lr", 1e-3}}};
  m.values.insert(m.values.end(), extra.begin(), extra.end());
  return m;
}

ui::RunView fresh_view() {
  ui::RunView v;
  v.run_id = 7;
  v.total_steps = 100;
  return v;
}

TEST(RunView, TrainStepsFillSeriesAndProgress) {
  ui::RunView v = fresh_view();
  auto recs = ui::apply_event(v, trainer::StartedEvent{1000, 257, "cpu"});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].kind, "started");
  EXPECT_EQ(v.status, "running");
  EXPECT_EQ(v.device, "cpu");

  recs = ui::apply_event(v, step_event(10, 3.0, 5.0, {{"tokens_per_s", 2000}}));
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].kind, "step");
  EXPECT_EQ(recs[0].values.size(), 4u);  // every metric of the step
  EXPECT_EQ(recs[0].eta_s, -1);          // one point: no pace yet
  ui::apply_event(v, step_event(20, 2.0, 15.0));
  EXPECT_EQ(v.step, 20);
  EXPECT_EQ(v.tokens, 2000);
  EXPECT_DOUBLE_EQ(v.elapsed_s, 15.0);
  ASSERT_EQ(v.loss.size(), 2u);
  EXPECT_DOUBLE_EQ(v.loss[1].value, 2.0);
  EXPECT_EQ(v.grad_norm.size(), 2u);
  EXPECT_EQ(v.tokens_per_s.size(), 1u);
  EXPECT_TRUE(v.mfu.empty());
  // 10 steps took 10 s; 80 steps are left.
  EXPECT_DOUBLE_EQ(v.eta_s, 80.0);
  EXPECT_DOUBLE_EQ(v.latest.at("lr"), 1e-3);
  // Steps are not event-log lines (the charts show them).
  EXPECT_EQ(v.events.size(), 1u);
}

TEST(RunView, EvalCheckpointLogAndEnd) {
  ui::RunView v = fresh_view();
  auto recs = ui::apply_event(v, trainer::MetricsEvent{50, 5000, 9, {{"val_loss", 2.5}, {"val_ppl", 12.18}}});
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].kind, "eval");
  EXPECT_EQ(recs[0].text, "eval step 50 | val_loss 2.5000 | val_ppl 12.18");
  ASSERT_EQ(v.val_loss.size(), 1u);
  EXPECT_TRUE(v.loss.empty());

  ui::apply_event(v, trainer::CheckpointEvent{50, "/r/checkpoints/step_00000050", 2048, "ab", {}});
  ui::apply_event(v, trainer::CheckpointEvent{20, "/r/checkpoints/step_00000020", 1024, "cd", {}});
  ui::apply_event(v, trainer::CheckpointEvent{50, "/r/checkpoints/step_00000050", 4096, "ef", {}});  // saved again
  ASSERT_EQ(v.checkpoints.size(), 2u);
  EXPECT_EQ(v.checkpoints[0].step, 20);
  EXPECT_EQ(v.checkpoints[1].bytes, 4096);
  ui::drop_checkpoint(v, 20);
  ASSERT_EQ(v.checkpoints.size(), 1u);
  // A save names the checkpoints its pruning removed; the view drops them with the same event.
  ui::apply_event(v, trainer::CheckpointEvent{45, "/r/checkpoints/step_00000045", 4096, "01", {}});
  ASSERT_EQ(v.checkpoints.size(), 2u);
  ui::apply_event(v, trainer::CheckpointEvent{50, "/r/checkpoints/step_00000050", 4096, "02", {45}});
  ASSERT_EQ(v.checkpoints.size(), 1u);
  EXPECT_EQ(v.checkpoints[0].step, 50);
  EXPECT_EQ(v.checkpoints[0].bytes, 4096);

  recs = ui::apply_event(v, trainer::LogEvent{51, "warn", "loader slow"});
  EXPECT_EQ(recs[0].level, "warn");
  EXPECT_EQ(v.step, 51);  // the engine's messages carry its step ("paused at step 51")
  recs = ui::apply_event(v, trainer::EndedEvent{trainer::RunStatus::Stopped, 60, "stopped by request"});
  EXPECT_EQ(recs[0].kind, "ended");
  EXPECT_EQ(recs[0].status, "stopped");
  EXPECT_EQ(v.status, "stopped");
  EXPECT_TRUE(v.ended());
  EXPECT_EQ(v.step, 60);
  EXPECT_EQ(v.events.back().text, "stopped by request");
  EXPECT_EQ(v.events_total, 8);  // eval, 5 checkpoints, log, end
}

TEST(RunView, SkippedStepsAndBackoffAreDerivedFromTheScaler) {
  ui::RunView v = fresh_view();
  ui::apply_event(v, step_event(1, 9, 1, {{"loss_scale", 65536}, {"skipped_steps", 0}}));
  EXPECT_EQ(v.events_total, 0);
  auto recs = ui::apply_event(v, step_event(2, 9, 2, {{"loss_scale", 32768}, {"skipped_steps", 1}}));
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].kind, "skipped");
  EXPECT_EQ(recs[1].level, "warn");
  EXPECT_EQ(recs[1].text,
            "1 step skipped (non-finite gradients) by step 2, 1 in total; loss scale 65536 -> 32768");
  // A lower scale without a skip (e.g. restored state) is a back-off of its own.
  recs = ui::apply_event(v, step_event(3, 9, 3, {{"loss_scale", 16384}, {"skipped_steps", 1}}));
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].kind, "backoff");
  EXPECT_EQ(recs[1].text, "loss scale backed off 32768 -> 16384");
  // Growth is no event.
  recs = ui::apply_event(v, step_event(4, 9, 4, {{"loss_scale", 32768}, {"skipped_steps", 1}}));
  EXPECT_EQ(recs.size(), 1u);
  EXPECT_EQ(v.loss_scale.size(), 4u);
}

TEST(RunView, TelemetryFillsTheGpuTableNotTheCharts) {
  ui::RunView v = fresh_view();
  ui::apply_event(v, trainer::MetricsEvent{33, 3300, 12, {{"gpu1.util", 97}, {"gpu1.power_w", 650}, {"gpu0.temp_c", 61},
                                                         {"gpu0.mem_used_gib", 70.5}, {"gpuX.util", 1}}});
  ASSERT_EQ(v.gpus.size(), 2u);
  EXPECT_EQ(v.gpus[0].index, 0);
  EXPECT_DOUBLE_EQ(v.gpus[0].temp_c, 61);
  EXPECT_DOUBLE_EQ(v.gpus[0].mem_used_gib, 70.5);
  EXPECT_EQ(v.gpus[1].index, 1);
  EXPECT_DOUBLE_EQ(v.gpus[1].util, 97);
  EXPECT_DOUBLE_EQ(v.gpus[1].power_w, 650);
  EXPECT_TRUE(v.loss.empty());
  EXPECT_EQ(v.step, 33);  // telemetry carries the engine's progress
}

TEST(RunView, EtaUsesTheRecentPace) {
  ui::Series s;
  EXPECT_EQ(ui::estimate_eta(s, 100), -1);
  // 30 slow steps (2 s each), then 20 fast ones (1 s each): the window sees only the fast ones.
  double t = 0;
  for (int64_t i = 1; i <= 30; ++i) s.push_back({i, 0, t += 2, 1});
  for (int64_t i = 31; i <= 50; ++i) s.push_back({i, 0, t += 1, 1});
  EXPECT_DOUBLE_EQ(ui::estimate_eta(s, 100), 50.0);
  EXPECT_DOUBLE_EQ(ui::estimate_eta(s, 50), 0.0);
  // A 30-minute pause between two logged points: the estimate keeps the pace of the steps.
  s.push_back({51, 0, t += 1800, 1});
  EXPECT_DOUBLE_EQ(ui::estimate_eta(s, 100), 49.0);
  for (int64_t i = 52; i <= 55; ++i) s.push_back({i, 0, t += 1, 1});
  EXPECT_DOUBLE_EQ(ui::estimate_eta(s, 100), 45.0);
}

TEST(RunView, CopyChangesAppendsOnlyTheTail) {
  ui::RunView host = fresh_view();
  ui::RunView front;
  ui::copy_changes(host, front);
  EXPECT_EQ(front.run_id, 7);
  for (int64_t i = 1; i <= 5; ++i) ui::apply_event(host, step_event(i, 10.0 - i, i));
  ui::copy_changes(host, front);
  ASSERT_EQ(front.loss.size(), 5u);
  // Mark the front end's copy: an incremental copy keeps its existing points, a full one would not.
  front.loss[0].value = -1;
  for (int64_t i = 6; i <= 8; ++i) ui::apply_event(host, step_event(i, 10.0 - i, i));
  host.status = "paused";
  ++host.version;
  ui::copy_changes(host, front);
  ASSERT_EQ(front.loss.size(), 8u);
  EXPECT_EQ(front.loss[0].value, -1);
  EXPECT_DOUBLE_EQ(front.loss[7].value, 2.0);
  EXPECT_EQ(front.status, "paused");
  EXPECT_EQ(front.step, 8);
  EXPECT_EQ(front.version, host.version);

  // The event log: past MAX_EVENT_LINES the oldest go, in both copies alike.
  for (size_t i = 0; i < ui::RunView::MAX_EVENT_LINES + 30; ++i) {
    ui::apply_event(host, trainer::LogEvent{9, "info", "line " + std::to_string(i)});
    if (i == 10) ui::copy_changes(host, front);
  }
  ui::copy_changes(host, front);
  ASSERT_EQ(front.events.size(), ui::RunView::MAX_EVENT_LINES);
  EXPECT_EQ(front.events.front().text, host.events.front().text);
  EXPECT_EQ(front.events.back().text, "line " + std::to_string(ui::RunView::MAX_EVENT_LINES + 29));
  EXPECT_EQ(front.events_total, host.events_total);

  // A view of another run is replaced whole.
  ui::RunView other = fresh_view();
  other.run_id = 8;
  ui::copy_changes(other, front);
  EXPECT_TRUE(front.loss.empty());
  EXPECT_EQ(front.run_id, 8);
}

}  // namespace

// RunHost end to end on a real (tiny, CPU) run: the view follows the engine, pause holds the step,
// save-now and stop record checkpoints and the status in the database, records reach the plain
// log's queue, and dropping the host stops the run cleanly.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <unistd.h>
#include <vector>

#include "app/run_host.h"
#include "tests/support/temp_dir.h"
#include "trainer/config.h"
#include "trainer/session.h"

namespace {

using testing_support::TempDir;
using Clock = std::chrono::steady_clock;

trainer::RunConfig tiny_config(const TempDir& dir, std::vector<std::string> overrides = {}) {
  std::string corpus;
  for (int d = 0; d < 200; ++d) corpus += "abcdefghijklmnopqrstuvwxyz " + std::to_string(d) + "\n%\n";
  dir.write("corpus/a.txt", corpus);
  std::vector<std::string> sets = {"name=\"host\"", "data.train=[\"text:" + dir.path() + "/corpus/*.txt\"]", "data.val=0.05", "model.d=32",
       "model.L=1", "model.attn_heads=2", "model.attn_kv_heads=1", "model.attn_head_dim=16", "model.ffn_hidden=64",
       "train.steps=100000", "train.batch_size=2", "train.seq_len=16", "train.warmup_steps=2", "train.eval_batches=1",
       "run.log_interval=1", "run.eval_interval=0", "run.save_interval=0", "run.threads=1", "run.devices=\"cpu\"",
       "run.runs_dir=\"" + dir.path() + "/runs\""};
  sets.insert(sets.end(), overrides.begin(), overrides.end());  // a later setting of a key wins
  auto parsed = trainer::parse_config("", "<test>", sets);
  EXPECT_TRUE(parsed.ok()) << (parsed.errors.empty() ? "" : parsed.errors[0]);
  auto cfg = parsed.config;
  auto unresolved = trainer::resolve_config(cfg);
  EXPECT_TRUE(unresolved.empty()) << (unresolved.empty() ? "" : unresolved[0]);
  return cfg;
}

// Polls the host's snapshot until pred holds; fails the test after 60 s.
ui::RunView wait_for(app::RunHost& host, ui::RunView& view, const std::function<bool(const ui::RunView&)>& pred,
                     const char* what) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    host.snapshot(view);
    if (pred(view)) return view;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "timed out waiting for " << what << " (step " << view.step << ", status " << view.status << ")";
  return view;
}

TEST(RunHost, PauseSaveNowStopAndRecords) {
  TempDir dir;
  app::PreparedRun prep = app::record_new_run(tiny_config(dir), 1, "test-rev");
  const std::string db_path = prep.db_path;
  const int64_t run_id = prep.run_id;
  app::RunHostOptions opts;
  opts.keep_records = true;
  app::RunHost host(std::move(prep), opts);
  ui::RunView view;
  host.snapshot(view);
  EXPECT_EQ(view.run_name, "host");
  EXPECT_EQ(view.status, "starting");
  EXPECT_EQ(view.total_steps, 100000);
  host.start();

  wait_for(host, view, [](const ui::RunView& v) { return v.step >= 5 && v.status == "running"; }, "step 5");
  EXPECT_EQ(view.device, "cpu");
  EXPECT_FALSE(view.loss.empty());

  host.send(trainer::Command::Pause);
  host.snapshot(view);
  EXPECT_EQ(view.status, "paused");  // at once, before the engine reaches its step boundary
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  host.snapshot(view);
  const int64_t paused_at = view.step;
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  host.snapshot(view);
  EXPECT_EQ(view.step, paused_at) << "the step moved while paused";

  host.send(trainer::Command::Resume);
  wait_for(host, view, [&](const ui::RunView& v) { return v.step > paused_at + 2; }, "steps after resume");
  EXPECT_EQ(view.status, "running");

  host.send(trainer::Command::SaveNow);
  wait_for(host, view, [](const ui::RunView& v) { return !v.checkpoints.empty(); }, "the save-now checkpoint");
  const int64_t saved_step = view.checkpoints[0].step;
  {
    auto ro = storage::RunStore::open(db_path, /*read_only=*/true);
    ASSERT_EQ(ro->checkpoints(run_id).size(), 1u);
    EXPECT_EQ(ro->checkpoints(run_id)[0].step, saved_step);
  }

  wait_for(host, view, [&](const ui::RunView& v) { return v.step > saved_step + 2; }, "steps after the save");
  host.send(trainer::Command::Stop);
  host.snapshot(view);
  EXPECT_EQ(view.status, "stopping");
  const trainer::EndedEvent end = host.wait();
  EXPECT_EQ(end.status, trainer::RunStatus::Stopped) << end.message;
  EXPECT_TRUE(host.ended());
  host.snapshot(view);
  EXPECT_EQ(view.status, "stopped");
  ASSERT_EQ(view.checkpoints.size(), 2u);  // save-now and the stop's
  EXPECT_TRUE(host.warnings().empty()) << host.warnings()[0];

  auto ro = storage::RunStore::open(db_path, /*read_only=*/true);
  const storage::RunSummary rec = *ro->run(run_id);
  EXPECT_EQ(rec.status, "stopped");
  EXPECT_EQ(ro->checkpoints(run_id).size(), 2u);
  const auto loss_rows = ro->metrics(run_id, "loss");
  EXPECT_EQ(loss_rows.size(), view.loss.size());

  std::vector<ui::LogRecord> recs;
  host.take_records(recs);
  size_t steps = 0, checkpoints = 0;
  for (const auto& r : recs) {
    steps += r.kind == "step";
    checkpoints += r.kind == "checkpoint";
  }
  EXPECT_EQ(steps, loss_rows.size());
  EXPECT_EQ(checkpoints, 2u);
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.front().kind, "started");
  EXPECT_EQ(recs.back().kind, "ended");
  EXPECT_EQ(recs.back().status, "stopped");
  EXPECT_EQ(host.take_records(recs), 0u);  // drained
  // The engine's pause and resume messages reached the run's event log.
  bool paused_logged = false;
  for (const auto& e : ro->events(run_id)) paused_logged |= e.text.rfind("paused at step", 0) == 0;
  EXPECT_TRUE(paused_logged);
}

TEST(RunHost, DroppingARunningHostStopsWithACheckpoint) {
  TempDir dir;
  app::PreparedRun prep = app::record_new_run(tiny_config(dir), 1, "test-rev");
  const std::string db_path = prep.db_path;
  const int64_t run_id = prep.run_id;
  {
    app::RunHost host(std::move(prep));
    host.start();
    ui::RunView view;
    wait_for(host, view, [](const ui::RunView& v) { return v.step >= 3; }, "step 3");
    std::vector<ui::LogRecord> recs;
    EXPECT_EQ(host.take_records(recs), 0u);  // no queue unless asked for
  }
  auto ro = storage::RunStore::open(db_path, /*read_only=*/true);
  EXPECT_EQ(ro->run(run_id)->status, "stopped");
  EXPECT_EQ(ro->checkpoints(run_id).size(), 1u);
}

// Checkpoint records follow the engine's pruning at each save, the last one included, and are
// recorded by absolute path even when run.runs_dir is relative (a resume from another working
// directory then still finds them, and never takes them for deleted).
TEST(RunHost, CheckpointRecordsAreTheCheckpointsOnDiskByAbsolutePath) {
  TempDir dir;
  struct InDir {
    std::string before, now;  // now: the folder as getcwd spells it (symlinks resolved)
    explicit InDir(const std::string& d) {
      char buf[4096];
      before = ::getcwd(buf, sizeof buf) ? buf : "/";
      EXPECT_EQ(::chdir(d.c_str()), 0);
      now = ::getcwd(buf, sizeof buf) ? buf : d;
    }
    ~InDir() { (void)::chdir(before.c_str()); }
  } in_dir(dir.path());
  app::PreparedRun prep = app::record_new_run(
      tiny_config(dir, {"train.steps=9", "run.save_interval=2", "run.keep_checkpoints=1", "run.runs_dir=\"runs\""}), 1,
      "test-rev");
  const std::string db_path = prep.db_path;
  const int64_t run_id = prep.run_id;
  app::RunHost host(std::move(prep));
  host.start();
  const trainer::EndedEvent end = host.wait();
  EXPECT_EQ(end.status, trainer::RunStatus::Finished) << end.message;
  EXPECT_TRUE(host.warnings().empty()) << host.warnings()[0];
  ui::RunView view;
  host.snapshot(view);
  ASSERT_EQ(view.checkpoints.size(), 1u);
  EXPECT_EQ(view.checkpoints[0].step, 9);

  const std::string kept = in_dir.now + "/runs/host/checkpoints/step_00000009";
  ASSERT_TRUE(storage::files::is_dir(kept));
  for (const std::string& name : storage::files::list_dir(dir.path() + "/runs/host/checkpoints"))
    EXPECT_EQ(name, "step_00000009") << "keep_checkpoints = 1 left another folder";
  auto ro = storage::RunStore::open(db_path, /*read_only=*/true);
  const auto rows = ro->checkpoints(run_id);
  ASSERT_EQ(rows.size(), 1u) << "a record of a pruned checkpoint was left";
  EXPECT_EQ(rows[0].step, 9);
  EXPECT_EQ(rows[0].path, kept);
}

}  // namespace

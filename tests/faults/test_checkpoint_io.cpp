// Checkpoint writes under faults (docs/reliability.md, guarantees 1, 2 and 4):
//   WriteOrder*        every save, through an observable FileIo, fsyncs its data files, then the
//                      manifest's temporary file, renames it, fsyncs the directory, commits, and
//                      only then deletes older checkpoints (100 saves).
//   CrashSweep*        the process "dies" after the k-th operation of a sequence of saves and
//                      prunes, for every k and several seeds: the newest committed checkpoint is
//                      chosen and loads bit for bit, a partial one is never chosen and is reported,
//                      and the next save (the same step again included) succeeds.
//   DiskFull*          ENOSPC at random byte offsets and at every allocating operation: the save
//                      fails naming the file, the previous checkpoint stays the resume target, no
//                      partial directory is left, and the same step saves fine once space is back;
//                      in a run, the failure stops it cleanly (failed, naming file and target) or is
//                      retried as run.save_retries says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>

#include "storage/file_util.h"
#include "tests/faults/checkpoint_faults.h"
#include "tests/support/temp_dir.h"
#include "tests/trainer/train_harness.h"

namespace {

using faults::IoRecord;
using faults::RecordingIo;
using faults::SimulatedCrash;
using faults::sample_checkpoint;
using faults::step_dir;
using storage::IoOp;
using testing_support::TempDir;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Index of the first op matching (op, path suffix) in [from, to); -1 when none.
int64_t find_op(const std::vector<IoRecord>& ops, size_t from, size_t to, IoOp op, const std::string& suffix) {
  for (size_t i = from; i < to && i < ops.size(); ++i)
    if (ops[i].op == op && ends_with(ops[i].path, suffix)) return static_cast<int64_t>(i);
  return -1;
}

// Checks one save's operations, ops[from, to) (the save and the prune after it), against the
// documented order; `step` is the step saved, `pruned` the checkpoint directories removed.
void expect_save_order(const std::vector<IoRecord>& ops, size_t from, size_t to, int64_t step,
                       const std::string& root) {
  const std::string final_dir = step_dir(root, step), tmp = final_dir + ".tmp";
  SCOPED_TRACE("save of step " + std::to_string(step));
  const int64_t fsync_model = find_op(ops, from, to, IoOp::Fsync, tmp + "/model.safetensors");
  const int64_t fsync_state = find_op(ops, from, to, IoOp::Fsync, tmp + "/state.safetensors");
  const int64_t create_manifest = find_op(ops, from, to, IoOp::Create, tmp + "/manifest.json.tmp");
  const int64_t fsync_manifest = find_op(ops, from, to, IoOp::Fsync, tmp + "/manifest.json.tmp");
  const int64_t rename_manifest = find_op(ops, from, to, IoOp::Rename, tmp + "/manifest.json");
  const int64_t fsync_tmp_dir = find_op(ops, from, to, IoOp::FsyncDir, tmp);
  const int64_t commit = find_op(ops, from, to, IoOp::Rename, final_dir);
  const int64_t fsync_root = commit < 0 ? -1 : find_op(ops, static_cast<size_t>(commit), to, IoOp::FsyncDir, root);
  for (int64_t i : {fsync_model, fsync_state, create_manifest, fsync_manifest, rename_manifest, fsync_tmp_dir, commit,
                    fsync_root})
    ASSERT_GE(i, 0) << "an operation of the save is missing";
  // Every write of a data file comes before its fsync.
  for (size_t i = from; i < to; ++i) {
    if (ops[i].op != IoOp::Write) continue;
    if (ends_with(ops[i].path, "model.safetensors")) {
      EXPECT_LT(static_cast<int64_t>(i), fsync_model);
    }
    if (ends_with(ops[i].path, "state.safetensors")) {
      EXPECT_LT(static_cast<int64_t>(i), fsync_state);
    }
  }
  EXPECT_LT(std::max(fsync_model, fsync_state), create_manifest) << "manifest written before the data was durable";
  EXPECT_LT(create_manifest, fsync_manifest);
  EXPECT_LT(fsync_manifest, rename_manifest) << "manifest renamed before it was fsynced";
  EXPECT_LT(rename_manifest, fsync_tmp_dir) << "directory not fsynced after the manifest's rename";
  EXPECT_LT(fsync_tmp_dir, commit);
  EXPECT_LT(commit, fsync_root);
  // Deleting an older checkpoint (a Remove of some other committed step_X) only after the commit
  // was made durable.
  for (size_t i = from; i < to; ++i) {
    if (ops[i].op != IoOp::Remove) continue;
    const std::string& p = ops[i].path;
    const bool other_committed =
        p.find("/step_") != std::string::npos && p.find('.', p.rfind('/')) == std::string::npos && p != final_dir;
    if (other_committed) {
      EXPECT_GT(static_cast<int64_t>(i), fsync_root) << "older checkpoint deleted before the commit";
    }
  }
}

TEST(CheckpointWriteOrder, HundredSavesFsyncRenameThenPrune) {
  TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  RecordingIo io;
  const int64_t keep = 3;
  for (int64_t i = 1; i <= 100; ++i) {
    const size_t from = io.ops.size();
    auto d = sample_checkpoint(i, 5);
    // Small tensors keep 100 fsynced saves quick.
    d.weights.resize(2);
    trainer::save_checkpoint(root, d, io);
    const auto removed = trainer::prune_checkpoints(root, keep, -1, io);
    expect_save_order(io.ops, from, io.ops.size(), i, root);
    if (i > keep) {
      EXPECT_EQ(removed, std::vector<int64_t>{i - keep});
      // The prune made its deletions durable.
      EXPECT_EQ(io.ops.back().op, IoOp::FsyncDir);
    }
    ASSERT_EQ(trainer::list_checkpoints(root).size(), static_cast<size_t>(std::min(i, keep)));
  }
}

// The steps of `saves` are saved and pruned in order through io until it "dies". Returns how many
// saves returned.
int run_saves(const std::string& root, RecordingIo& io, const std::vector<int64_t>& saves, int64_t keep,
              uint64_t seed) {
  int done = 0;
  for (int64_t step : saves) {
    try {
      trainer::save_checkpoint(root, sample_checkpoint(step, seed), io);
      trainer::prune_checkpoints(root, keep, -1, io);
    } catch (const SimulatedCrash&) {
      return done;
    }
    if (io.dead) return done;  // died inside prune (whose failures it swallows)
    ++done;
  }
  return done;
}

TEST(CheckpointCrashSweep, EveryOperationOfEverySaveSeveralSeeds) {
  int64_t sweeps = 0;
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const int64_t keep = 1 + static_cast<int64_t>(rng() % 3);
    std::vector<int64_t> saves;
    for (int i = 0, n = 3 + static_cast<int>(rng() % 2); i < n; ++i) saves.push_back(10 * (i + 1));
    // The whole sequence once, to know how many operations there are.
    size_t total = 0;
    {
      TempDir dir;
      RecordingIo io;
      ASSERT_EQ(run_saves(dir.path() + "/checkpoints", io, saves, keep, seed), static_cast<int>(saves.size()));
      total = io.ops.size();
    }
    for (size_t k = 1; k <= total; ++k, ++sweeps) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", crash after operation " + std::to_string(k) + " of " +
                   std::to_string(total));
      TempDir dir;
      const std::string root = dir.path() + "/checkpoints";
      RecordingIo io;
      io.crash_after = static_cast<int64_t>(k);
      run_saves(root, io, saves, keep, seed);
      ASSERT_TRUE(io.dead || k == total);
      // The newest commit that happened: the rename of step_X.tmp to step_X.
      int64_t committed = -1;
      for (const IoRecord& r : io.ops)
        for (int64_t s : saves)
          if (r.op == IoOp::Rename && r.path == step_dir(root, s)) committed = s;
      const trainer::CheckpointChoice choice = trainer::choose_checkpoint(dir.path());
      if (committed < 0) {
        EXPECT_EQ(choice.dir, "") << "a checkpoint was chosen before any save committed";
      } else {
        ASSERT_EQ(choice.dir, step_dir(root, committed)) << "not the newest committed checkpoint";
        const auto loaded = trainer::load_checkpoint(choice.dir);
        const auto want = sample_checkpoint(committed, seed);
        EXPECT_TRUE(faults::same_tensors(loaded.weights, want.weights));
        EXPECT_TRUE(faults::same_tensors(loaded.state, want.state));
        EXPECT_EQ(loaded.meta.at("loader.state"), want.meta.at("loader.state"));
      }
      // Every committed-looking directory is whole; a partial one is reported, never chosen.
      for (const auto& [step, path] : trainer::list_checkpoints(root))
        EXPECT_EQ(trainer::checkpoint_problem(path), "") << path;
      for (const std::string& name : storage::files::list_dir(root)) {
        if (!ends_with(name, ".tmp")) continue;
        const bool reported = std::any_of(choice.skipped.begin(), choice.skipped.end(), [&](const std::string& s) {
          return s.find(name) != std::string::npos && s.find("unfinished save") != std::string::npos;
        });
        EXPECT_TRUE(reported) << name << " left behind but not reported";
      }
      // The relaunched process saves again, the crashed step included: no "already exists".
      const int64_t next = committed < 0 ? saves.front() : std::min(committed + 10, saves.back());
      trainer::save_checkpoint(root, sample_checkpoint(next, seed), storage::posix_io());
      EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, step_dir(root, std::max(next, committed)));
    }
  }
  std::printf("crash sweep: %lld crash points over 4 seeds\n", static_cast<long long>(sweeps));
}

// One save's bytes: what the ENOSPC offsets are drawn from.
uint64_t bytes_of_one_save(uint64_t seed) {
  TempDir dir;
  RecordingIo io;
  trainer::save_checkpoint(dir.path(), sample_checkpoint(20, seed), io);
  return io.written;
}

void expect_previous_is_target(const TempDir& dir, const std::string& root) {
  const auto choice = trainer::choose_checkpoint(dir.path());
  EXPECT_EQ(choice.dir, step_dir(root, 10)) << "the previous checkpoint is no longer the resume target";
  EXPECT_EQ(trainer::checkpoint_problem(step_dir(root, 10)), "");
  EXPECT_FALSE(storage::files::exists(step_dir(root, 20) + ".tmp")) << "partial directory left behind";
  EXPECT_FALSE(storage::files::exists(step_dir(root, 20)));
}

TEST(CheckpointDiskFull, RandomByteOffsetsKeepThePreviousCheckpoint) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const uint64_t total = bytes_of_one_save(seed);
    std::mt19937_64 rng(seed);
    for (int trial = 0; trial < 12; ++trial) {
      const uint64_t at = rng() % total;
      const bool persist = trial % 2 == 1;
      SCOPED_TRACE("seed " + std::to_string(seed) + ", ENOSPC at byte " + std::to_string(at) + " of " +
                   std::to_string(total) + (persist ? " (disk stays full)" : ""));
      TempDir dir;
      const std::string root = dir.path() + "/checkpoints";
      trainer::save_checkpoint(root, sample_checkpoint(10, seed), storage::posix_io());
      RecordingIo io;
      io.enospc_at_byte = static_cast<int64_t>(at);
      io.enospc_persists = persist;
      try {
        trainer::save_checkpoint(root, sample_checkpoint(20, seed), io);
        FAIL() << "the save did not fail";
      } catch (const storage::IoError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.err(), ENOSPC);
        EXPECT_NE(msg.find(step_dir(root, 20) + ".tmp/"), std::string::npos) << msg;
        EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
        EXPECT_NE(msg.find("byte offset"), std::string::npos) << msg;
      }
      expect_previous_is_target(dir, root);
      // Space is back: the same step saves without "already exists", and is the target now.
      trainer::save_checkpoint(root, sample_checkpoint(20, seed), storage::posix_io());
      EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, step_dir(root, 20));
    }
  }
}

// ENOSPC at each operation that allocates space (mkdir, create, every write) of one save.
class AllocatingOpFails : public RecordingIo {
 public:
  int64_t fail_at = -1;  // the n-th allocating operation
  int64_t seen = 0;

 protected:
  Verdict before(IoOp op, const std::string& path, uint64_t offset, uint64_t bytes) override {
    if (op == IoOp::Write || op == IoOp::Create || op == IoOp::MakeDir) {
      if (++seen == fail_at) return Verdict{ENOSPC, bytes / 3};
    }
    return RecordingIo::before(op, path, offset, bytes);
  }
};

TEST(CheckpointDiskFull, EveryAllocatingOperation) {
  int64_t allocating = 0;
  {
    TempDir dir;
    AllocatingOpFails io;
    trainer::save_checkpoint(dir.path(), sample_checkpoint(20, 9), io);
    allocating = io.seen;
  }
  ASSERT_GT(allocating, 5);
  for (int64_t n = 1; n <= allocating; ++n) {
    SCOPED_TRACE("ENOSPC at allocating operation " + std::to_string(n) + " of " + std::to_string(allocating));
    TempDir dir;
    const std::string root = dir.path() + "/checkpoints";
    trainer::save_checkpoint(root, sample_checkpoint(10, 9), storage::posix_io());
    AllocatingOpFails io;
    io.fail_at = n;
    EXPECT_THROW(trainer::save_checkpoint(root, sample_checkpoint(20, 9), io), storage::IoError);
    expect_previous_is_target(dir, root);
    trainer::save_checkpoint(root, sample_checkpoint(20, 9), storage::posix_io());
    EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, step_dir(root, 20));
  }
}

// Arms DELTADECK_IO_FAULT for the guard's lifetime (storage/file_io.h).
struct IoFaultArmed {
  explicit IoFaultArmed(const std::string& spec) { setenv("DELTADECK_IO_FAULT", spec.c_str(), 1); }
  ~IoFaultArmed() { unsetenv("DELTADECK_IO_FAULT"); }
};

// Bytes one save of this config writes (the first run's checkpoint), to aim faults at the second.
int64_t checkpoint_bytes(const trainer::RunConfig& cfg, const std::string& dir) {
  auto probe = cfg;
  probe.train.steps = 2;
  auto r = train_harness::run(probe, dir);
  EXPECT_EQ(r.checkpoints.size(), 1u);
  return storage::files::file_size(r.checkpoints[0] + "/model.safetensors") +
         storage::files::file_size(r.checkpoints[0] + "/state.safetensors") +
         storage::files::file_size(r.checkpoints[0] + "/manifest.json");
}

TEST(CheckpointDiskFull, ARunStopsCleanlyNamingTheFileAndTheResumeTarget) {
  TempDir dir;
  auto cfg = train_harness::make_config(dir, 8, {"run.save_interval=2", "train.warmup_steps=1"});
  const int64_t bytes = checkpoint_bytes(cfg, dir.path() + "/probe");
  // The disk fills in the middle of the second save and stays full.
  IoFaultArmed fault("enospc@byte=" + std::to_string(bytes + bytes / 2) + ",persist");
  auto r = train_harness::run(cfg, dir.path() + "/run");
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_EQ(r.ended.step, 4);
  const std::string msg = r.ended.message;
  EXPECT_NE(msg.find("checkpoint at step 4 not written"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step_00000004.tmp/"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the resume target stays " + dir.path() + "/run/checkpoints/step_00000002"), std::string::npos)
      << msg;
  EXPECT_EQ(trainer::choose_checkpoint(dir.path() + "/run").dir, dir.path() + "/run/checkpoints/step_00000002");
  EXPECT_FALSE(storage::files::exists(dir.path() + "/run/checkpoints/step_00000004.tmp"));
}

TEST(CheckpointDiskFull, ARunRetriesAsConfiguredAndSavesTheSameStep) {
  TempDir dir;
  auto cfg = train_harness::make_config(
      dir, 6, {"run.save_interval=2", "train.warmup_steps=1", "run.save_retries=2", "run.save_retry_delay_s=0.05"});
  const int64_t bytes = checkpoint_bytes(cfg, dir.path() + "/probe");
  // Once, in the middle of the second save; the retry finds space again.
  IoFaultArmed fault("enospc@byte=" + std::to_string(bytes + bytes / 3));
  trainer::Session s(cfg, trainer::SessionOptions(dir.path() + "/run"));
  s.start();
  std::vector<std::string> warnings;
  std::vector<int64_t> saved;
  trainer::EndedEvent ended;
  while (auto ev = s.events().pop()) {
    if (auto* l = std::get_if<trainer::LogEvent>(&*ev); l && l->level == "warn") warnings.push_back(l->text);
    if (auto* c = std::get_if<trainer::CheckpointEvent>(&*ev)) saved.push_back(c->step);
    if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) ended = *e;
  }
  s.join();
  EXPECT_EQ(ended.status, trainer::RunStatus::Finished) << ended.message;
  EXPECT_EQ(saved, (std::vector<int64_t>{2, 4, 6}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("checkpoint at step 4 not written"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("No space left on device"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("retry 1 of 2"), std::string::npos) << warnings[0];
  EXPECT_EQ(trainer::checkpoint_problem(dir.path() + "/run/checkpoints/step_00000004"), "");
}

}  // namespace

// Checkpoints: round trip to identical tensors, refusal of damaged files naming them, pruning;
// and our AdamW against LibTorch's own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "storage/file_util.h"
#include "tests/support/temp_dir.h"
#include "trainer/adamw.h"
#include "trainer/checkpoint.h"

using testing_support::TempDir;

namespace {
trainer::CheckpointData sample(int64_t step) {
  torch::manual_seed(step);
  trainer::CheckpointData d;
  d.step = step;
  d.weights = {{"emb.weight", torch::randn({17, 8})}, {"blocks.0.norm1.weight", torch::randn({8})}};
  d.state = {{"exp_avg.emb.weight", torch::randn({17, 8})}, {"rng.cpu", torch::randint(0, 255, {32}, torch::kUInt8)}};
  d.meta = {{"tokens", "1234"}};
  return d;
}
void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(offset);
  f.write(&c, 1);
}
}  // namespace

TEST(Checkpoint, RoundTripIsBitIdentical) {
  TempDir dir;
  auto d = sample(100);
  auto saved = trainer::save_checkpoint(dir.path(), d);
  EXPECT_EQ(saved.dir, dir.path() + "/step_00000100");
  EXPECT_EQ(saved.sha256.size(), 64u);
  EXPECT_GT(saved.bytes, 0);
  auto back = trainer::load_checkpoint(saved.dir);
  EXPECT_EQ(back.step, 100);
  ASSERT_EQ(back.weights.size(), d.weights.size());
  for (size_t i = 0; i < d.weights.size(); ++i) {
    EXPECT_EQ(back.weights[i].first, d.weights[i].first);
    EXPECT_TRUE(torch::equal(back.weights[i].second, d.weights[i].second));
  }
  for (size_t i = 0; i < d.state.size(); ++i) EXPECT_TRUE(torch::equal(back.state[i].second, d.state[i].second));
  EXPECT_EQ(back.meta.at("tokens"), "1234");
  EXPECT_FALSE(storage::files::exists(saved.dir + ".tmp"));
}

TEST(Checkpoint, FlippedByteIsRejectedNamingTheFile) {
  TempDir dir;
  auto saved = trainer::save_checkpoint(dir.path(), sample(5));
  flip_byte(saved.dir + "/model.safetensors", 200);
  try {
    trainer::load_checkpoint(saved.dir);
    FAIL() << "expected a checksum error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
    EXPECT_NE(msg.find(saved.sha256), std::string::npos) << msg;
  }
}

// The ranks of one process resuming together read the folder once and share the tensors; a damaged
// file fails every one of them; once let go, the next load reads the folder again (not a cache).
TEST(Checkpoint, RanksOfOneProcessShareOneRead) {
  TempDir dir;
  auto saved = trainer::save_checkpoint(dir.path(), sample(7));
  constexpr int kRanks = 4;
  auto load_together = [&](std::vector<std::shared_ptr<const trainer::CheckpointData>>& got,
                           std::vector<std::string>& errors) {
    got.assign(kRanks, nullptr);
    errors.assign(kRanks, "");
    std::atomic<int> ready{0};
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r)
      ranks.emplace_back([&, r] {
        ++ready;
        while (ready.load() < kRanks) std::this_thread::yield();
        try {
          got[r] = trainer::load_checkpoint_shared(saved.dir);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
  };
  std::vector<std::shared_ptr<const trainer::CheckpointData>> got;
  std::vector<std::string> errors;
  load_together(got, errors);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r]) << errors[r];
    EXPECT_EQ(got[r].get(), got[0].get());  // one read, held by every rank
  }
  EXPECT_EQ(got[0]->step, 7);
  EXPECT_TRUE(torch::equal(got[0]->weights[0].second, sample(7).weights[0].second));
  got.clear();  // every rank let go: the data is freed

  flip_byte(saved.dir + "/model.safetensors", 200);
  load_together(got, errors);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(got[r]);
    EXPECT_NE(errors[r].find("checksum"), std::string::npos) << errors[r];
  }
}

TEST(Checkpoint, TruncatedOrMissingFilesAreRejected) {
  TempDir dir;
  auto saved = trainer::save_checkpoint(dir.path(), sample(6));
  ASSERT_EQ(::truncate((saved.dir + "/state.safetensors").c_str(), 10), 0);
  EXPECT_THROW(trainer::load_checkpoint(saved.dir), std::runtime_error);
  ASSERT_EQ(::unlink((saved.dir + "/manifest.json").c_str()), 0);
  EXPECT_THROW(trainer::load_checkpoint(saved.dir), std::runtime_error);
}

TEST(Checkpoint, ListIgnoresTmpAndPruneKeepsNewest) {
  TempDir dir;
  for (int64_t s : {10, 20, 30, 40}) trainer::save_checkpoint(dir.path(), sample(s));
  storage::files::make_dirs(dir.path() + "/step_00000050.tmp");
  auto all = trainer::list_checkpoints(dir.path());
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all.back().first, 40);
  auto removed = trainer::prune_checkpoints(dir.path(), 2);
  EXPECT_EQ(removed, (std::vector<int64_t>{10, 20}));
  all = trainer::list_checkpoints(dir.path());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.front().first, 30);
  // Nothing of the pruned ones is left, not even under the name they were renamed to.
  EXPECT_FALSE(storage::files::exists(dir.path() + "/step_00000010"));
  EXPECT_FALSE(storage::files::exists(dir.path() + "/step_00000010.deleting"));
}

// A deletion cut short (a crash, a file that would not go) leaves step_X.deleting: never listed,
// never chosen for a resume, and removed by the next pruning.
TEST(Checkpoint, ADeletionCutShortLeavesNoHalfCheckpoint) {
  TempDir dir;
  for (int64_t s : {10, 20, 30}) trainer::save_checkpoint(dir.path(), sample(s));
  const std::string step10 = dir.path() + "/step_00000010";
  ASSERT_EQ(std::rename(step10.c_str(), (step10 + ".deleting").c_str()), 0);
  ASSERT_EQ(::unlink((step10 + ".deleting/manifest.json").c_str()), 0);  // partly deleted
  EXPECT_EQ(trainer::list_checkpoints(dir.path()).size(), 2u);
  EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, dir.path() + "/step_00000030");
  EXPECT_EQ(trainer::prune_checkpoints(dir.path(), 2), std::vector<int64_t>{});
  EXPECT_FALSE(storage::files::exists(step10 + ".deleting"));
  EXPECT_EQ(trainer::list_checkpoints(dir.path()).size(), 2u);
}

TEST(Checkpoint, PruneSparesTheProtectedBestStep) {
  TempDir dir;
  for (int64_t s : {10, 20, 30, 40, 50}) trainer::save_checkpoint(dir.path(), sample(s));
  auto removed = trainer::prune_checkpoints(dir.path(), 2, /*protected_step=*/20);
  EXPECT_EQ(removed, (std::vector<int64_t>{10, 30}));
  std::vector<int64_t> left;
  for (const auto& [step, path] : trainer::list_checkpoints(dir.path())) left.push_back(step);
  EXPECT_EQ(left, (std::vector<int64_t>{20, 40, 50}));
}

// A resume from step 20 whose newer checkpoints were damaged: set aside, they no longer count as
// the newest, so a fresh save after the resume survives pruning with keep = 1 (left in place, the
// damaged step 40 would have been kept and step 30 deleted right after it was written).
TEST(Checkpoint, SetAsideCheckpointsAfterTheResumedStep) {
  TempDir dir;
  for (int64_t s : {10, 20, 30, 40}) trainer::save_checkpoint(dir.path(), sample(s));
  flip_byte(dir.path() + "/step_00000040/model.safetensors", 100);
  storage::files::make_dirs(dir.path() + "/step_00000040.superseded");  // from an earlier resume
  storage::files::remove_tree(dir.path() + "/step_00000030");
  const auto moved = trainer::set_aside_checkpoints_after(dir.path(), 20);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].first, 40);
  EXPECT_EQ(moved[0].second, dir.path() + "/step_00000040.superseded-2");
  EXPECT_TRUE(storage::files::exists(dir.path() + "/step_00000040.superseded-2/manifest.json"));
  trainer::save_checkpoint(dir.path(), sample(30));
  EXPECT_EQ(trainer::prune_checkpoints(dir.path(), 1, /*protected_step=*/20), (std::vector<int64_t>{10}));
  std::vector<int64_t> left;
  for (const auto& [step, path] : trainer::list_checkpoints(dir.path())) left.push_back(step);
  EXPECT_EQ(left, (std::vector<int64_t>{20, 30}));
  EXPECT_TRUE(trainer::set_aside_checkpoints_after(dir.path(), 30).empty());

  // A step_50 moved aside by a re-save cut short would be the next `--resume latest`'s choice:
  // resuming from 30 sets it aside too.
  trainer::save_checkpoint(dir.path(), sample(50));
  ASSERT_EQ(std::rename((dir.path() + "/step_00000050").c_str(), (dir.path() + "/step_00000050.old").c_str()), 0);
  ASSERT_EQ(trainer::choose_checkpoint(dir.path()).dir, dir.path() + "/step_00000050.old");
  const auto moved_old = trainer::set_aside_checkpoints_after(dir.path(), 30);
  ASSERT_EQ(moved_old.size(), 1u);
  EXPECT_EQ(moved_old[0].first, 50);
  EXPECT_EQ(moved_old[0].second, dir.path() + "/step_00000050.old.superseded");
  EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, dir.path() + "/step_00000030");
}

TEST(Checkpoint, SavingTheSameStepAgainReplacesIt) {
  TempDir dir;
  trainer::save_checkpoint(dir.path(), sample(7));
  auto d = sample(7);
  d.meta["tokens"] = "99";
  auto saved = trainer::save_checkpoint(dir.path(), d);
  EXPECT_EQ(trainer::load_checkpoint(saved.dir).meta.at("tokens"), "99");
  EXPECT_EQ(trainer::list_checkpoints(dir.path()).size(), 1u);
}

// A crash between a re-save's two renames (step_X moved to step_X.old, the complete step_X.tmp not
// yet renamed) leaves no step_X: the moved-aside checkpoint is still the run's newest, is chosen,
// and gets its name back at the resume. Beside a step_X, a stray ".old" is never chosen.
TEST(Checkpoint, ACheckpointMovedAsideByAnInterruptedResaveIsChosenAndRestored) {
  TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  for (int64_t s : {10, 20}) trainer::save_checkpoint(root, sample(s));
  const std::string step20 = root + "/step_00000020";
  ASSERT_EQ(std::rename(step20.c_str(), (step20 + ".old").c_str()), 0);
  trainer::save_checkpoint(dir.path() + "/elsewhere", sample(20));  // the new save, complete but not renamed
  ASSERT_EQ(std::rename((dir.path() + "/elsewhere/step_00000020").c_str(), (step20 + ".tmp").c_str()), 0);

  trainer::CheckpointChoice c = trainer::choose_checkpoint(dir.path());
  EXPECT_EQ(c.dir, step20 + ".old");
  ASSERT_EQ(c.skipped.size(), 1u);  // the unfinished .tmp, named
  EXPECT_NE(c.skipped[0].find("step_00000020.tmp"), std::string::npos) << c.skipped[0];
  EXPECT_EQ(trainer::load_checkpoint(c.dir).step, 20);

  // What the other nodes of a multi-node resume take: the name node 0's rename gives it.
  EXPECT_EQ(trainer::restored_name(c.dir), step20);
  EXPECT_TRUE(storage::files::exists(step20 + ".old"));  // renames nothing
  EXPECT_EQ(trainer::restore_moved_aside(c.dir), step20);
  EXPECT_FALSE(storage::files::exists(step20 + ".old"));
  EXPECT_TRUE(trainer::checkpoint_problem(step20).empty());
  EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, step20);
  EXPECT_EQ(trainer::restore_moved_aside(step20), step20);  // not a leftover: unchanged

  // A stray step_20.old beside step_20 (a save that committed, then failed to remove it).
  trainer::save_checkpoint(dir.path() + "/elsewhere", sample(20));
  ASSERT_EQ(std::rename((dir.path() + "/elsewhere/step_00000020").c_str(), (step20 + ".old").c_str()), 0);
  EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, step20);
  EXPECT_EQ(trainer::restore_moved_aside(step20 + ".old"), step20 + ".old");  // step_20 exists: left as it is
  EXPECT_EQ(trainer::restored_name(step20 + ".old"), step20 + ".old");
  EXPECT_EQ(trainer::restored_name(step20), step20);
  EXPECT_EQ(trainer::list_checkpoints(root).size(), 2u);
}

TEST(AdamW, MatchesLibTorchAdamW) {
  torch::manual_seed(42);
  auto w0 = torch::randn({5, 3}), b0 = torch::randn({3});
  auto w_ours = w0.clone().requires_grad_(true), b_ours = b0.clone().requires_grad_(true);
  auto w_ref = w0.clone().requires_grad_(true), b_ref = b0.clone().requires_grad_(true);
  trainer::AdamW ours({{"w", w_ours}, {"b", b_ours}}, {true, false}, {0.9, 0.95, 1e-8, 0.1});
  torch::optim::AdamW ref_decay({w_ref}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  torch::optim::AdamW ref_plain({b_ref}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0));
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({4, 5});
    auto loss_ours = (torch::tanh(x.matmul(w_ours) + b_ours)).pow(2).sum();
    auto loss_ref = (torch::tanh(x.matmul(w_ref) + b_ref)).pow(2).sum();
    loss_ours.backward();
    loss_ref.backward();
    ours.step(1e-2);
    ref_decay.step();
    ref_plain.step();
    ours.zero_grad();
    ref_decay.zero_grad();
    ref_plain.zero_grad();
  }
  EXPECT_LE((w_ours - w_ref).abs().max().item<double>(), 1e-6);
  EXPECT_LE((b_ours - b_ref).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(ours.steps_taken(), 5);
}

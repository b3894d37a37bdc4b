// Damaged checkpoints and mismatched resumes (docs/reliability.md, guarantee 3): a flipped byte, a
// truncated file, a missing file or an emptied manifest in the newest checkpoint is rejected naming
// the file and expected vs actual; choosing a checkpoint falls back to the previous valid one and
// lists what it skipped; a resume with another model shape, vocabulary, dtype or world size is
// refused from the manifest alone, before any tensor is read, naming the field and both values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "storage/file_util.h"
#include "storage/sha256.h"
#include "tests/faults/checkpoint_faults.h"
#include "tests/support/temp_dir.h"
#include "tests/trainer/train_harness.h"
#include "trainer/resume_check.h"

namespace {

using faults::sample_checkpoint;
using faults::step_dir;
using testing_support::TempDir;

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(offset);
  f.write(&c, 1);
}

std::string manifest_sha(const std::string& dir, const std::string& file) {
  std::ifstream in(dir + "/manifest.json");
  nlohmann::json m;
  in >> m;
  return m["files"][file]["sha256"].get<std::string>();
}

// Rewrites dir's manifest.json after `edit` (a hand-edited manifest: valid JSON, wrong types).
void edit_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json m;
  {
    std::ifstream in(dir + "/manifest.json");
    in >> m;
  }
  edit(m);
  std::ofstream(dir + "/manifest.json") << m.dump();
}

struct Damage {
  const char* name;
  std::function<void(const std::string& dir)> apply;
  // What the error must contain, given the damaged checkpoint's directory.
  std::function<std::vector<std::string>(const std::string& dir)> expect;
};

std::vector<Damage> damages() {
  return {
      {"flipped byte in the weights",
       [](const std::string& d) { flip_byte(d + "/model.safetensors", 300); },
       [](const std::string& d) {
         return std::vector<std::string>{d + "/model.safetensors", "checksum mismatch",
                                         "expected sha256 " + manifest_sha(d, "model.safetensors"),
                                         "actual " + storage::sha256_file(d + "/model.safetensors")};
       }},
      {"flipped byte in the optimizer state",
       [](const std::string& d) {
         flip_byte(d + "/state.safetensors", storage::files::file_size(d + "/state.safetensors") - 5);
       },
       [](const std::string& d) {
         return std::vector<std::string>{d + "/state.safetensors",
                                         "expected sha256 " + manifest_sha(d, "state.safetensors"),
                                         "actual " + storage::sha256_file(d + "/state.safetensors")};
       }},
      {"truncated weights",
       [](const std::string& d) { ASSERT_EQ(::truncate((d + "/model.safetensors").c_str(), 100), 0); },
       [](const std::string& d) {
         return std::vector<std::string>{d + "/model.safetensors", "size 100 bytes, the manifest expects"};
       }},
      {"missing state file",
       [](const std::string& d) { ASSERT_EQ(::unlink((d + "/state.safetensors").c_str()), 0); },
       [](const std::string& d) { return std::vector<std::string>{d + "/state.safetensors", "missing"}; }},
      {"emptied manifest",
       [](const std::string& d) { ASSERT_EQ(::truncate((d + "/manifest.json").c_str(), 0), 0); },
       [](const std::string& d) { return std::vector<std::string>{d + "/manifest.json", "empty (0 bytes)"}; }},
      {"version as a string",
       [](const std::string& d) { edit_manifest(d, [](nlohmann::json& m) { m["version"] = "1"; }); },
       [](const std::string& d) { return std::vector<std::string>{d + "/manifest.json", "malformed"}; }},
      {"a file's size as a string",
       [](const std::string& d) {
         edit_manifest(d, [](nlohmann::json& m) { m["files"]["state.safetensors"]["bytes"] = "12"; });
       },
       [](const std::string& d) {
         return std::vector<std::string>{d + "/manifest.json", "lists no bytes (an integer) and sha256 (a string) for "
                                                                "state.safetensors"};
       }},
  };
}

void expect_contains_all(const std::string& msg, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing \"" << p << "\" in: " << msg;
}

TEST(CheckpointCorruption, EachDamageIsNamedAndTheChoiceFallsBack) {
  for (const Damage& dmg : damages()) {
    SCOPED_TRACE(dmg.name);
    TempDir dir;
    const std::string root = dir.path() + "/checkpoints";
    for (int64_t s : {10, 20, 30}) trainer::save_checkpoint(root, sample_checkpoint(s, 3), storage::posix_io());
    const std::string newest = step_dir(root, 30);
    dmg.apply(newest);
    const auto expected = dmg.expect(newest);
    try {
      trainer::load_checkpoint(newest);
      FAIL() << "a damaged checkpoint loaded";
    } catch (const std::runtime_error& e) {
      expect_contains_all(e.what(), expected);
    }
    expect_contains_all(trainer::checkpoint_problem(newest), expected);
    const auto choice = trainer::choose_checkpoint(dir.path());
    EXPECT_EQ(choice.dir, step_dir(root, 20));
    ASSERT_EQ(choice.skipped.size(), 1u);
    expect_contains_all(choice.skipped[0], expected);
    const auto loaded = trainer::load_checkpoint(choice.dir);
    EXPECT_TRUE(faults::same_tensors(loaded.weights, sample_checkpoint(20, 3).weights));
    // Two damaged in a row: back to the oldest.
    flip_byte(step_dir(root, 20) + "/model.safetensors", 64);
    EXPECT_EQ(trainer::choose_checkpoint(dir.path()).dir, step_dir(root, 10));
    EXPECT_EQ(trainer::choose_checkpoint(dir.path()).skipped.size(), 2u);
  }
}

TEST(CheckpointCorruption, NoUsableCheckpointIsAnErrorListingEach) {
  TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  trainer::save_checkpoint(root, sample_checkpoint(10, 3), storage::posix_io());
  flip_byte(step_dir(root, 10) + "/state.safetensors", 40);
  storage::files::make_dirs(step_dir(root, 20) + ".tmp");
  try {
    trainer::find_checkpoint(dir.path());
    FAIL() << "found a checkpoint";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    expect_contains_all(msg, {"holds no usable checkpoint", "step_00000010/state.safetensors: checksum mismatch",
                              "step_00000020.tmp: an unfinished save"});
  }
}

// The manifest records what a resume must match; a mismatch is refused naming the field and both
// values. The checkpoint's data files are deleted first: a refusal that read any tensor (or built
// anything from them) would fail on the missing file instead.
TEST(ResumeRefusal, ShapeVocabDtypeWorldSizeAndOptimizerStateBeforeAnythingIsRead) {
  TempDir dir;
  auto cfg = train_harness::make_config(dir, 2, {"train.warmup_steps=1"});
  auto first = train_harness::run(cfg, dir.path() + "/run");
  ASSERT_EQ(first.checkpoints.size(), 1u);
  const std::string ck = first.checkpoints[0];
  ASSERT_EQ(::unlink((ck + "/model.safetensors").c_str()), 0);
  ASSERT_EQ(::unlink((ck + "/state.safetensors").c_str()), 0);
  struct Case {
    std::vector<std::string> set;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"model.d=128"}, "model.d: the checkpoint has 64, this run has 128"},
      {{"model.L=3"}, "model.L: the checkpoint has 2, this run has 3"},
      {{"model.vocab_size=300"}, "model.vocab_size: the checkpoint has 4096, this run has 300"},
      {{"train.precision=\"bf16\""}, "train.precision: the checkpoint has \"fp32\", this run has \"bf16\""},
      {{"run.devices=\"cpu:2\""}, "world_size: the checkpoint has 1, this run has 2"},
      // The optimizer state: Muon's momenta and EMA weights are in the checkpoint only if the run had them.
      {{"train.optimizer=\"muon\""}, "train.optimizer: the checkpoint has \"adamw\", this run has \"muon\""},
      {{"train.ema_decay=0.99"}, "train.ema: the checkpoint has off, this run has on"},
      // The loader's position holds a cursor a training source.
      {{"data.train=[\"text:" + dir.path() + "/corpus/*.txt\", \"text:" + dir.path() + "/corpus/*.txt\"]"},
       "data.train_sources: the checkpoint has 1, this run has 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.set[0]);
    std::vector<std::string> set = c.set;
    set.push_back("train.warmup_steps=1");
    auto changed = train_harness::make_config(dir, 4, set);
    // The command line's check (app/train_command.cpp runs it before starting the engine)...
    const int64_t world = c.set[0].find("cpu:2") != std::string::npos ? 2 : 1;
    const auto lines = trainer::resume_mismatches(trainer::read_compat(ck), trainer::resume_fingerprint(changed, world));
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(c.expect), std::string::npos) << lines[0];
    // ... and the engine's, for front ends that start it directly.
    auto r = train_harness::run(changed, dir.path() + "/again", ck);
    EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
    EXPECT_NE(r.ended.message.find(c.expect), std::string::npos) << r.ended.message;
    EXPECT_EQ(r.ended.message.find("missing"), std::string::npos) << "a tensor file was read: " << r.ended.message;
  }
  // Keys that change no parameter's shape may change on resume.
  auto same_shape = train_harness::make_config(
      dir, 4, {"model.rope_theta=5000.0", "model.activation_checkpointing=true", "train.warmup_steps=1", "train.lr=1e-4"});
  EXPECT_TRUE(trainer::resume_mismatches(trainer::read_compat(ck), trainer::resume_fingerprint(same_shape, 1)).empty());
}

}  // namespace

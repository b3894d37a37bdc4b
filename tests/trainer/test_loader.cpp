// The threaded loader (trainer/data/loader.h) on real files: batches as tensors with labels and
// cu_seqlens, exact resume from a checkpoint position with producer threads running ahead, fixed
// validation batches, phases, and the errors that stop a run before its first step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "tests/support/temp_dir.h"
#include "trainer/config.h"
#include "trainer/data/loader.h"
#include "trainer/session.h"

using testing_support::TempDir;

namespace {

// Documents of varied length (1..200 bytes) separated by "%" lines.
std::string corpus(int docs) {
  std::mt19937 rng(3);
  std::string out;
  for (int d = 0; d < docs; ++d) {
    const int len = 1 + static_cast<int>(rng() % 200);
    for (int i = 0; i < len; ++i) out += static_cast<char>('a' + rng() % 26);
    out += "\n%\n";
  }
  return out;
}

trainer::RunConfig config(const TempDir& dir, std::vector<std::string> extra = {}) {
  dir.write("c/a.txt", corpus(300));
  dir.write("c/b.txt", corpus(200));
  std::vector<std::string> o = {"data.train=[\"text:" + dir.path() + "/c/*.txt\"]", "data.val=0.1",
                                "train.batch_size=4", "train.seq_len=32", "train.eval_batches=3",
                                "data.loader_threads=2", "data.prefetch=3"};
  o.insert(o.end(), extra.begin(), extra.end());
  auto parsed = trainer::parse_config("", "<test>", o);
  EXPECT_TRUE(parsed.ok()) << (parsed.errors.empty() ? "" : parsed.errors[0]);
  auto cfg = parsed.config;
  auto errors = trainer::resolve_config(cfg);
  EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors[0]);
  return cfg;
}

}  // namespace

TEST(Loader, BatchesAreTensorsWithNextTokenLabels) {
  TempDir dir;
  trainer::data::Loader loader(config(dir, {"data.mask_boundary_labels=true"}), 0, 1, "");
  double wait = 0;
  for (int k = 0; k < 5; ++k) {
    auto b = loader.next(&wait);
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{4, 32}));
    ASSERT_EQ(b.labels.sizes(), b.inputs.sizes());
    ASSERT_TRUE(b.cu_seqlens.defined());
    EXPECT_EQ(b.cu_seqlens.scalar_type(), torch::kInt32);
    EXPECT_EQ(b.cu_seqlens[0].item<int>(), 0);
    EXPECT_EQ(b.cu_seqlens[-1].item<int>(), 4 * 32);
    // Inside a row, each label is the next input unless it is ignored at a document end (EOT).
    auto in = b.inputs, lab = b.labels;
    auto same = (lab.narrow(1, 0, 31) == in.narrow(1, 1, 31)) | (lab.narrow(1, 0, 31) == -1);
    EXPECT_TRUE(same.all().item<bool>());
    EXPECT_TRUE(((lab == -1) == (in == 256)).all().item<bool>()) << "ignored labels are exactly the EOT positions";
  }
  EXPECT_GE(wait, 0.0);
}

TEST(Loader, ResumeFromStateGivesTheSameBatches) {
  TempDir dir;
  auto cfg = config(dir);
  std::vector<trainer::data::Batch> first;
  std::string state_after_3;
  {
    trainer::data::Loader a(cfg, 0, 1, "");
    for (int k = 0; k < 40; ++k) {  // 40 × 128 tokens crosses an epoch of this corpus
      first.push_back(a.next(nullptr));
      if (k == 2) state_after_3 = first.back().state_after;
    }
  }
  trainer::data::Loader b(cfg, 0, 1, state_after_3);
  for (int k = 3; k < 40; ++k) {
    auto batch = b.next(nullptr);
    ASSERT_TRUE(torch::equal(batch.inputs, first[k].inputs)) << "batch " << k;
    ASSERT_TRUE(torch::equal(batch.labels, first[k].labels)) << "batch " << k;
    ASSERT_TRUE(torch::equal(batch.cu_seqlens, first[k].cu_seqlens)) << "batch " << k;
    EXPECT_EQ(batch.state_after, first[k].state_after);
  }
}

// A resume over other training documents (a file added to the glob) is named, and goes on from a
// document's start instead of an offset that belonged to another document; the same documents
// resume exactly and silently; a position saved before the corpus was recorded is taken as it is.
TEST(Loader, AResumeOverChangedDocumentsIsNamedAndStartsADocument) {
  TempDir dir;
  auto cfg = config(dir);
  std::string state;
  {
    trainer::data::Loader a(cfg, 0, 1, "");
    for (int k = 0; k < 3; ++k) state = a.next(nullptr).state_after;
  }
  EXPECT_TRUE(trainer::data::Loader(cfg, 0, 1, state).stats().resume_note.empty());
  dir.write("c/c.txt", corpus(50));
  auto grown = config(dir);
  trainer::data::Loader b(grown, 0, 1, state);
  EXPECT_NE(b.stats().resume_note.find("not those the checkpoint's loader position was taken over"), std::string::npos)
      << b.stats().resume_note;
  for (int k = 0; k < 10; ++k) EXPECT_EQ(b.next(nullptr).inputs.size(0), 4);
  const std::string v1 = "v1" + state.substr(2, state.rfind(' ') - 2);  // the same position, no corpus
  EXPECT_TRUE(trainer::data::Loader(grown, 0, 1, v1).stats().resume_note.empty());
}

TEST(Loader, ValidationBatchesAreFixedAndHeldOut) {
  TempDir dir;
  auto cfg = config(dir);
  trainer::data::Loader a(cfg, 0, 1, ""), b(cfg, 0, 1, "");
  ASSERT_EQ(a.validation().size(), 3u);
  for (size_t i = 0; i < a.validation().size(); ++i)
    EXPECT_TRUE(torch::equal(a.validation()[i].inputs, b.validation()[i].inputs));
  EXPECT_EQ(a.stats().val_tokens, 3 * 4 * 32);
  EXPECT_GT(a.stats().val_documents, 20);
  EXPECT_EQ(a.stats().train_documents + a.stats().val_documents, 500);
}

TEST(Loader, PhasesChangeTheBatchShape) {
  TempDir dir;
  auto cfg = config(dir, {"train.phases=[\"0:16x4\", \"128:32x2\"]"});
  trainer::data::Loader loader(cfg, 0, 1, "");
  EXPECT_EQ(loader.next(nullptr).inputs.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(loader.next(nullptr).inputs.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(loader.next(nullptr).inputs.sizes(), (std::vector<int64_t>{2, 32}));
}

TEST(Loader, DocumentAttentionOffSendsNoBoundaries) {
  TempDir dir;
  trainer::data::Loader loader(config(dir, {"data.document_attention=false"}), 0, 1, "");
  EXPECT_FALSE(loader.next(nullptr).cu_seqlens.defined());
}

TEST(Loader, TooSmallOrEmptyValidationSplitIsAnError) {
  TempDir dir;
  dir.write("s/a.txt", "tiny\n%\nalso tiny\n%\n");
  auto parsed = trainer::parse_config("", "<test>", {"data.train=[\"text:" + dir.path() + "/s/*.txt\"]",
                                                      "data.val=[\"text:" + dir.path() + "/s/*.txt\"]",
                                                      "train.seq_len=64", "train.batch_size=2"});
  ASSERT_TRUE(parsed.ok());
  auto cfg = parsed.config;
  ASSERT_TRUE(trainer::resolve_config(cfg).empty());
  try {
    trainer::data::Loader loader(cfg, 0, 1, "");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val: the validation split holds"), std::string::npos) << e.what();
  }
}

TEST(Loader, ResolveConfigReportsBadDataBeforeTheRun) {
  TempDir dir;
  dir.write("bad/x.bin", std::string(1030, '\0'));  // header magic 0: not an llm.c shard
  auto parsed = trainer::parse_config("", "<test>", {"data.train=[\"llmc:" + dir.path() + "/bad/*.bin\"]",
                                                      "model.vocab_size=50304"});
  ASSERT_TRUE(parsed.ok());
  auto cfg = parsed.config;
  auto errors = trainer::resolve_config(cfg);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("data.train[0]: " + dir.path() + "/bad/x.bin: byte 0: magic 0, expected 20240520"),
            std::string::npos)
      << errors[0];
  // Token sources need an explicit vocabulary size.
  auto no_vocab = trainer::parse_config("", "<test>", {"data.train=[\"llmc:" + dir.path() + "/bad/*.bin\"]",
                                                        "model.vocab_size=0"});
  auto cfg2 = no_vocab.config;
  auto errors2 = trainer::resolve_config(cfg2);
  ASSERT_EQ(errors2.size(), 1u);
  EXPECT_EQ(errors2[0].rfind("model.vocab_size: required with token sources", 0), 0u) << errors2[0];
}

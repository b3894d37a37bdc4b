// Data, first version: text sources, document splitting, the byte tokenizer, batches and their
// exact resume.
#include <gtest/gtest.h>

#include <unistd.h>

#include <map>
#include <set>

#include "tests/support/temp_dir.h"
#include "trainer/config.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/data/text_source.h"
#include "trainer/data/token_dataset.h"

using namespace trainer::data;
using testing_support::TempDir;

TEST(TextSource, SplitsAtSeparatorLines) {
  auto docs = split_documents("first\nline\n%\nsecond\r\n%\r\n\n%\nthird", "%", "f");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "first\nline\n");
  EXPECT_EQ(docs[1].text, "second\r\n");
  EXPECT_EQ(docs[2].text, "third");
  EXPECT_EQ(docs[1].offset, 13);
  // A line that merely contains the separator does not split.
  EXPECT_EQ(split_documents("a % b\n%%\n", "%", "f").size(), 1u);
  // No separator: the whole file is one document.
  EXPECT_EQ(split_documents("a\n%\nb", "", "f").size(), 1u);
}

TEST(TextSource, GlobExcludeAndSymlinkDedupe) {
  TempDir dir;
  dir.write("a.txt", "A");
  dir.write("b.txt", "B");
  dir.write("b.dat", "binary");
  ASSERT_EQ(::symlink(dir.file("a.txt").c_str(), dir.file("c.txt").c_str()), 0);
  auto files = expand_text_source("text:" + dir.path() + "/*", {"*.dat"}, "data.train[0]");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], dir.file("a.txt"));
  EXPECT_EQ(files[1], dir.file("b.txt"));
}

TEST(TextSource, NoMatchNamesTheKey) {
  try {
    expand_text_source("text:/nonexistent/dir/*.txt", {}, "data.train[1]");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("data.train[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/*.txt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(expand_text_source("jsonl:/x/*.jsonl", {}, "data.train[0]"), std::runtime_error);
}

TEST(ByteTokenizer, RoundTrip) {
  ByteTokenizer tok;
  std::vector<int32_t> ids;
  tok.encode("h\xc3\xa9!", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 0xc3, 0xa9, '!'}));
  EXPECT_EQ(tok.decode(ids), "h\xc3\xa9!");
  EXPECT_EQ(tokenizer_vocab_size("byte"), 257);
  EXPECT_THROW(tokenizer_vocab_size("sentencepiece:/x.model"), std::invalid_argument);
}

namespace {
TokenDataset small_dataset(uint64_t seed) {
  std::vector<std::vector<int32_t>> train, val;
  for (int d = 0; d < 10; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < 5 + d; ++i) doc.push_back(d * 20 + i);
    train.push_back(doc);
  }
  val.push_back({200, 201, 202, 203, 204, 205, 206, 207, 208});
  return TokenDataset(train, val, 256, seed);
}
}  // namespace

TEST(TokenDataset, LabelsAreNextTokensAndEpochCoversEveryDocument) {
  auto ds = small_dataset(7);
  const int64_t per_epoch = ds.train_tokens();  // 95 tokens + 10 EOTs
  EXPECT_EQ(per_epoch, 105);
  std::vector<int64_t> stream;
  std::vector<int64_t> x, y;
  while (static_cast<int64_t>(stream.size()) < per_epoch) {
    ds.next_train_batch(1, 5, x, y);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], x[i + 1]);
    stream.insert(stream.end(), x.begin(), x.end());
  }
  stream.resize(static_cast<size_t>(per_epoch));
  std::multiset<int64_t> seen(stream.begin(), stream.end());
  for (int d = 0; d < 10; ++d)
    for (int i = 0; i < 5 + d; ++i) EXPECT_EQ(seen.count(d * 20 + i), 1u) << d << "," << i;
  EXPECT_EQ(seen.count(256), 10u);
}

TEST(TokenDataset, ResumeFromPositionGivesTheSameBatches) {
  auto a = small_dataset(3);
  std::vector<int64_t> x, y;
  for (int i = 0; i < 7; ++i) a.next_train_batch(2, 8, x, y);  // crosses an epoch boundary
  const auto pos = a.position();
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 30; ++i) {
    a.next_train_batch(2, 8, x, y);
    expected.push_back(x);
    expected.push_back(y);
  }
  auto b = small_dataset(3);
  b.set_position(pos);
  for (int i = 0; i < 30; ++i) {
    b.next_train_batch(2, 8, x, y);
    EXPECT_EQ(x, expected[2 * i]) << i;
    EXPECT_EQ(y, expected[2 * i + 1]) << i;
  }
}

TEST(TokenDataset, EpochOrderDependsOnSeed) {
  auto a = small_dataset(1), b = small_dataset(2);
  std::vector<int64_t> xa, ya, xb, yb;
  a.next_train_batch(1, 100, xa, ya);
  b.next_train_batch(1, 100, xb, yb);
  EXPECT_NE(xa, xb);
}

TEST(TokenDataset, ValidationBatchesAreFixed) {
  auto ds = small_dataset(1);
  EXPECT_EQ(ds.val_tokens(), 10);
  EXPECT_EQ(ds.val_batches_available(1, 4), 2);
  std::vector<int64_t> x, y;
  ds.val_batch(1, 1, 4, x, y);
  EXPECT_EQ(x, (std::vector<int64_t>{204, 205, 206, 207}));
  EXPECT_EQ(y, (std::vector<int64_t>{205, 206, 207, 208}));
}

TEST(TokenDataset, BuildRejectsTooSmallValidationSplit) {
  TempDir dir;
  dir.write("c.txt", "one\n%\ntwo\n%\nthree\n");
  auto parsed = trainer::parse_config("", "<test>",
                                      {"data.train=[\"text:" + dir.path() + "/*.txt\"]", "data.val=0.5",
                                       "train.seq_len=64", "train.warmup_steps=1"});
  ASSERT_TRUE(parsed.ok()) << parsed.errors[0];
  try {
    build_dataset(parsed.config);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val"), std::string::npos) << e.what();
  }
}

// Packing and the document order (trainer/data/packer.h) on an in-memory source whose tokens say
// which document they came from (doc i holds i*1000+1, i*1000+2, ...), so every invariant can be
// checked token by token: coverage per epoch, pieces within rows, labels within documents,
// sharding across ranks, exact resume, phases and source weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "trainer/data/packer.h"

namespace {

using namespace trainer::data;

constexpr int32_t EOT = 999;

class FakeTokenizer : public Tokenizer {
 public:
  int64_t vocab_size() const override { return 1 << 30; }
  int32_t eot() const override { return EOT; }
  void encode(std::string_view, std::vector<int32_t>&, const std::string&) const override {}
  std::string decode(const std::vector<int32_t>&) const override { return ""; }
  bool needs_utf8() const override { return false; }
};

class VectorSource : public Source {
 public:
  // Document i has lengths[i] tokens: i*1000+1 ... (then EOT is appended by read_document).
  explicit VectorSource(const std::vector<int64_t>& lengths, int32_t base = 0) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      std::vector<int32_t> d;
      for (int64_t t = 0; t < lengths[i]; ++t) d.push_back(base + static_cast<int32_t>(i) * 1000 + 1 + static_cast<int32_t>(t));
      docs_.push_back(d);
    }
  }
  int64_t num_documents() const override { return static_cast<int64_t>(docs_.size()); }
  void read_document(int64_t i, const Tokenizer& tok, std::vector<int32_t>& out) const override {
    out.insert(out.end(), docs_[i].begin(), docs_[i].end());
    out.push_back(tok.eot());
  }
  int64_t document_tokens(int64_t i) const override { return static_cast<int64_t>(docs_[i].size()); }
  std::string where(int64_t i) const override { return "fake:" + std::to_string(i); }
  const std::vector<std::string>& files() const override { return files_; }

 private:
  std::vector<std::vector<int32_t>> docs_;
  std::vector<std::string> files_{"fake"};
};

std::vector<int64_t> all_docs(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::vector<int64_t> some_lengths(int64_t n) {
  std::vector<int64_t> l;
  for (int64_t i = 0; i < n; ++i) l.push_back(1 + (i * 37) % 90);  // 1..90 tokens, some longer than a row
  return l;
}

int64_t doc_of(int32_t token) { return token / 1000; }

struct Corpus {
  VectorSource src;
  FakeTokenizer tok;
  explicit Corpus(const std::vector<int64_t>& lengths) : src(lengths) {}
  std::unique_ptr<DocFetcher> fetcher(const trainer::data::SequenceState& at, int64_t threads, int64_t rank = 0,
                                      int64_t world = 1) {
    DocumentSequence seq({all_docs(src.num_documents())}, {}, 42, rank, world, true);
    seq.restore(at);
    return std::make_unique<DocFetcher>(std::move(seq), std::vector<const Source*>{&src}, tok, threads, 8);
  }
};

PackOptions options(int64_t T, int64_t B, bool mask) {
  PackOptions o;
  o.phases = {{0, T, B}};
  o.mask_boundary_labels = mask;
  return o;
}

SequenceState fresh(size_t sources = 1) {
  SequenceState s;
  s.cursors.assign(sources, 0);
  return s;
}

}  // namespace

TEST(Packer, EveryDocumentTokenOncePerEpoch) {
  const auto lengths = some_lengths(50);
  Corpus s(lengths);
  int64_t epoch_tokens = 0;
  for (int64_t l : lengths) epoch_tokens += l + 1;
  auto f = s.fetcher(fresh(), 0);
  Packer p(*f, options(16, 4, false));
  std::vector<int32_t> stream;
  while (static_cast<int64_t>(stream.size()) < epoch_tokens) {
    auto b = p.next();
    stream.insert(stream.end(), b.inputs.begin(), b.inputs.end());
  }
  stream.resize(static_cast<size_t>(epoch_tokens));
  std::multiset<int32_t> seen(stream.begin(), stream.end());
  for (size_t i = 0; i < lengths.size(); ++i)
    for (int64_t t = 0; t < lengths[i]; ++t)
      EXPECT_EQ(seen.count(static_cast<int32_t>(i) * 1000 + 1 + static_cast<int32_t>(t)), 1u) << "doc " << i;
  EXPECT_EQ(seen.count(EOT), lengths.size());
}

TEST(Packer, PiecesStayInRowsAndDocuments) {
  for (bool mask : {false, true}) {
    Corpus s(some_lengths(40));
    auto f = s.fetcher(fresh(), 0);
    const int64_t T = 24, B = 3;
    Packer p(*f, options(T, B, mask));
    for (int k = 0; k < 20; ++k) {
      auto b = p.next();
      ASSERT_EQ(b.inputs.size(), static_cast<size_t>(B * T));
      ASSERT_EQ(b.labels.size(), b.inputs.size());
      ASSERT_EQ(b.cu_seqlens.front(), 0);
      ASSERT_EQ(b.cu_seqlens.back(), B * T);
      std::set<int32_t> cuts(b.cu_seqlens.begin(), b.cu_seqlens.end());
      for (int64_t r = 0; r <= B; ++r) EXPECT_TRUE(cuts.count(static_cast<int32_t>(r * T))) << "row boundary " << r;
      int32_t longest = 0;
      for (size_t j = 0; j + 1 < b.cu_seqlens.size(); ++j) {
        const int32_t a = b.cu_seqlens[j], e = b.cu_seqlens[j + 1];
        ASSERT_LT(a, e);
        longest = std::max(longest, e - a);
        // One document per piece; only its last token may be the EOT.
        int64_t doc = -1;
        for (int32_t i = a; i < e; ++i) {
          if (b.inputs[i] == EOT) {
            EXPECT_EQ(i, e - 1) << "EOT inside a piece";
            continue;
          }
          if (doc < 0) doc = doc_of(b.inputs[i]);
          EXPECT_EQ(doc_of(b.inputs[i]), doc);
        }
      }
      EXPECT_EQ(b.max_seqlen, longest);
      for (size_t i = 0; i < b.inputs.size(); ++i) {
        const int32_t in = b.inputs[i], lab = b.labels[i];
        if (in == EOT) {
          // The EOT's label is the next document's first token, or ignored when masking.
          if (mask) EXPECT_EQ(lab, -1);
          else EXPECT_NE(lab, EOT);
        } else {
          // Inside a document the label is its next token, or its EOT.
          EXPECT_TRUE(lab == in + 1 || lab == EOT) << in << " -> " << lab;
        }
        if (i + 1 < b.inputs.size() && !cuts.count(static_cast<int32_t>(i + 1)) && !(mask && in == EOT)) {
          EXPECT_EQ(lab, b.inputs[i + 1]);
        }
      }
      if (!mask) {
        EXPECT_EQ(b.ignored_labels, 0);
      }
    }
  }
}

TEST(Packer, ShardingCoversEveryDocumentOnce) {
  const int64_t n = 101;
  for (int64_t world : {1, 2, 3}) {
    std::multiset<int64_t> picked;
    for (int64_t rank = 0; rank < world; ++rank) {
      DocumentSequence seq({all_docs(n)}, {}, 7, rank, world, true);
      // Draws k < n belong to rank k mod world.
      const int64_t mine = n / world + (rank < n % world ? 1 : 0);
      for (int64_t i = 0; i < mine; ++i) picked.insert(seq.next().doc);
    }
    ASSERT_EQ(picked.size(), static_cast<size_t>(n)) << "world " << world;
    for (int64_t d = 0; d < n; ++d) EXPECT_EQ(picked.count(d), 1u) << "doc " << d << " world " << world;
  }
}

TEST(Packer, EpochsReshuffle) {
  DocumentSequence seq({all_docs(30)}, {}, 9, 0, 1, true);
  std::vector<int64_t> e0, e1;
  for (int i = 0; i < 30; ++i) e0.push_back(seq.next().doc);
  for (int i = 0; i < 30; ++i) e1.push_back(seq.next().doc);
  EXPECT_NE(e0, e1);
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e1, all_docs(30));
}

TEST(Packer, ResumeGivesTheSameBatches) {
  for (int64_t threads : {0, 2}) {
    const auto lengths = some_lengths(60);
    Corpus s(lengths);
    auto f = s.fetcher(fresh(), threads);
    Packer p(*f, options(20, 3, true));
    std::vector<PackedBatch> all;
    PackerState after2;
    for (int k = 0; k < 9; ++k) {
      all.push_back(p.next());
      if (k == 1) after2 = decode_state(encode_state(p.state()), "test");
    }
    auto f2 = s.fetcher(after2.before, threads);
    Packer resumed(*f2, options(20, 3, true), after2);
    for (int k = 2; k < 9; ++k) {
      auto b = resumed.next();
      EXPECT_EQ(b.inputs, all[k].inputs) << "batch " << k << " threads " << threads;
      EXPECT_EQ(b.labels, all[k].labels) << "batch " << k;
      EXPECT_EQ(b.cu_seqlens, all[k].cu_seqlens) << "batch " << k;
    }
    EXPECT_EQ(resumed.state().tokens, p.state().tokens);
  }
}

TEST(Packer, ThreadedFetchMatchesInline) {
  Corpus s(some_lengths(80));
  auto inline_f = s.fetcher(fresh(), 0);
  auto threaded_f = s.fetcher(fresh(), 3);
  Packer a(*inline_f, options(32, 2, false)), b(*threaded_f, options(32, 2, false));
  for (int k = 0; k < 30; ++k) EXPECT_EQ(a.next().inputs, b.next().inputs) << "batch " << k;
}

TEST(Packer, PhasesChangeShapeAtTheirTokenCount) {
  Corpus s(some_lengths(40));
  auto f = s.fetcher(fresh(), 0);
  PackOptions o;
  o.phases = {{0, 8, 4}, {100, 16, 2}, {200, 32, 1}};
  Packer p(*f, o);
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int k = 0; k < 8; ++k) {
    auto b = p.next();
    shapes.emplace_back(b.T, b.B);
  }
  // 32 tokens per batch: 0,32,64,96 -> phase 0; 128 -> phase 1 (32 each): 128,160,192; 224 -> phase 2.
  const std::vector<std::pair<int64_t, int64_t>> want = {{8, 4}, {8, 4}, {8, 4}, {8, 4}, {16, 2}, {16, 2}, {16, 2}, {32, 1}};
  EXPECT_EQ(shapes, want);
}

// The phase is the run's: tokens counted over every rank, chosen once a step. With 2 ranks the
// second phase starts after 128 tokens of all ranks (batch 2 here, 32 tokens a rank and batch); with
// 3 micro-batches a step, the step that crosses 64 tokens keeps its first shape.
TEST(Packer, PhasesCountEveryRanksTokensAndChangeAtStepBoundaries) {
  Corpus s(some_lengths(40));
  auto shapes_of = [&](int64_t world, int64_t accum, std::vector<trainer::Phase> phases, int n) {
    auto f = s.fetcher(fresh(), 0);
    PackOptions o;
    o.phases = std::move(phases);
    o.world = world;
    o.micro_batches_per_step = accum;
    Packer p(*f, o);
    std::vector<int64_t> T;
    for (int k = 0; k < n; ++k) T.push_back(p.next().T);
    return T;
  };
  EXPECT_EQ(shapes_of(2, 1, {{0, 8, 4}, {128, 16, 2}}, 4), (std::vector<int64_t>{8, 8, 16, 16}));
  EXPECT_EQ(shapes_of(1, 1, {{0, 8, 4}, {128, 16, 2}}, 6), (std::vector<int64_t>{8, 8, 8, 8, 16, 16}));
  EXPECT_EQ(shapes_of(1, 3, {{0, 8, 4}, {64, 16, 2}}, 6), (std::vector<int64_t>{8, 8, 8, 16, 16, 16}));
}

// Unshuffled (validation): the sources in order, each one's documents in order, then again; never a
// second pass of one source while another has documents left.
TEST(Packer, UnshuffledSequenceTakesTheSourcesInTurn) {
  DocumentSequence seq({{0, 1, 2}, {10, 11}}, {1.0, 5.0}, 9, 0, 1, /*shuffle=*/false);
  std::vector<std::pair<int32_t, int64_t>> got;
  for (int k = 0; k < 7; ++k) {
    const DocumentPick p = seq.next();
    got.emplace_back(p.source, p.doc);
  }
  const std::vector<std::pair<int32_t, int64_t>> want = {{0, 0}, {0, 1}, {0, 2}, {1, 10}, {1, 11}, {0, 0}, {0, 1}};
  EXPECT_EQ(got, want);
}

TEST(Packer, WeightsSetSourceProportions) {
  DocumentSequence seq({all_docs(10), all_docs(1000)}, {3.0, 1.0}, 5, 0, 1, true);
  int64_t first = 0;
  const int64_t draws = 8000;
  for (int64_t i = 0; i < draws; ++i) first += seq.next().source == 0;
  EXPECT_NEAR(static_cast<double>(first) / draws, 0.75, 0.02);
  // Without weights the share follows the document counts.
  DocumentSequence plain({all_docs(100), all_docs(300)}, {}, 5, 0, 1, true);
  first = 0;
  for (int64_t i = 0; i < draws; ++i) first += plain.next().source == 0;
  EXPECT_NEAR(static_cast<double>(first) / draws, 0.25, 0.02);
}

TEST(Packer, StateTextRejectsGarbage) {
  PackerState s;
  s.before.draws = 17;
  s.before.cursors = {5, 12};
  s.offset = 3;
  s.tokens = 4096;
  s.batches = 8;
  s.corpus = 0xfedcba9876543210ull;
  auto back = decode_state(encode_state(s), "x");
  EXPECT_EQ(back.corpus, s.corpus);
  EXPECT_EQ(decode_state("v1 17 3 4096 8 2 5 12", "older checkpoint").corpus, 0u);  // before v2: unknown
  EXPECT_EQ(back.before.draws, 17);
  EXPECT_EQ(back.before.cursors, s.before.cursors);
  EXPECT_EQ(back.offset, 3);
  EXPECT_EQ(back.tokens, 4096);
  EXPECT_THROW(decode_state("v0 1 2", "ckpt/state.safetensors"), std::runtime_error);
  EXPECT_THROW(decode_state("v1 1 2 3 4 2 7", "ckpt"), std::runtime_error);
}

TEST(Packer, SourceErrorsReachThePacker) {
  class FailingSource : public VectorSource {
   public:
    FailingSource() : VectorSource({5, 5, 5}) {}
    void read_document(int64_t i, const Tokenizer& tok, std::vector<int32_t>& out) const override {
      if (i == 1) throw std::runtime_error("/data/x.jsonl: byte 120: field \"text\" is not a string");
      VectorSource::read_document(i, tok, out);
    }
  } src;
  FakeTokenizer tok;
  for (int64_t threads : {0, 2}) {
    DocumentSequence seq({{0, 1, 2}}, {}, 1, 0, 1, false);
    DocFetcher f(std::move(seq), {&src}, tok, threads, 4);
    Packer p(f, options(4, 1, false));
    EXPECT_NO_THROW(p.next());  // document 0 (5 tokens + EOT) fills the first row
    try {
      p.next();
      p.next();
      FAIL() << "expected the source error";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "/data/x.jsonl: byte 120: field \"text\" is not a string");
    }
  }
}

// Corpus sources and tokenizers: every format read back against a file the test writes, the
// document splitting rules, and every bad-input error (each must name the file, the byte offset
// and what was expected).
#include <gtest/gtest.h>

#include <sentencepiece_trainer.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <initializer_list>
#include <thread>
#include <tuple>
#include <utility>

#include "tests/support/temp_dir.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/data/mapped_files.h"
#include "trainer/data/source.h"
#include "trainer/data/source_internal.h"
#include "trainer/data/tokenizer.h"

using namespace trainer::data;
using testing_support::TempDir;

namespace {

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

std::vector<int32_t> read_doc(const Source& src, int64_t i, const Tokenizer& tok) {
  std::vector<int32_t> out;
  src.read_document(i, tok, out);
  return out;
}

// Byte ids of text, then the byte tokenizer's EOT.
std::vector<int32_t> doc_ids(const std::string& text) {
  auto v = bytes_of(text);
  v.push_back(ByteTokenizer::EOT);
  return v;
}

std::string write_bytes(const TempDir& dir, const std::string& name, const void* data, size_t n) {
  const std::string p = dir.file(name);
  std::ofstream(p, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  return p;
}

// An llm.c shard: header [magic, version, count, 0...] then the tokens.
std::string write_llmc(const TempDir& dir, const std::string& name, const std::vector<uint16_t>& tokens,
                       int32_t magic = 20240520, int32_t version = 1, int64_t count = INT64_MIN,
                       size_t drop_tail = 0) {
  std::vector<char> buf(1024 + 2 * tokens.size());
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count == INT64_MIN ? static_cast<int64_t>(tokens.size()) : count);
  std::memcpy(buf.data(), header, sizeof header);
  if (!tokens.empty()) std::memcpy(buf.data() + 1024, tokens.data(), 2 * tokens.size());
  return write_bytes(dir, name, buf.data(), buf.size() - drop_tail);
}

std::string write_u16(const TempDir& dir, const std::string& name, const std::vector<uint16_t>& tokens) {
  return write_bytes(dir, name, tokens.data(), 2 * tokens.size());
}

SourceOptions options(const std::string& separator = "%") {
  SourceOptions o;
  o.separator = separator;
  o.key = "data.train[0]";
  return o;
}

// Runs fn, which must throw std::runtime_error (or a subclass) whose message holds every part.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error holding '" << *parts.begin() << "'";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

// A tokenizer that insists on UTF-8, as SentencePiece does, without needing a model.
struct Utf8Tokenizer final : Tokenizer {
  int64_t vocab_size() const override { return 257; }
  int32_t eot() const override { return 256; }
  void encode(std::string_view text, std::vector<int32_t>& out, const std::string&) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(const std::vector<int32_t>&) const override { return {}; }
  bool needs_utf8() const override { return true; }
};

const ByteTokenizer BYTE;

}  // namespace

// [text]

TEST(TextSources, SeparatorLinesAcrossFilesInIndexOrder) {
  TempDir dir;
  dir.write("b.txt", "third\n%\r\n  \n%\nfourth");
  dir.write("a.txt", "first\nline\n%\nsecond\n%\n");
  auto src = open_source("text:" + dir.path() + "/*.txt", options("%"), BYTE);
  ASSERT_EQ(src->num_documents(), 4);
  ASSERT_EQ(src->files(), (std::vector<std::string>{dir.file("a.txt"), dir.file("b.txt")}));
  EXPECT_EQ(read_doc(*src, 0, BYTE), doc_ids("first\nline\n"));
  EXPECT_EQ(read_doc(*src, 1, BYTE), doc_ids("second\n"));
  EXPECT_EQ(read_doc(*src, 2, BYTE), doc_ids("third\n"));
  EXPECT_EQ(read_doc(*src, 3, BYTE), doc_ids("fourth"));
  EXPECT_EQ(src->where(0), dir.file("a.txt") + ":0");
  EXPECT_EQ(src->where(1), dir.file("a.txt") + ":13");
  EXPECT_EQ(src->where(3), dir.file("b.txt") + ":14");
  EXPECT_EQ(src->document_tokens(0), -1);
  // read_document appends to what the caller already holds.
  std::vector<int32_t> out{7};
  src->read_document(1, BYTE, out);
  EXPECT_EQ(out.size(), 1 + doc_ids("second\n").size());
  EXPECT_EQ(out[0], 7);
}

TEST(TextSources, OneDocumentPerFile) {
  TempDir dir;
  dir.write("a.txt", "a\n%\nb\n");
  dir.write("b.txt", " \n\t\n");  // whitespace only: dropped
  dir.write("c.txt", "");         // empty: dropped
  dir.write("d.txt", "d");
  auto src = open_source("text:" + dir.path() + "/*.txt", options(""), BYTE);
  ASSERT_EQ(src->num_documents(), 2);
  EXPECT_EQ(read_doc(*src, 0, BYTE), doc_ids("a\n%\nb\n"));
  EXPECT_EQ(read_doc(*src, 1, BYTE), doc_ids("d"));
  EXPECT_EQ(src->where(1), dir.file("d.txt") + ":0");
  EXPECT_EQ(src->files().size(), 4u);
}

TEST(TextSources, BlankLineRunsSplit) {
  TempDir dir;
  dir.write("a.txt", "\n\npara one\nstill one\n\n \n\t\r\npara two\r\n\r\npara three");
  auto src = open_source("text:" + dir.file("a.txt"), options("<blank>"), BYTE);
  ASSERT_EQ(src->num_documents(), 3);
  EXPECT_EQ(read_doc(*src, 0, BYTE), doc_ids("para one\nstill one\n"));
  EXPECT_EQ(read_doc(*src, 1, BYTE), doc_ids("para two\r\n"));
  EXPECT_EQ(read_doc(*src, 2, BYTE), doc_ids("para three"));
  EXPECT_EQ(src->where(0), dir.file("a.txt") + ":2");
  // The shared splitter reports byte ranges: "b\n" starts at byte 4.
  const std::string text = "a\n\n\nb\n";
  std::vector<std::pair<size_t, size_t>> ranges;
  detail::split_text(text.data(), text.size(), "<blank>",
                     [&](size_t b, size_t e) { ranges.emplace_back(b, e); });
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[1].first, 4u);
}

TEST(TextSources, ExcludeGlobsAndSymlinkDuplicates) {
  TempDir dir;
  dir.write("a.txt", "A");
  dir.write("b.txt", "B");
  dir.write("b.dat", "binary");
  dir.write("sub/skip.txt", "S");
  ASSERT_EQ(::symlink(dir.file("a.txt").c_str(), dir.file("a.u8").c_str()), 0);
  SourceOptions o = options("");
  o.exclude = {"*.dat"};
  auto src = open_source("text:" + dir.path() + "/*", o, BYTE);
  EXPECT_EQ(src->files(), (std::vector<std::string>{dir.file("a.txt"), dir.file("b.txt")}));
  EXPECT_EQ(src->num_documents(), 2);
  EXPECT_EQ(expand_source_files("llmc:" + dir.path() + "/*", {"*.dat", "*/b.txt"}, "k"),
            (std::vector<std::string>{dir.file("a.txt")}));
}

TEST(TextSources, ConcurrentReadsMatchSerial) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "document " + std::to_string(i) + " " + std::string(i % 37, 'x') + "\n%\n";
  dir.write("a.txt", text);
  auto src = open_source("text:" + dir.file("a.txt"), options("%"), BYTE);
  ASSERT_EQ(src->num_documents(), 200);
  std::vector<std::vector<int32_t>> serial;
  for (int64_t i = 0; i < src->num_documents(); ++i) serial.push_back(read_doc(*src, i, BYTE));
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (int64_t i = t; i < src->num_documents(); i += 2)
          if (read_doc(*src, i, BYTE) != serial[static_cast<size_t>(i)]) ++mismatches[static_cast<size_t>(t)];
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0}));
}

// More files than stay mapped: documents are read with pread instead, with the same result.
TEST(TextSources, ManyFilesReadUnmapped) {
  TempDir dir;
  std::vector<std::string> files;
  for (int i = 0; i < 5; ++i) {
    files.push_back(dir.write("f" + std::to_string(i) + ".txt", "doc " + std::to_string(i) + "\n%\nnext"));
  }
  auto src = detail::open_text_source(files, options("%"), BYTE, /*max_mapped=*/2);
  ASSERT_EQ(src->num_documents(), 10);
  EXPECT_EQ(read_doc(*src, 0, BYTE), doc_ids("doc 0\n"));
  EXPECT_EQ(read_doc(*src, 9, BYTE), doc_ids("next"));
  std::string text;
  src->document_text(8, text);
  EXPECT_EQ(text, "doc 4\n");
  EXPECT_EQ(src->where(9), files[4] + ":8");
}

// [jsonl]

TEST(JsonlSources, FieldTextReadBack) {
  TempDir dir;
  dir.write("a.jsonl",
            "{\"id\": 1, \"text\": \"hello\\nworld \\u00e9\", \"meta\": {\"text\": 5}}\n"
            "\n"
            "  \r\n"
            "{\"text\": \"   \", \"id\": 2}\n"
            "{\"nested\": [1, {\"text\": 3}], \"text\": \"second\"}\r\n");
  dir.write("b.jsonl", "{\"text\":\"third\"}");
  auto src = open_source("jsonl:" + dir.path() + "/*.jsonl", options(), BYTE);
  ASSERT_EQ(src->num_documents(), 3);  // the whitespace-only text is dropped
  EXPECT_EQ(read_doc(*src, 0, BYTE), doc_ids("hello\nworld \xc3\xa9"));
  EXPECT_EQ(read_doc(*src, 1, BYTE), doc_ids("second"));
  EXPECT_EQ(read_doc(*src, 2, BYTE), doc_ids("third"));
  EXPECT_EQ(src->where(0), dir.file("a.jsonl") + ":0");
  EXPECT_EQ(src->where(1), dir.file("a.jsonl") + ":92");
  EXPECT_EQ(src->where(2), dir.file("b.jsonl") + ":0");
  EXPECT_EQ(src->document_tokens(0), -1);
}

TEST(JsonlSources, ConfiguredField) {
  TempDir dir;
  dir.write("a.jsonl", "{\"text\": 1, \"content\": \"body\"}\n");
  SourceOptions o = options();
  o.text_field = "content";
  auto src = open_source("jsonl:" + dir.file("a.jsonl"), o, BYTE);
  ASSERT_EQ(src->num_documents(), 1);
  EXPECT_EQ(read_doc(*src, 0, BYTE), doc_ids("body"));
}

// [tokens]

TEST(TokenSources, LlmcShardsSplitAtEot) {
  TempDir dir;
  write_llmc(dir, "s_000.bin", {50256, 1, 2, 50256, 3, 50256, 50256, 4, 5});
  write_llmc(dir, "s_001.bin", {6, 65535, 50256});
  SourceOptions o = options();
  o.eot_token = 50256;
  auto src = open_source("llmc:" + dir.path() + "/s_*.bin", o, BYTE);
  ASSERT_EQ(src->num_documents(), 4);
  EXPECT_EQ(read_doc(*src, 0, BYTE), (std::vector<int32_t>{1, 2, 50256}));
  EXPECT_EQ(read_doc(*src, 1, BYTE), (std::vector<int32_t>{3, 50256}));
  EXPECT_EQ(read_doc(*src, 2, BYTE), (std::vector<int32_t>{4, 5, 50256}));
  EXPECT_EQ(read_doc(*src, 3, BYTE), (std::vector<int32_t>{6, 65535, 50256}));
  EXPECT_EQ(src->document_tokens(0), 2);
  EXPECT_EQ(src->document_tokens(1), 1);
  EXPECT_EQ(src->document_tokens(3), 2);
  EXPECT_EQ(src->where(0), dir.file("s_000.bin") + ":1026");
  EXPECT_EQ(src->where(2), dir.file("s_000.bin") + ":1038");
  EXPECT_EQ(src->where(3), dir.file("s_001.bin") + ":1024");
}

TEST(TokenSources, RawU16SplitAtEot) {
  TempDir dir;
  write_u16(dir, "train.bin", {7, 8, 9, 0, 10, 0});
  SourceOptions o = options();
  o.eot_token = 0;
  o.vocab_size = 11;
  auto src = open_source("u16:" + dir.file("train.bin"), o, BYTE);
  ASSERT_EQ(src->num_documents(), 2);
  EXPECT_EQ(read_doc(*src, 0, BYTE), (std::vector<int32_t>{7, 8, 9, 0}));
  EXPECT_EQ(read_doc(*src, 1, BYTE), (std::vector<int32_t>{10, 0}));
  EXPECT_EQ(src->document_tokens(0), 3);
  EXPECT_EQ(src->where(1), dir.file("train.bin") + ":8");
}

TEST(TokenSources, NoEotMakesOneDocumentPerFile) {
  TempDir dir;
  write_u16(dir, "a.bin", {1, 2, 3});
  write_u16(dir, "b.bin", {4});
  write_u16(dir, "c.bin", {});
  auto src = open_source("u16:" + dir.path() + "/*.bin", options(), BYTE);
  ASSERT_EQ(src->num_documents(), 2);
  EXPECT_EQ(read_doc(*src, 1, BYTE), (std::vector<int32_t>{4, 50256}));
}

// [tokenizers]

TEST(Tokenizers, ByteTokenizerBehindTheInterface) {
  auto tok = make_tokenizer("byte");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eot(), 256);
  EXPECT_FALSE(tok->needs_utf8());
  std::vector<int32_t> ids{1};
  tok->encode("h\xc3\xa9\xff", ids, "w");
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 'h', 0xc3, 0xa9, 0xff}));
  ids.push_back(256);
  EXPECT_EQ(tok->decode(ids), "\x01h\xc3\xa9\xff\n<|eot|>\n");
  EXPECT_EQ(tokenizer_vocab_size("byte"), 257);
  EXPECT_THROW(make_tokenizer("gpt2"), std::invalid_argument);
  expect_error([] { make_tokenizer("sentencepiece:"); }, {"data.tokenizer"});
  expect_error([] { tokenizer_vocab_size("wordpiece"); }, {"data.tokenizer", "wordpiece", "expected"});
}

TEST(Tokenizers, FirstInvalidUtf8) {
  EXPECT_EQ(first_invalid_utf8(""), -1);
  EXPECT_EQ(first_invalid_utf8("plain ascii text that is longer than eight bytes"), -1);
  EXPECT_EQ(first_invalid_utf8("\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"), -1);
  EXPECT_EQ(first_invalid_utf8("abcdefghij\xff"), 10);
  EXPECT_EQ(first_invalid_utf8("ab\xc3"), 2);                 // truncated sequence
  EXPECT_EQ(first_invalid_utf8("ab\xc0\xaf"), 2);             // overlong '/'
  EXPECT_EQ(first_invalid_utf8("a\xed\xa0\x80"), 1);          // UTF-16 surrogate
  EXPECT_EQ(first_invalid_utf8("a\xf4\x90\x80\x80"), 1);      // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("\xe6\x97\xa5x\x80yz"), 4);    // stray continuation byte
  EXPECT_EQ(first_invalid_utf8("\xe6\x97x"), 0);              // bad continuation
}

namespace {
// A small corpus: enough distinct words for a few hundred BPE merges, written by the test.
std::string tiny_corpus() {
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "training", "model",
                         "token", "language", "deltadeck", "attention", "document", "boundary", "packing",
                         "loader", "resume", "shard", "vocabulary", "piece", "merge", "byte", "fallback",
                         "caf\xc3\xa9", "na\xc3\xafve", "\xe6\x97\xa5\xe6\x9c\xac", "2024", "numbers", "42"};
  const int nw = sizeof words / sizeof words[0];
  std::string s;
  uint64_t x = 12345;
  for (int line = 0; line < 400; ++line) {
    const int len = 4 + line % 9;
    for (int w = 0; w < len; ++w) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      s += words[(x >> 33) % nw];
      s += w + 1 < len ? " " : ".\n";
    }
    if (line % 5 == 4) s += "%\n";
  }
  return s;
}

struct SpmModel {
  TempDir dir;
  std::string model;
  SpmModel() {
    dir.write("corpus/a.txt", tiny_corpus());
    dir.write("corpus/skip.dat", "zzzzzzzz qqqqqq");
    SentencePieceTrainOptions o;
    o.inputs = {dir.path() + "/corpus/*"};
    o.exclude = {"*.dat"};
    o.separator = "%";
    o.vocab_size = 400;
    o.out_model = dir.file("tok.model");
    train_sentencepiece(o);
    model = o.out_model;
  }
};

const SpmModel& spm_model() {
  static SpmModel m;  // trained once for every SentencePiece test
  return m;
}
}  // namespace

TEST(SentencePiece, TrainLoadRoundTrip) {
  const auto& m = spm_model();
  auto tok = make_tokenizer("sentencepiece:" + m.model);
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tokenizer_vocab_size("sentencepiece:" + m.model), 400);
  EXPECT_TRUE(tok->needs_utf8());
  EXPECT_GE(tok->eot(), 0);
  EXPECT_LT(tok->eot(), 400);
  for (const std::string text : {"the quick brown fox", "  two  spaces,\ttab\nnew line\r\n\n",
                                 "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac 12345", "unseen \xf0\x9f\x98\x80 Zq~"}) {
    std::vector<int32_t> ids;
    tok->encode(text, ids, "t");
    EXPECT_FALSE(ids.empty());
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 400);
      EXPECT_NE(id, tok->eot());
    }
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Frequent words merge into few pieces; the EOT shows in decoded text.
  std::vector<int32_t> ids;
  tok->encode("vocabulary", ids, "t");
  EXPECT_LE(ids.size(), 3u);
  ids.clear();
  tok->encode("the", ids, "t");
  ids.push_back(tok->eot());
  tok->encode("fox", ids, "t");
  EXPECT_EQ(tok->decode(ids), "the\n<|eot|>\nfox");
  // A .vocab is written next to the model.
  std::ifstream vocab(m.dir.file("tok.vocab"));
  EXPECT_TRUE(vocab.good());
}

// The end-of-document symbol is a user-defined piece, which SentencePiece matches wherever its
// text occurs: a document quoting "<|eot|>" must still encode as text, or the packer would cut it
// into two documents there.
TEST(SentencePiece, LiteralEotTextInADocumentIsTextNotTheEndOfDocument) {
  const auto& m = spm_model();
  auto tok = make_tokenizer("sentencepiece:" + m.model);
  for (const std::string text : {"a<|eot|>b", "<|eot|>", "the <|eot|><|eot|> fox <|eot|>", "<|eot|<|eot|>|>"}) {
    std::vector<int32_t> ids;
    tok->encode(text, ids, "t");
    ASSERT_FALSE(ids.empty()) << text;
    for (int32_t id : ids) EXPECT_NE(id, tok->eot()) << text;
    EXPECT_EQ(tok->decode(ids), text);
  }
  // Through a text source: one document, one end-of-document id, at its end.
  TempDir dir;
  dir.write("a.txt", "quoted <|eot|> inside\n");
  auto src = open_source("text:" + dir.file("a.txt"), options("%"), *tok);
  ASSERT_EQ(src->num_documents(), 1);
  auto ids = read_doc(*src, 0, *tok);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->eot()), 1);
  EXPECT_EQ(ids.back(), tok->eot());
}

TEST(SentencePiece, TextSourceThroughSentencePiece) {
  const auto& m = spm_model();
  auto tok = make_tokenizer("sentencepiece:" + m.model);
  TempDir dir;
  dir.write("a.txt", "the lazy dog\n%\ncaf\xc3\xa9 model\n");
  auto src = open_source("text:" + dir.file("a.txt"), options("%"), *tok);
  ASSERT_EQ(src->num_documents(), 2);
  auto ids = read_doc(*src, 1, *tok);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), tok->eot());
  EXPECT_EQ(tok->decode(ids), "caf\xc3\xa9 model\n\n<|eot|>\n");
}

TEST(SentencePiece, InvalidUtf8IsAnErrorWithItsOffset) {
  const auto& m = spm_model();
  auto tok = make_tokenizer("sentencepiece:" + m.model);
  TempDir dir;
  const std::string f = dir.write("a.txt", "fine\n%\nbad \xc3\x28 byte\n");
  expect_error([&] { open_source("text:" + f, options("%"), *tok); },
               {"data.train[0]", f, "byte 11", "invalid UTF-8", "0xC3", "expected UTF-8"});
  // The byte tokenizer takes the same file.
  EXPECT_EQ(open_source("text:" + f, options("%"), BYTE)->num_documents(), 2);
  // encode itself refuses invalid UTF-8, naming where.
  std::vector<int32_t> ids;
  expect_error([&] { tok->encode("ok\xff", ids, "/d/x.txt:40"); }, {"/d/x.txt:40", "byte 2", "invalid UTF-8"});
}

TEST(SentencePiece, LoadErrorsNameTheFile) {
  expect_error([] { make_tokenizer("sentencepiece:/missing/tok.model"); }, {"/missing/tok.model", "cannot open"});
  expect_error([] { tokenizer_vocab_size("sentencepiece:/missing/tok.model"); }, {"/missing/tok.model"});
  TempDir dir;
  const std::string junk = dir.write("junk.model", "this is not a protobuf");
  expect_error([&] { make_tokenizer("sentencepiece:" + junk); }, {junk, "not a SentencePiece model"});
  // A model trained without "<|eot|>".
  dir.write("c.txt", tiny_corpus());
  const auto st = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + dir.file("c.txt") + " --model_prefix=" + dir.file("plain") +
      " --vocab_size=120 --model_type=bpe --minloglevel=2");
  ASSERT_TRUE(st.ok()) << st.ToString();
  expect_error([&] { make_tokenizer("sentencepiece:" + dir.file("plain.model")); },
               {dir.file("plain.model"), "<|eot|>", "expected"});
}

TEST(SentencePiece, TrainOptionErrors) {
  TempDir dir;
  dir.write("a.txt", "some text\n");
  SentencePieceTrainOptions o;
  o.inputs = {dir.file("a.txt")};
  o.vocab_size = 400;
  o.out_model = dir.file("x.bin");
  expect_error([&] { train_sentencepiece(o); }, {"--out", ".model"});
  o.out_model = dir.file("x.model");
  o.model_type = "wordpiece";
  expect_error([&] { train_sentencepiece(o); }, {"--model-type", "wordpiece"});
  o.model_type = "bpe";
  o.inputs = {"llmc:" + dir.file("a.txt")};
  expect_error([&] { train_sentencepiece(o); }, {"--input[0]", "text:"});
  o.inputs = {dir.path() + "/nothing*.txt"};
  expect_error([&] { train_sentencepiece(o); }, {"--input[0]", "nothing*.txt", "matches no"});
}

// [bad input]

TEST(BadInput, MissingFileOrEmptyGlob) {
  expect_error([] { open_source("llmc:/nonexistent/dir/shard_000.bin", options(), BYTE); },
               {"data.train[0]", "/nonexistent/dir/shard_000.bin", "cannot open"});
  TempDir dir;
  expect_error([&] { open_source("text:" + dir.path() + "/*.txt", options(), BYTE); },
               {"data.train[0]", dir.path() + "/*.txt", "matches no readable files"});
  dir.write("a.txt", "A");
  SourceOptions o = options();
  o.exclude = {"a.*"};
  expect_error([&] { open_source("text:" + dir.path() + "/*.txt", o, BYTE); }, {"after data.exclude"});
  expect_error([&] { open_source("parquet:" + dir.path() + "/*", options(), BYTE); },
               {"data.train[0]", "parquet:", "expected text:GLOB"});
  expect_error([&] { open_source(dir.file("a.txt"), options(), BYTE); }, {"no known format prefix"});
  expect_error([&] { expand_source_files("u16:/nonexistent/*.bin", {}, "data.val[1]"); },
               {"data.val[1]", "/nonexistent/*.bin"});
}

TEST(BadInput, LlmcWrongMagic) {
  TempDir dir;
  const auto f = write_llmc(dir, "a.bin", {1, 2}, /*magic=*/12345);
  expect_error([&] { open_source("llmc:" + f, options(), BYTE); },
               {"data.train[0]: " + f + ": byte 0: magic 12345, expected 20240520 (an llm.c token shard)"});
}

TEST(BadInput, LlmcWrongVersion) {
  TempDir dir;
  const auto f = write_llmc(dir, "a.bin", {1, 2}, 20240520, /*version=*/2);
  expect_error([&] { open_source("llmc:" + f, options(), BYTE); }, {f, "byte 4", "version 2, expected 1"});
}

TEST(BadInput, LlmcCountDisagreesWithSize) {
  TempDir dir;
  const auto f = write_llmc(dir, "a.bin", {1, 2, 3, 4}, 20240520, 1, /*count=*/3);
  expect_error([&] { open_source("llmc:" + f, options(), BYTE); },
               {f, "byte 8", "token count 3 disagrees with the file size", "expected 1030 bytes", "has 1032"});
  const auto g = write_llmc(dir, "b.bin", {1}, 20240520, 1, /*count=*/-4);
  expect_error([&] { open_source("llmc:" + g, options(), BYTE); }, {g, "byte 8", "token count -4, expected >= 0"});
}

TEST(BadInput, LlmcTruncated) {
  TempDir dir;
  const auto f = write_llmc(dir, "a.bin", {1, 2, 3, 4}, 20240520, 1, INT64_MIN, /*drop_tail=*/3);
  expect_error([&] { open_source("llmc:" + f, options(), BYTE); },
               {f, "byte 1029", "truncated", "token count 4 needs 1032 bytes", "the file has 1029", "3 missing"});
  const auto g = write_bytes(dir, "short.bin", "\x01\x02", 2);
  expect_error([&] { open_source("llmc:" + g, options(), BYTE); }, {g, "byte 2", "1024-byte header"});
}

TEST(BadInput, U16OddSize) {
  TempDir dir;
  const auto f = write_bytes(dir, "a.bin", "\x01\x00\x02", 3);
  expect_error([&] { open_source("u16:" + f, options(), BYTE); },
               {f, "byte 2", "3 bytes, an odd size", "expected a whole number of uint16 tokens"});
}

TEST(BadInput, TokenIdAtOrAboveVocab) {
  TempDir dir;
  std::vector<uint16_t> tokens(100000, 5);
  tokens[70001] = 257;
  const auto f = write_llmc(dir, "a.bin", tokens);
  SourceOptions o = options();
  o.eot_token = 256;
  o.vocab_size = 257;
  expect_error([&] { open_source("llmc:" + f, o, BYTE); },
               {f, "byte " + std::to_string(1024 + 2 * 70001), "token id 257, expected < 257"});
  const auto g = write_u16(dir, "b.bin", {1, 2, 300});
  expect_error([&] { open_source("u16:" + g, o, BYTE); }, {g, "byte 4", "token id 300, expected < 257"});
  o.vocab_size = 257;
  o.eot_token = 50256;
  expect_error([&] { open_source("u16:" + g, o, BYTE); }, {"data.eot_token 50256", "vocabulary size 257"});
  o.eot_token = 70000;
  o.vocab_size = 0;
  expect_error([&] { open_source("u16:" + g, o, BYTE); }, {"data.eot_token 70000", "0..65535"});
}

TEST(BadInput, InvalidUtf8UnderAUtf8Tokenizer) {
  TempDir dir;
  const auto f = dir.write("a.txt", "ok\n%\n\xff\xfe");
  const Utf8Tokenizer utf8;
  expect_error([&] { open_source("text:" + f, options("%"), utf8); },
               {"data.train[0]", f, "byte 5", "invalid UTF-8 (byte 0xFF)"});
}

TEST(BadInput, JsonlBadLine) {
  TempDir dir;
  const auto f = dir.write("a.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\",}\n");
  expect_error([&] { open_source("jsonl:" + f, options(), BYTE); },
               {"data.train[0]: " + f + ":15: line 3: not valid JSON at byte 28", "expected one JSON object per line"});
  const auto g = dir.write("b.jsonl", "[1, 2]\n");
  expect_error([&] { open_source("jsonl:" + g, options(), BYTE); }, {g + ":0: line 1: not a JSON object"});
  const auto h = dir.write("c.jsonl", "{\"text\": \"caf\xe9\"}\n");
  expect_error([&] { open_source("jsonl:" + h, options(), BYTE); },
               {h + ":0: line 1: invalid UTF-8 at byte 13 (0xE9)"});
}

TEST(BadInput, JsonlFieldMissingOrNotAString) {
  TempDir dir;
  const auto f = dir.write("a.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\", \"meta\": {\"text\": \"c\"}}\n");
  expect_error([&] { open_source("jsonl:" + f, options(), BYTE); },
               {f + ":14: line 2: no field \"text\"", "data.text_field"});
  const auto g = dir.write("b.jsonl", "{\"text\": [\"a\"]}\n");
  expect_error([&] { open_source("jsonl:" + g, options(), BYTE); },
               {g + ":0: line 1: field \"text\" is an array, expected a string"});
  const auto h = dir.write("c.jsonl", "{\"text\": null}\n");
  expect_error([&] { open_source("jsonl:" + h, options(), BYTE); }, {"field \"text\" is null, expected a string"});
}

TEST(BadInput, SourceWithNoDocuments) {
  TempDir dir;
  const auto t = dir.write("a.txt", "%\n  \n%\n\n");
  expect_error([&] { open_source("text:" + t, options("%"), BYTE); }, {"data.train[0]", t, "byte 0", "no documents"});
  const auto j = dir.write("a.jsonl", "\n{\"text\": \" \"}\n");
  expect_error([&] { open_source("jsonl:" + j, options(), BYTE); }, {j, "no documents"});
  write_llmc(dir, "s0.bin", {50256, 50256});
  write_llmc(dir, "s1.bin", {});
  expect_error([&] { open_source("llmc:" + dir.path() + "/s*.bin", options(), BYTE); },
               {dir.file("s0.bin") + " (and 1 more files)", "byte 1024", "no documents", "50256"});
}

// random:DOCS: the same documents on every read, ids below the vocabulary and never the EOT id
// except at the end, lengths 256..4096; bad counts and a missing vocabulary are named errors.
TEST(RandomSource, DeterministicDocumentsInRange) {
  ByteTokenizer tok;
  SourceOptions o;
  o.vocab_size = 1000;
  o.eot_token = 7;
  o.key = "data.train[0]";
  auto src = open_source("random:500", o, tok);
  ASSERT_EQ(src->num_documents(), 500);
  EXPECT_TRUE(src->files().empty());
  std::set<int64_t> lengths;
  for (int64_t i = 0; i < 500; i += 37) {
    std::vector<int32_t> a, b;
    src->read_document(i, tok, a);
    src->read_document(i, tok, b);
    EXPECT_EQ(a, b) << i;
    ASSERT_EQ(static_cast<int64_t>(a.size()), src->document_tokens(i) + 1);
    EXPECT_GE(src->document_tokens(i), 256);
    EXPECT_LE(src->document_tokens(i), 4096);
    lengths.insert(src->document_tokens(i));
    EXPECT_EQ(a.back(), 7);
    for (size_t t = 0; t + 1 < a.size(); ++t) {
      ASSERT_NE(a[t], 7);
      ASSERT_GE(a[t], 0);
      ASSERT_LT(a[t], 1000);
    }
  }
  EXPECT_GT(lengths.size(), 5u);  // lengths vary
  for (const char* bad : {"random:0", "random:abc", "random:12x"}) {
    try {
      open_source(bad, o, tok);
      ADD_FAILURE() << bad << " opened";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("data.train[0]: random:DOCS needs a document count"), std::string::npos)
          << e.what();
    }
  }
  o.vocab_size = 0;
  EXPECT_THROW(open_source("random:10", o, tok), std::runtime_error);
}

// A bus error inside a mapped corpus file is reported naming the file and the byte (the handler in
// app/signals.cpp calls this; faults' signals e2e truncates a shard under a running process).
TEST(MappedFiles, AFaultInAMappedFileIsReportedByFileAndByte) {
  TempDir dir;
  const std::string path = dir.write("shard.bin", std::string(20000, 'x'));
  const std::string report_path = dir.file("report.txt");
  auto report_of = [&](const void* addr) {
    const int fd = ::open(report_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_GE(fd, 0);
    const bool named = report_mapped_fault(addr, fd);
    ::close(fd);
    std::ifstream in(report_path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return std::make_pair(named, text);
  };
  const char* data = nullptr;
  {
    detail::MappedFile a(path, "data.train");
    detail::MappedFile b(std::move(a));  // the report follows the mapping through moves
    data = b.data();
    ASSERT_NE(data, nullptr);
    auto [named, text] = report_of(data + 5000);
    EXPECT_TRUE(named);
    EXPECT_NE(text.find("bus error reading " + path + " at byte 5000: the file is shorter than when the run opened"),
              std::string::npos)
        << text;
    std::tie(named, text) = report_of(data + 20000);  // one past the end: not this file
    EXPECT_FALSE(named);
    EXPECT_TRUE(text.empty()) << text;
  }
  auto [named, text] = report_of(data + 5000);  // unmapped: forgotten
  EXPECT_FALSE(named);
  EXPECT_TRUE(text.empty()) << text;
}

// Token formats: llmc:GLOB (llm.c shards: 256 int32 little-endian header [20240520, 1, count, 0...],
// then count uint16 tokens, exactly as llm.c's fineweb.py writes them) and u16:GLOB (nanoGPT's raw
// uint16 arrays). Shards stay mapped, so read_document is a widening copy out of the page cache:
// the loader needs >= 20M tokens/s from one thread. Every token is checked once at open time
// (vocab range, EOT positions), never again.
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "trainer/data/source_internal.h"

namespace trainer::data::detail {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards are little-endian; this host is not");

constexpr int32_t LLMC_MAGIC = 20240520;
constexpr int32_t LLMC_VERSION = 1;
constexpr int64_t LLMC_HEADER_BYTES = 256 * 4;

int32_t header_int(const char* data, int k) {
  int32_t v;
  std::memcpy(&v, data + 4 * k, 4);
  return v;
}

class TokenSource final : public Source {
 public:
  TokenSource(std::vector<std::string> files, const SourceOptions& opts, bool llmc)
      : files_(std::move(files)), key_(opts.key), header_(llmc ? LLMC_HEADER_BYTES : 0), eot_(opts.eot_token) {
    if (opts.eot_token < 0 || opts.eot_token > 65535) {
      throw std::runtime_error(key_ + ": data.eot_token " + std::to_string(opts.eot_token) +
                               ": expected an id in 0..65535 (token files hold uint16 ids)");
    }
    if (opts.vocab_size > 0 && opts.eot_token >= opts.vocab_size) {
      throw std::runtime_error(key_ + ": data.eot_token " + std::to_string(opts.eot_token) +
                               " is not below the vocabulary size " + std::to_string(opts.vocab_size));
    }
    for (size_t f = 0; f < files_.size(); ++f) {
      MappedFile m(files_[f], key_);
      const int64_t count = llmc ? check_llmc_header(files_[f], m) : check_u16_size(files_[f], m);
      const auto* tokens = reinterpret_cast<const uint16_t*>(m.data() + header_);  // (count,)
      if (opts.vocab_size > 0 && opts.vocab_size <= 65535) check_vocab(files_[f], tokens, count, opts.vocab_size);
      index_documents(static_cast<int32_t>(f), tokens, count);
      maps_.push_back(std::move(m));
    }
    if (docs_.empty()) {
      throw std::runtime_error(key_ + ": " + files_.front() +
                               (files_.size() > 1 ? " (and " + std::to_string(files_.size() - 1) + " more files)" : "") +
                               ": byte " + std::to_string(header_) + ": no documents; expected tokens other than " +
                               "data.eot_token = " + std::to_string(eot_));
    }
  }

  int64_t num_documents() const override { return static_cast<int64_t>(docs_.size()); }

  void read_document(int64_t i, const Tokenizer&, std::vector<int32_t>& out) const override {
    const DocRecord& d = docs_[static_cast<size_t>(i)];
    const auto* src = reinterpret_cast<const uint16_t*>(maps_[static_cast<size_t>(d.file)].data() + header_) +
                      d.offset;  // (d.length,)
    const size_t n0 = out.size();
    out.resize(n0 + d.length + 1);
    int32_t* dst = out.data() + n0;  // (d.length + 1,)
    for (uint32_t k = 0; k < d.length; ++k) dst[k] = static_cast<int32_t>(src[k]);
    dst[d.length] = static_cast<int32_t>(eot_);
  }

  int64_t document_tokens(int64_t i) const override { return docs_[static_cast<size_t>(i)].length; }

  std::string where(int64_t i) const override {
    const DocRecord& d = docs_[static_cast<size_t>(i)];
    return files_[static_cast<size_t>(d.file)] + ":" + std::to_string(header_ + 2 * d.offset);
  }

  const std::vector<std::string>& files() const override { return files_; }

 private:
  int64_t check_llmc_header(const std::string& file, const MappedFile& m) const {
    const int64_t size = m.size();
    if (size < LLMC_HEADER_BYTES) {
      fail_at(key_, file, size,
              "the file ends after " + std::to_string(size) + " bytes; expected the 1024-byte header of an llm.c "
              "token shard\n---> HINT: raw uint16 arrays (nanoGPT's train.bin) are read with u16:GLOB");
    }
    const int32_t magic = header_int(m.data(), 0);
    if (magic != LLMC_MAGIC) {
      fail_at(key_, file, 0,
              "magic " + std::to_string(magic) + ", expected " + std::to_string(LLMC_MAGIC) +
                  " (an llm.c token shard)\n---> HINT: raw uint16 arrays (nanoGPT's train.bin) are read with "
                  "u16:GLOB; text with text:GLOB");
    }
    const int32_t version = header_int(m.data(), 1);
    if (version != LLMC_VERSION) {
      fail_at(key_, file, 4,
              "version " + std::to_string(version) + ", expected " + std::to_string(LLMC_VERSION) +
                  " (uint16 tokens; llm.c's version 2 shards hold uint32 tokens and are not supported)");
    }
    const int64_t count = header_int(m.data(), 2);
    if (count < 0) fail_at(key_, file, 8, "token count " + std::to_string(count) + ", expected >= 0");
    const int64_t expected = LLMC_HEADER_BYTES + 2 * count;
    if (size < expected) {
      fail_at(key_, file, size,
              "truncated: the header's token count " + std::to_string(count) + " needs " + std::to_string(expected) +
                  " bytes (1024 + 2*" + std::to_string(count) + "), the file has " + std::to_string(size) + " (" +
                  std::to_string(expected - size) + " missing)\n---> HINT: was the shard still being written?");
    }
    if (size > expected) {
      fail_at(key_, file, 8,
              "token count " + std::to_string(count) + " disagrees with the file size: expected " +
                  std::to_string(expected) + " bytes (1024 + 2*" + std::to_string(count) + "), the file has " +
                  std::to_string(size));
    }
    return count;
  }

  int64_t check_u16_size(const std::string& file, const MappedFile& m) const {
    if (m.size() % 2 != 0) {
      fail_at(key_, file, m.size() - 1,
              "the file is " + std::to_string(m.size()) + " bytes, an odd size; expected a whole number of uint16 "
              "tokens (a raw uint16 array)");
    }
    return m.size() / 2;
  }

  // One vectorizable max pass per block; the exact position is searched only when a block fails.
  void check_vocab(const std::string& file, const uint16_t* tokens, int64_t count, int64_t vocab) const {
    constexpr int64_t BLOCK = 1 << 16;
    for (int64_t b = 0; b < count; b += BLOCK) {
      const int64_t e = std::min(count, b + BLOCK);
      uint16_t mx = 0;
      for (int64_t j = b; j < e; ++j) mx = std::max(mx, tokens[j]);
      if (mx < vocab) continue;
      for (int64_t j = b; j < e; ++j) {
        if (tokens[j] >= vocab) {
          fail_at(key_, file, header_ + 2 * j,
                  "token id " + std::to_string(tokens[j]) + ", expected < " + std::to_string(vocab) +
                      " (the vocabulary size)\n---> HINT: was the shard written by another tokenizer? check "
                      "model.vocab_size and data.tokenizer");
        }
      }
    }
  }

  void index_documents(int32_t f, const uint16_t* tokens, int64_t count) {
    const auto eot = static_cast<uint16_t>(eot_);
    int64_t begin = 0;
    auto push = [&](int64_t b, int64_t e) {
      if (e == b) return;
      if (e - b > static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
        fail_at(key_, files_[static_cast<size_t>(f)], header_ + 2 * b,
                "a document of " + std::to_string(e - b) + " tokens; expected at most 2^32 between data.eot_token = " +
                    std::to_string(eot_) + " tokens");
      }
      docs_.push_back({b, static_cast<uint32_t>(e - b), f});
    };
    for (int64_t j = 0; j < count; ++j) {
      if (tokens[j] == eot) {
        push(begin, j);
        begin = j + 1;
      }
    }
    push(begin, count);
  }

  std::vector<std::string> files_;
  std::string key_;
  int64_t header_;  // bytes before the first token
  int64_t eot_;
  std::vector<MappedFile> maps_;  // one per file
  std::vector<DocRecord> docs_;
};

}  // namespace

std::unique_ptr<Source> open_token_source(std::vector<std::string> files, const SourceOptions& opts, bool llmc) {
  return std::make_unique<TokenSource>(std::move(files), opts, llmc);
}

}  // namespace trainer::data::detail

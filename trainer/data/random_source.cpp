// random:DOCS — synthetic token documents for benchmarks: document i holds a length and uniform
// token ids drawn from a hash of i (splitmix64), so every rank, thread and resume sees the same
// corpus without any file. Lengths vary from 256 to 4096 tokens so packing and per-document
// attention do real work. Ids are < the model's vocabulary and never the end-of-document id.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "trainer/data/source.h"
#include "trainer/data/source_internal.h"

namespace trainer::data::detail {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class RandomSource final : public Source {
 public:
  RandomSource(int64_t docs, const SourceOptions& opts) : docs_(docs), opts_(opts) {}
  int64_t num_documents() const override { return docs_; }
  int64_t document_tokens(int64_t i) const override {
    return 256 + static_cast<int64_t>(splitmix64(static_cast<uint64_t>(i) * 2 + 1) % 3841);
  }
  void read_document(int64_t i, const Tokenizer&, std::vector<int32_t>& out) const override {
    const int64_t n = document_tokens(i);
    const uint64_t ids = static_cast<uint64_t>(std::max<int64_t>(1, opts_.vocab_size - 1));
    uint64_t state = splitmix64(static_cast<uint64_t>(i) * 2);
    for (int64_t t = 0; t < n; ++t) {
      state = splitmix64(state);
      auto id = static_cast<int32_t>(state % ids);
      if (id >= opts_.eot_token) ++id;  // skip the end-of-document id
      out.push_back(id);
    }
    out.push_back(static_cast<int32_t>(opts_.eot_token));
  }
  std::string where(int64_t i) const override { return "random document " + std::to_string(i); }
  const std::vector<std::string>& files() const override { return no_files_; }

 private:
  int64_t docs_;
  SourceOptions opts_;
  std::vector<std::string> no_files_;
};

}  // namespace

std::unique_ptr<Source> open_random_source(const std::string& count, const SourceOptions& opts) {
  int64_t docs = 0;
  try {
    size_t used = 0;
    docs = std::stoll(count, &used);
    if (used != count.size()) docs = 0;
  } catch (const std::exception&) {
    docs = 0;
  }
  if (docs < 1)
    throw std::runtime_error(opts.key + ": random:DOCS needs a document count >= 1 (got \"" + count + "\")");
  if (opts.vocab_size < 2)
    throw std::runtime_error(opts.key + ": random: sources need model.vocab_size (the ids are drawn below it)");
  if (opts.eot_token >= opts.vocab_size)
    throw std::runtime_error(opts.key + ": data.eot_token " + std::to_string(opts.eot_token) +
                             " is not below model.vocab_size " + std::to_string(opts.vocab_size));
  return std::make_unique<RandomSource>(docs, opts);
}

}  // namespace trainer::data::detail

#include "trainer/data/token_dataset.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "trainer/data/byte_tokenizer.h"
#include "trainer/data/text_source.h"

namespace trainer::data {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

TokenDataset::TokenDataset(std::vector<std::vector<int32_t>> train_docs, std::vector<std::vector<int32_t>> val_docs,
                           int32_t eot, uint64_t seed)
    : train_docs_(std::move(train_docs)), eot_(eot), seed_(seed) {
  for (const auto& d : train_docs_) train_tokens_ += static_cast<int64_t>(d.size()) + 1;
  val_docs_count_ = static_cast<int64_t>(val_docs.size());
  for (const auto& d : val_docs) {
    val_stream_.insert(val_stream_.end(), d.begin(), d.end());
    val_stream_.push_back(eot_);
  }
}

const std::vector<int32_t>& TokenDataset::epoch_stream(int64_t epoch) {
  auto it = epoch_cache_.find(epoch);
  if (it != epoch_cache_.end()) return it->second;
  // Keep only epochs at or after the one being asked for: reads never go backwards.
  while (!epoch_cache_.empty() && epoch_cache_.begin()->first < epoch - 1) epoch_cache_.erase(epoch_cache_.begin());
  std::vector<size_t> order(train_docs_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch) + 1)));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> s;
  s.reserve(static_cast<size_t>(train_tokens_));
  for (size_t i : order) {
    s.insert(s.end(), train_docs_[i].begin(), train_docs_[i].end());
    s.push_back(eot_);
  }
  return epoch_cache_.emplace(epoch, std::move(s)).first->second;
}

void TokenDataset::next_train_batch(int64_t B, int64_t T, std::vector<int64_t>& inputs, std::vector<int64_t>& labels) {
  const int64_t n = B * T;
  // B*T + 1 consecutive tokens: inputs are the first B*T, labels the last B*T.
  std::vector<int64_t> buf;
  buf.reserve(static_cast<size_t>(n + 1));
  LoaderPosition p = pos_;
  while (static_cast<int64_t>(buf.size()) < n + 1) {
    const auto& s = epoch_stream(p.epoch);
    const int64_t take = std::min<int64_t>(n + 1 - static_cast<int64_t>(buf.size()),
                                           static_cast<int64_t>(s.size()) - p.offset);
    buf.insert(buf.end(), s.begin() + p.offset, s.begin() + p.offset + take);
    p.offset += take;
    if (p.offset == static_cast<int64_t>(s.size())) {
      ++p.epoch;
      p.offset = 0;
    }
  }
  inputs.assign(buf.begin(), buf.begin() + n);
  labels.assign(buf.begin() + 1, buf.end());
  // Advance by B*T: the last token read is the first input of the next batch.
  pos_.offset += n;
  while (pos_.offset >= train_tokens_) {
    pos_.offset -= train_tokens_;
    ++pos_.epoch;
  }
}

int64_t TokenDataset::val_batches_available(int64_t B, int64_t T) const {
  const int64_t n = static_cast<int64_t>(val_stream_.size());
  return n < 1 + B * T ? 0 : (n - 1) / (B * T);
}

void TokenDataset::val_batch(int64_t k, int64_t B, int64_t T, std::vector<int64_t>& inputs,
                             std::vector<int64_t>& labels) const {
  const int64_t n = B * T, start = k * n;
  inputs.assign(val_stream_.begin() + start, val_stream_.begin() + start + n);
  labels.assign(val_stream_.begin() + start + 1, val_stream_.begin() + start + n + 1);
}

TokenDataset build_dataset(const RunConfig& cfg) {
  const auto& dc = cfg.data;
  auto docs = read_text_sources(dc.train, dc.exclude, dc.separator);
  if (docs.empty()) throw std::runtime_error("data.train: the sources hold no documents");
  ByteTokenizer tok;
  std::vector<std::vector<int32_t>> train, val;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<int32_t> ids;
    tok.encode(docs[i].text, ids);
    const double u = static_cast<double>(mix64(cfg.seed ^ mix64(i)) >> 11) * (1.0 / 9007199254740992.0);
    (u < dc.val_fraction ? val : train).push_back(std::move(ids));
  }
  if (train.empty()) throw std::runtime_error("data.val: every document went to validation; lower data.val");
  TokenDataset ds(std::move(train), std::move(val), tok.eot(), cfg.seed);
  if (dc.val_fraction > 0 && ds.val_batches_available(1, cfg.train.seq_len) == 0) {
    throw std::runtime_error("data.val: the validation split holds " + std::to_string(ds.val_tokens()) +
                             " tokens, fewer than one sequence of train.seq_len + 1 = " +
                             std::to_string(cfg.train.seq_len + 1) + "; raise data.val");
  }
  if (ds.train_tokens() < cfg.train.seq_len + 1) {
    throw std::runtime_error("data.train: the corpus holds " + std::to_string(ds.train_tokens()) +
                             " tokens, fewer than one sequence of train.seq_len + 1");
  }
  return ds;
}

}  // namespace trainer::data

// TokenDataset (first version): documents tokenized once, split into train and validation by a
// seeded hash of the document index, served as B×T batches of a shuffled-per-epoch token stream
// (each document followed by EOT). The position (epoch, offset) is all a resume needs: the epoch
// order is a pure function of (seed, epoch). No torch; the session turns rows into tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/api.h"

namespace trainer::data {

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t offset = 0;  // tokens of that epoch's stream already consumed
};

class TokenDataset {
 public:
  TokenDataset(std::vector<std::vector<int32_t>> train_docs, std::vector<std::vector<int32_t>> val_docs,
               int32_t eot, uint64_t seed);

  // B*T inputs and the B*T next-token labels (row-major [B,T]); advances the position by B*T.
  void next_train_batch(int64_t B, int64_t T, std::vector<int64_t>& inputs, std::vector<int64_t>& labels);
  // How many distinct validation batches of B×T the held-out stream holds.
  int64_t val_batches_available(int64_t B, int64_t T) const;
  // The k-th validation batch (k < val_batches_available); the same every call.
  void val_batch(int64_t k, int64_t B, int64_t T, std::vector<int64_t>& inputs, std::vector<int64_t>& labels) const;

  LoaderPosition position() const { return pos_; }
  void set_position(const LoaderPosition& p) { pos_ = p; }
  int64_t train_tokens() const { return train_tokens_; }
  int64_t val_tokens() const { return static_cast<int64_t>(val_stream_.size()); }
  int64_t train_documents() const { return static_cast<int64_t>(train_docs_.size()); }
  int64_t val_documents() const { return val_docs_count_; }

 private:
  const std::vector<int32_t>& epoch_stream(int64_t epoch);
  std::vector<std::vector<int32_t>> train_docs_;
  std::vector<int32_t> val_stream_;
  int64_t val_docs_count_ = 0;
  int64_t train_tokens_ = 0;  // per epoch, EOTs included
  int32_t eot_;
  uint64_t seed_;
  LoaderPosition pos_;
  std::map<int64_t, std::vector<int32_t>> epoch_cache_;  // at most two epochs live
};

// Reads the configured sources, tokenizes with the configured tokenizer and splits off validation.
// Throws std::runtime_error naming the key or file for an empty corpus, an empty split, or a split
// too small for one validation batch of seq_len + 1 tokens.
TokenDataset build_dataset(const RunConfig& cfg);

// splitmix64: the seeded hash used for splits and shuffles.
uint64_t mix64(uint64_t x);

}  // namespace trainer::data

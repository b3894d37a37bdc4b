// The training data loader: opens the configured sources, splits off validation, and runs the
// packer on its own thread (with data.loader_threads producer threads reading and tokenizing
// ahead) into a bounded queue of ready batches — pinned host tensors when CUDA is present — so the
// step loop only ever pops. Its position (PackerState text) goes into every checkpoint; a loader
// built from that text yields exactly the batches the uninterrupted run would have seen next.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/api.h"

namespace trainer::data {

struct Batch {
  torch::Tensor inputs;      // [B,T] int64
  torch::Tensor labels;      // [B,T] int64, -1 = ignored
  torch::Tensor cu_seqlens;  // [pieces+1] int32 over the flattened B*T tokens; undefined when
                             // data.document_attention is off
  int64_t max_seqlen = 0;
  int64_t pieces = 0;        // document pieces in the batch
  int64_t ignored_labels = 0;
  std::string state_after;   // the loader position after this batch (checkpoint text)
};

struct LoaderStats {
  int64_t train_documents = 0, val_documents = 0;
  int64_t val_tokens = 0;    // tokens in the validation batches
  // Set when a resume's saved position was taken over other training documents than these (files
  // added, removed or resized, data.val or the seed changed): says what the resumed run does then.
  std::string resume_note;
};

class Loader {
 public:
  // Opens and indexes every source (errors name the key, file and byte offset), builds the
  // validation batches, and starts the threads. resume_state: a Batch::state_after from a
  // checkpoint, or empty to start at the beginning. Throws std::runtime_error before any thread
  // starts when the data cannot be used. Worker thread of the run.
  Loader(const RunConfig& cfg, int64_t rank, int64_t world, const std::string& resume_state);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next training batch; blocks until ready and adds the seconds it waited to *wait_s.
  // Rethrows an error the producers met (naming file and offset). Step-loop thread only.
  Batch next(double* wait_s);
  // Ready batches in the queue right now.
  int64_t queue_depth() const;
  // Fixed validation batches (train.batch_size rows of train.seq_len, the last possibly fewer).
  const std::vector<Batch>& validation() const;
  const LoaderStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::data

// The fixed device tensors a captured CUDA-graph step reads its micro-batch from (trainer/step_graph.h):
// tokens, labels and the positions. Every replay reads the same addresses, so each batch is copied
// in before the replay. Packed batches (data.document_attention) carry document boundaries; their
// cu_seqlens are padded to a fixed number of pieces with empty documents at the end (the flash
// kernel does nothing for an empty one) and the longest document is taken as the row length, so the
// attention kernels see one shape whatever the batch's documents are. The Gated DeltaNet layers'
// chunk plans are made for each batch at a fixed capacity into fixed device buffers
// (model/gdr_plan_slots.h), so the delta rule's kernels too see one shape.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "model/layers.h"
#include "trainer/data/loader.h"

namespace trainer {

class GraphInputs {
 public:
  // For [B,T] batches on `device`; packed: room for up to max_pieces document pieces (B ≤ max_pieces).
  GraphInputs(int64_t B, int64_t T, bool packed, int64_t max_pieces, const c10::Device& device);

  // Copies the batch in, asynchronously from its pinned host tensors. Returns false when its
  // positions do not fit (more pieces than the room); its tokens and labels are copied anyway. Throws
  // std::runtime_error for a batch of another shape, or packed-ness other than the inputs'.
  bool take(const data::Batch& b);

  const torch::Tensor& tokens() const { return tokens_; }
  const torch::Tensor& labels() const { return labels_; }
  const model::Positions& positions() const { return positions_; }
  int64_t max_pieces() const { return max_pieces_; }

 private:
  int64_t B_, T_, max_pieces_;
  bool packed_;
  torch::Tensor tokens_, labels_;
  model::Positions positions_;
};

// The room for document pieces of [B,T] packed batches when train.cuda_graph_pieces is 0, from the
// first micro-batch's piece count: half as much again, at least two pieces per row, rounded up to a
// multiple of 8. Each empty piece costs the attention kernels a little (on one H100 at B=16, T=1024:
// room 32 was 3% faster than eager, room 272 1% slower; docs/perf.md), so the room follows the data.
int64_t graph_piece_room(int64_t B, int64_t first_pieces);

}  // namespace trainer

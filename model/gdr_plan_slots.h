// The delta rule's chunk plans for packed batches at fixed device addresses, so that a training
// step with Gated DeltaNet layers can be captured as a CUDA graph (trainer/graph_inputs.h). The
// chunked rule plans each packed row on the host (model/gdr_chunk_layout.h), and its sizes follow
// the batch's documents; here every batch gets the same sizes (gdr_chunk_layout_fixed at the
// capacity of the graph's padded cu_seqlens) and its tables are copied into the same device
// buffers, before the step runs, where the captured kernels read them.
//
// One object per set of graph inputs; set_batch and layout run on the thread that runs the step.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "model/gdr_chunk_layout.h"

namespace model {

class GdrPlanSlots {
 public:
  // For packed batches of B rows of T tokens in at most max_pieces pieces, on `device`.
  GdrPlanSlots(int64_t B, int64_t T, int64_t max_pieces, const torch::Device& device);

  // The next batch's cu_seqlens (int64 on the CPU over the B·T flattened tokens, padded with empty
  // pieces at the end): every chunk size asked for so far is planned for it and its tables copied
  // into their buffers (asynchronously, on the current stream). Throws c10::Error, naming why, for
  // a batch that does not fit (more pieces than the room: the caller checks that first), and then
  // leaves every plan on the previous batch.
  void set_batch(const torch::Tensor& cu_seqlens);

  // The plan of the current batch for chunk size C and H heads, with its device tables in this
  // object's buffers (GdrChunkLayout::fixed, and its token_rows for H). A chunk size or head count
  // seen for the first time is planned now, which may not happen during a graph capture (the
  // warm-up steps before it ask first).
  GdrChunkLayout layout(int64_t H, int64_t C);

  int64_t tokens() const { return B_ * T_; }

 private:
  struct Slot {
    int64_t C = 0;
    GdrLayoutCapacity cap;
    GdrChunkLayout host;  // the current batch's plan (token_slot on the CPU)
    torch::Tensor token_slot, table, step_off, doc_chunks, doc_slot;  // device buffers
    // For each head count asked for so far: gdr_chunk_token_rows's map ([B·T, heads] int32) and the
    // rows it leaves out (GdrChunkLayout::pad_rows, and as row_map's −1), device buffers refilled
    // from the host plan with the tables above.
    struct HeadMaps {
      int64_t heads = 0;
      torch::Tensor rows, pad_rows, row_map;
    };
    std::vector<HeadMaps> maps;
  };
  GdrChunkLayout plan(const Slot& s, const torch::Tensor& cu) const;  // the host plan of cu at s's capacity
  void upload(Slot& s, GdrChunkLayout host);  // host becomes s's plan; its tables go into s's buffers

  int64_t B_, T_, max_pieces_;
  torch::Device device_;
  torch::Tensor cu_;
  std::vector<Slot> slots_;
};

}  // namespace model

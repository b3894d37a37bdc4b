// Where each chunk of the chunked gated delta rule lives (MODEL.md §4, "Varlen"): every chunk of
// every document is one entry of a list ordered *step-major* — all documents' chunk 0, then all
// chunk 1, ... — with documents sorted by chunk count (descending). The documents still running at
// scan step m are then a prefix of the state tensor and their chunks a contiguous range of the
// list, so the sequential scan only narrows views (no per-step gather), dense and packed batches
// share one code path, and a finished document's final state is split off as the prefix shrinks.
// Padding rows (past a document's end) hold q = k = v = β = g = 0, which is exact.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "model/gdr_scan.h"

namespace model {

struct GdrChunkLayout {
  GdrScanPlan scan;                 // n_docs (documents, or dense rows), heads, per-step counts and offsets
  int64_t B = 0, T = 0, C = 0;      // the token layout [B, T] and the chunk size
  int64_t n_chunks = 0;             // N, the length of the list
  std::vector<int64_t> order;       // sorted position -> document index (varlen only)
  torch::Tensor token_slot;         // varlen only: [T] int64, row of token t in the [N·C] list, on the inputs' device
  std::vector<int32_t> chunk_start;  // [N] first token of each chunk in the flattened [B·T] axis
  std::vector<int32_t> chunk_len;    // [N] its length, 1..C
};

// The layout of a dense batch (cu_seqlens undefined) or one packed row (int64 CPU cu_seqlens
// [n_docs+1], B == 1). Bad cu_seqlens throw c10::Error naming the entry. Any thread.
GdrChunkLayout gdr_chunk_layout(int64_t B, int64_t T, int64_t H, int64_t C, const torch::Tensor& cu_seqlens,
                                const torch::Device& device);

// x [B,T,H,D] -> [N,H,C,D] contiguous in dtype dt (one copy, the cast folded in); differentiable.
torch::Tensor gdr_gather_chunks(const torch::Tensor& x, const GdrChunkLayout& l, torch::ScalarType dt);
// The inverse for outputs: o [N,H,C,D] -> [B,T,H,D] (padding rows dropped); differentiable.
torch::Tensor gdr_scatter_chunks(const torch::Tensor& o, const GdrChunkLayout& l);
// Where each (token, head) sits in an output [N,H,C,D] viewed as rows [N·H·C, D]: [B,T,H] int32 on
// `device` (the index gdr_scatter_chunks reads by, for consumers that read the rows in place).
torch::Tensor gdr_chunk_token_rows(const GdrChunkLayout& l, int64_t H, const torch::Device& device);
// The other way: for each row of [N·H·C, D], its row in the token layout [B·T·H, D] (token · H +
// head), or −1 for a padding row; int32 [N·H·C] on `device`. The last few maps are kept and
// returned again for the same chunk table, heads and device (callers must not write to them).
torch::Tensor gdr_chunk_row_targets(const GdrChunkLayout& l, int64_t H, const torch::Device& device);

}  // namespace model

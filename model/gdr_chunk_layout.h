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
  std::vector<int32_t> chunk_len;    // [N] its length, 1..C (0 for a fixed layout's spare chunks)
  // A fixed-capacity layout whose device tables sit at fixed addresses (model/gdr_plan_slots.h), so
  // a step captured as a CUDA graph reads each new batch's plan from them: its consumers read these
  // tables instead of making (or caching) device copies of the vectors above.
  bool fixed = false;
  torch::Tensor table;     // fixed only: [2, N] int32, chunk_start then chunk_len
  torch::Tensor doc_slot;  // fixed only: [n_docs] int64, sorted position of document i (inverse of order)
  // fixed only: [B·T, heads] int32, gdr_chunk_token_rows's map for scan.heads heads, worked out on
  // the host with the other tables (a step's layers read it: no index kernels in each layer).
  torch::Tensor token_rows;
  // fixed only: [N·heads·C − B·T·heads] int32, the rows of [N·heads·C, D] that token_rows does not
  // name (chunk padding), ascending: what the output norm's backward zeroes, with no pass that
  // marks the named rows in each layer.
  torch::Tensor pad_rows;
  // fixed only: [N·heads·C] int32, each of those rows' own index, or −1 for the padding rows: the
  // delta rule's backward reads its output's gradient through it (gdr_output_grad_row_map), so
  // that nobody has to zero the padding rows of that gradient.
  torch::Tensor row_map;
};

// The fixed capacity of packed rows' layouts (gdr_chunk_layout_fixed): `chunks` chunks, `docs`
// documents and `steps` scan steps, whatever the batch.
struct GdrLayoutCapacity {
  int64_t chunks = 0, docs = 0, steps = 0;
};
// The capacity that holds every packing of B rows of T tokens into at most `pieces` document
// pieces, each row boundary a cut (model::packed_positions): a row cut into p pieces has at most
// ceil(T/C) + p − 1 chunks, so chunks = B·ceil(T/C) + pieces − B; the spare chunks of a batch go to
// dummy documents of at most `steps` chunks each, and empty ones fill the rest of `docs`.
GdrLayoutCapacity gdr_layout_capacity(int64_t B, int64_t T, int64_t C, int64_t pieces);

// The layout of one packed row of `T` tokens (B == 1) at a fixed capacity: exactly cap.chunks
// chunks, cap.docs documents and cap.steps scan steps. cu_seqlens is int64 on the CPU and may end
// in empty pieces (padding); the documents come first in their order, then dummy documents of empty
// chunks (len 0: all padding rows, so their states stay zero) and empty documents (no chunks).
// The host plan (step_count, step_off) covers the steps that run; the device tables are left to the
// caller (table and doc_slot undefined, fixed false). Throws c10::Error when the batch does not fit.
GdrChunkLayout gdr_chunk_layout_fixed(int64_t T, int64_t H, int64_t C, const torch::Tensor& cu_seqlens,
                                      const GdrLayoutCapacity& cap, const torch::Device& device);

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

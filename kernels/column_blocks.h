// Fills a row-major matrix of 16-bit elements from column blocks: each block's rows (its own row
// stride) into its columns of every row, or zeros where a block has no source. For a fused
// product's output gradient assembled from its parts' gradients (model::mixed_linear_split's
// backward): ATen's strided copy_ into a column slice runs its generic element-by-element kernel,
// one launch a part (MLA's three parts at hybrid base: 31 µs a layer, docs/perf.md stop 89); this
// moves 16 bytes a thread where the block's columns allow, all blocks in one launch.
// Raw pointers, no torch; the reference is a copy_ (or zero_) into each block's column slice.
#pragma once

#include <cstdint>

namespace kernels {

#ifdef DD_HAVE_CUDA
// One column block of dst: columns [col, col + width) of every row, from src [N, width] (row
// stride src_ld, unit column stride), or zeros when src is nullptr.
struct ColumnBlock {
  const void* src = nullptr;
  int64_t src_ld = 0;
  int64_t col = 0;
  int64_t width = 0;
};
constexpr int kMaxColumnBlocks = 8;

// dst [N, ld] (16-bit elements, bf16 or fp16: only their bits are moved) gets blocks[0, n_blocks)
// (n_blocks ≤ kMaxColumnBlocks; the blocks' columns inside [0, ld), not checked); columns no block
// names are left as they are. One launch. Returns the cudaError_t of the launch (0 = success), or
// cudaErrorInvalidValue for more than kMaxColumnBlocks blocks.
int fill_column_blocks_16bit(void* dst, int64_t N, int64_t ld, const ColumnBlock* blocks, int n_blocks, void* stream);
#endif

}  // namespace kernels

// The inverse of a fused product's weight cast (kernels/weight_cast.h): its low-precision weight
// gradient [experts, Σ rows_i, C] (one GEMM's output over the concatenated blocks) split back into
// each weight's fp32 gradient [experts, rows_i, C], written or added, in one pass. For MoE experts
// this replaces autograd's chain behind the grouped GEMM: the split of gate|up's gradient, a cast of
// each part to fp32 (a strided copy) and the accumulation into .grad (one more read and write).
// Raw pointers, no torch; the reference is model/expert_product.cpp's ATen path.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct GradBlocks {
  static constexpr int kMax = 4;
  // [experts, rows[i], cols] each, contiguous fp32. All null: nothing is written, and the launch
  // only sums squares into square_partials (which must then be set): the clipping norm of gradients
  // the optimizer reads from the pieces themselves (model/expert_grads_in_pieces.h).
  float* dst[kMax] = {};
  int64_t rows[kMax] = {};
  bool add[kMax] = {};        // add into dst (gradient accumulation) instead of writing it
  int n = 0;                  // blocks used, 1..kMax
  int64_t cols = 0;           // C, shared by every block
  int64_t experts = 1;
  // When set (device memory, int32 [experts] each): src holds partial gradients in pieces (its first
  // dimension counts pieces, not experts; kernels/expert_grad_pieces.h), and expert e's gradient is
  // the fp32 sum of pieces piece_first[e] .. piece_first[e] + piece_count[e] − 1 (zero for none).
  const int32_t* piece_first = nullptr;
  const int32_t* piece_count = nullptr;
  // When set (device memory, fp64 [scatter_block_grads_grid(g), n]): block b of the launch writes
  // row b, the sum of squares of the values it wrote into each destination (the gradient as it now
  // stands, after any add). Their column sums are each weight's ‖grad‖², so the clipping norm need
  // not read these gradients again (model/grad_square_sums.h). Every row is written.
  double* square_partials = nullptr;
};

// The launch's block count (the rows of square_partials): one block per 2048 elements, at most
// 4096, at least 1.
inline int64_t scatter_block_grads_grid(const GradBlocks& g) {
  int64_t total = 0;
  for (int i = 0; i < g.n && i < GradBlocks::kMax; ++i) total += g.rows[i] * g.cols;
  total *= g.experts;
  const int64_t grid = (total + 2047) / 2048;
  return grid < 1 ? 1 : (grid > 4096 ? 4096 : grid);
}

#ifdef DD_HAVE_CUDA
// src [experts, Σ rows_i, cols] (or [pieces, Σ rows_i, cols]) contiguous in `src_dt` (BF16 or F16)
// into the blocks. Returns the
// cudaError_t of the launch (0 = success; cudaErrorInvalidValue for a bad block or expert count).
int scatter_block_grads(const void* src, DType src_dt, const GradBlocks& g, void* stream);
#endif

}  // namespace kernels

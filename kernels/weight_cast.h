// The fp32 weights of one linear product cast to bf16/fp16 in one launch: a plain layer's weight
// [rows, C], or the row blocks a fused product concatenates (q|k|v, gate|up) written one after the
// other into one [Σ rows_i, C] matrix. Before, a fused product's low-precision weight took two
// passes over the fp32 weights per step (the fp32 concatenation, then autocast's cast of it).
// Stacked experts (`experts` > 1, MoE weights [E, rows_i, C]) are concatenated per expert:
// [E, Σ rows_i, C], as the grouped gate|up product multiplies them.
// Raw pointers, no torch; the reference is torch::cat(blocks, -2).to(dtype) (model/mixed_linear.cpp).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct WeightBlocks {
  static constexpr int kMax = 4;
  const float* src[kMax] = {};  // [experts, rows[i], cols] each, contiguous
  int64_t rows[kMax] = {};
  int n = 0;                    // blocks used, 1..kMax
  int64_t cols = 0;             // C, shared by every block
  int64_t experts = 1;          // stacked matrices per block (1: plain weights)
};

#ifdef DD_HAVE_CUDA
// out [experts, Σ rows_i, cols] contiguous, dtype `out_dt` (BF16 or F16). Returns the cudaError_t
// of the launch (0 = success; cudaErrorInvalidValue for a bad block or expert count or an fp32 out_dt).
int cast_weight_blocks(void* out, DType out_dt, const WeightBlocks& w, void* stream);
#endif

}  // namespace kernels

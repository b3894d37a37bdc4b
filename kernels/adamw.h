// AdamW's update over many fp32 tensors in one launch (per up to kAdamWTensorsPerLaunch tensors):
// each block updates one chunk of one tensor, reading p, g, m, v once and writing p, m, v once, 16
// bytes per access. It replaces ATen's fused multi-tensor AdamW, which measured 2.3 TB/s on the
// GPT-124M step's 124M parameters (the H100's 3.35 TB/s would take 1.05 ms for its 28 bytes per
// parameter). The learning rate, the step count and the optional gradient divisor are read from
// device memory, so a CUDA graph of the update follows the schedule. The same math as
// torch.optim.AdamW; the reference is trainer/adamw.cpp's single-tensor path. Raw pointers, no torch.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct AdamWTensor {
  float* p = nullptr;        // [n] parameter
  const float* g = nullptr;  // [n] gradient
  float* m = nullptr;        // [n] first moment
  float* v = nullptr;        // [n] second moment
  int64_t n = 0;
  float weight_decay = 0;    // decoupled: p ← p · (1 − lr · weight_decay) before the step
  // Optional [n] copy of the updated p in shadow_dt (BF16 or F16, rounded to nearest even as a cast
  // rounds): the low-precision weight the next forward multiplies with (model/weight_shadow.h),
  // written here for 2 bytes a parameter instead of a cast's 6 in the forward.
  DType shadow_dt = DType::BF16;
  void* shadow = nullptr;
  // A shadow laid out in runs (an MoE expert's block of a stacked gate|up shadow, [E, Σ n_i, K]):
  // element j goes to (j / shadow_block) · shadow_stride + j % shadow_block. 0: contiguous. Runs
  // and stride that are multiples of 4 keep the kernel's 4-element vectors (which then never
  // straddle two runs); others are written element by element.
  int32_t shadow_block = 0;
  int32_t shadow_stride = 0;
};
// 64 bytes: a launch's table (kernels/adamw.cu) stays under the classic 4 KiB of kernel parameters.
static_assert(sizeof(AdamWTensor) == 64, "AdamWTensor grew: check the launch table's size");

constexpr int kAdamWTensorsPerLaunch = 56;

// A gradient that was never written to fp32: an MoE expert weight's rows of its product's 16-bit
// weight-gradient pieces [G, Σ n_i, K] (model/expert_grads_in_pieces.h). Element j of the weight
// (expert e = j / block, offset j % block) is the fp32 sum over pieces q = first[e] ..
// first[e] + count[e] − 1 of src[q · piece_stride + j % block], added in piece order as the
// scatter into .grad adds them (kernels/block_grads.h), so the update is the one that would have
// read the scattered fp32 gradient, bit for bit.
struct AdamWGradPieces {
  const void* src = nullptr;        // piece 0's first element of this weight's rows
  DType dt = DType::BF16;           // BF16 or F16
  int32_t block = 0;                // n_i · K: one expert's gradient
  int64_t piece_stride = 0;         // Σ n_i · K: between pieces
  const int32_t* first = nullptr;   // [experts] (device); null: piece e is expert e's whole gradient
  const int32_t* count = nullptr;
};

constexpr int kAdamWPiecesPerLaunch = 24;

#ifdef DD_HAVE_CUDA
// One AdamW step of every tensor: lr and step (fp32 count, ≥ 1) are device scalars; grad_divisor, a
// device scalar or nullptr, divides every gradient as it is read. Returns the cudaError_t of the
// launches (0 = success).
int adamw_update(const AdamWTensor* tensors, int count, const float* lr, const float* step, const float* grad_divisor,
                 float beta1, float beta2, float eps, void* stream);
// The same step for tensors whose gradients are read from pieces: grads[i] replaces tensors[i].g
// (which is ignored). cudaErrorInvalidValue for a bad dtype, block or stride.
int adamw_update_from_pieces(const AdamWTensor* tensors, const AdamWGradPieces* grads, int count, const float* lr,
                             const float* step, const float* grad_divisor, float beta1, float beta2, float eps,
                             void* stream);
#endif

}  // namespace kernels

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

#ifdef DD_HAVE_CUDA
// One AdamW step of every tensor: lr and step (fp32 count, ≥ 1) are device scalars; grad_divisor, a
// device scalar or nullptr, divides every gradient as it is read. Returns the cudaError_t of the
// launches (0 = success).
int adamw_update(const AdamWTensor* tensors, int count, const float* lr, const float* step, const float* grad_divisor,
                 float beta1, float beta2, float eps, void* stream);
#endif

}  // namespace kernels

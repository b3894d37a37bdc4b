// Muon's elementwise passes over many fp32 matrices in a few launches (trainer/muon.h), each
// reading and writing every array once:
//   momentum  m ← μ·m + g (rounded after the product and after the sum, as ATen's two foreach
//             passes do, so the momenta are theirs bit for bit), and the direction x = g + μ·m
//             (Nesterov) or m, rounded to x's dtype as it is stored (the Newton–Schulz stack's slice);
//   apply     w ← w·(1 − lr·wd) − lr·scale·u (u: the orthogonalised direction, in its dtype), and
//             the weight's 16-bit shadow (model/weight_shadow.h), if given, rounded from the new w.
// ATen's form of the same (foreach momenta, add_out into the stack, foreach decay, addcmul_ per
// matrix, a shadow copy) is the reference and the path for what these do not take; it made five
// passes where these make two, and its mixed-dtype kernels ran at a fraction of the bandwidth.
// The learning rate is a device scalar, so a CUDA graph of the update follows the schedule. Raw
// pointers, no torch.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

struct MuonMomentumTensor {
  float* m = nullptr;        // [n] momentum
  const float* g = nullptr;  // [n] gradient
  void* x = nullptr;         // [n] direction, in the launch's x dtype
  int64_t n = 0;
};

struct MuonApplyTensor {
  float* w = nullptr;        // [n] weight
  const void* u = nullptr;   // [n] orthogonalised direction, in the launch's u dtype
  int64_t n = 0;
  float scale = 1.f;         // sqrt(max(1, rows / cols))
  void* shadow = nullptr;    // [n] contiguous 16-bit copy of w (shadow_dt), or null
  DType shadow_dt = DType::BF16;
};

// 32 and 48 bytes: a launch's table (kernels/muon_update.cu) of kMuonTensorsPerLaunch of either
// stays under the classic 4 KiB of kernel parameters.
static_assert(sizeof(MuonMomentumTensor) == 32 && sizeof(MuonApplyTensor) == 48, "a table entry grew");
constexpr int kMuonTensorsPerLaunch = 48;
static_assert(kMuonTensorsPerLaunch * (48 + 4) + 8 < 4096, "a launch's table fits the kernel parameters");

#ifdef DD_HAVE_CUDA
// Both return the cudaError_t of the launches (0 = success); muon_apply cudaErrorInvalidValue for a
// shadow dtype other than BF16 or F16.
int muon_momentum(const MuonMomentumTensor* tensors, int count, float momentum, bool nesterov, DType x_dt,
                  void* stream);
// lr: a device fp32 scalar.
int muon_apply(const MuonApplyTensor* tensors, int count, const float* lr, float weight_decay, DType u_dt,
               void* stream);
#endif

}  // namespace kernels

// RMSNorm forward: out[n,:] = x[n,:] / sqrt(mean(x[n,:]²) + eps) * w. Raw pointers, no torch.
// The CUDA launcher exists only in CUDA builds (DD_HAVE_CUDA); the reference is always there.
#pragma once

#include <cstdint>

namespace kernels {

// Plain loops with double accumulators: the ground truth the kernel and the model are tested
// against. x, out [N,C]; w [C] or nullptr (weight-free). Any thread; cannot fail.
void rmsnorm_forward_ref(float* out, const float* x, const float* w, int64_t N, int64_t C, double eps);

#ifdef DD_HAVE_CUDA
// Device pointers; one block per row. Returns the cudaError_t of the launch (0 = success).
int rmsnorm_forward(float* out, const float* x, const float* w, int64_t N, int64_t C, float eps,
                    void* stream);
#endif

}  // namespace kernels

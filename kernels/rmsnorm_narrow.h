// RMSNorm without a residual add on narrow 16-bit rows (MLA's latent norms: 384 and 256 wide at
// hybrid base), four rows a warp: the forward and backward that kernels/rmsnorm_train.cu takes for
// such rows. Same formulas and arguments as add_rmsnorm_forward/backward (kernels/rmsnorm_train.h)
// with b, dh and db absent. Raw pointers, no torch. Used only through kernels/rmsnorm_train.cu.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kernels {

#ifdef DD_HAVE_CUDA
// The widest row the narrow kernels take, in elements.
constexpr int64_t kNarrowNormMaxC = 512;

// Whether rows of C in dtype dt without an add take the narrow kernels, before the pointers' and
// row strides' alignment is known: 16-bit, C a multiple of 8 and at most kNarrowNormMaxC.
bool narrow_norm_shape(DType dt, int64_t C);

// Rows of dw_partial the narrow backward writes for N rows (its grid).
int narrow_norm_backward_blocks(int64_t N);

// y [N, C] and x (rows x_ld apart) in dt; rstd [N] fp32; w fp32 or nullptr. Every pointer must be
// 16-byte aligned and x_ld a multiple of 8 (narrow_norm_aligned). Returns the cudaError_t.
int narrow_norm_forward(void* y, float* rstd, const void* x, DType dt, const float* w, int64_t N, int64_t C,
                        float eps, int64_t x_ld, void* stream);

// dx [N, C] contiguous, dy [N, C], h (rows h_ld apart) in dt; dw_partial [narrow_norm_backward_blocks(N), C]
// fp32, unused when w is nullptr. Same alignment as the forward.
int narrow_norm_backward(void* dx, float* dw_partial, const void* dy, const void* h, DType dt, const float* w,
                         const float* rstd, int64_t N, int64_t C, int64_t h_ld, void* stream);

// Whether these pointers and row stride allow the narrow kernels' 16-byte accesses.
bool narrow_norm_aligned(int64_t ld, const void* a, const void* b, const void* c);
#endif

}  // namespace kernels

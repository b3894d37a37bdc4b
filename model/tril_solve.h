// Solving (I + A) X = B for a batch of small unit lower-triangular systems (A strictly lower; its
// diagonal and upper triangle are ignored), as the chunked gated delta rule needs per chunk and head.
// On a GPU in fp32 with C ≤ 64 it forms T = (I + A)⁻¹ with one kernel (kernels/tril_inverse.h) and
// multiplies, X = T B; the backward is matmuls too (dA = −strict_lower(Tᵀ dT Tᵀ)). Elsewhere it is
// torch::linalg_solve_triangular, which is also the reference the kernel path is tested against.
#pragma once

#include <torch/types.h>

namespace model {

// A [..., C, C], B [..., C, n] -> X [..., C, n]. Differentiable in A and B.
torch::Tensor unit_lower_solve_reference(const torch::Tensor& A, const torch::Tensor& B);
torch::Tensor unit_lower_solve(const torch::Tensor& A, const torch::Tensor& B);

// T = (I + A)⁻¹ through the kernel (A fp32 on a GPU, C ≤ 64); differentiable in A.
torch::Tensor unit_lower_inverse(const torch::Tensor& A);

}  // namespace model

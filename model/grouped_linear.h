// A linear layer per group of rows, as mixture-of-experts layers need: x's rows are grouped by
// expert (rows[e] consecutive rows for expert e) and group e is multiplied by its own weight,
//   y_e = x_e · w_eᵀ,   x [M, K], w [E, N, K], y [M, N].
// On a GPU (bf16, fp16, fp32; x and w of one dtype) all groups run in one cuBLAS grouped GEMM,
// forward and both backward products (kernels/grouped_gemm.h); elsewhere, and as the reference
// it is tested against, a loop of matmuls over one split of x and one unbind of w (never per-group
// narrow/select, whose backward would zero-fill and add a whole-tensor gradient per group).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace model {

torch::Tensor grouped_linear_reference(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows);
torch::Tensor grouped_linear(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows);

}  // namespace model

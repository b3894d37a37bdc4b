// A linear layer per group of rows, as mixture-of-experts layers need: x's rows are grouped by
// expert (rows[e] consecutive rows for expert e) and group e is multiplied by its own weight,
//   y_e = x_e · w_eᵀ,   x [M, K], w [E, N, K], y [M, N].
// On a GPU (bf16, fp16, fp32; x and w of one dtype) all groups run in one cuBLAS grouped GEMM,
// forward and both backward products (kernels/grouped_gemm.h); elsewhere, and as the reference
// it is tested against, a loop of matmuls over one split of x and one unbind of w (never per-group
// narrow/select, whose backward would zero-fill and add a whole-tensor gradient per group).
//
// grouped_linear_offsets() is the same product with the groups given as device offsets instead of
// host counts, so nothing is read back to the host and a step using it can be a CUDA graph:
// bf16 on Hopper/Blackwell through ATen's CUTLASS grouped GEMM (at::_grouped_mm, forward and
// backward). grouped_linear_offsets_supported() says when it applies.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace model {

torch::Tensor grouped_linear_reference(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows);
torch::Tensor grouped_linear(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows);

// True when grouped_linear_offsets takes these operands: bf16 x and w on one sm90/sm100 GPU, K and
// N multiples of 8 (16-byte rows). On the device alone: no tensor data is read.
bool grouped_linear_offsets_supported(const torch::Tensor& x, const torch::Tensor& w);
// The same rule from the product's sizes and operand dtype, before any tensor exists (w [E,N,K]).
bool grouped_linear_offsets_supported(const c10::Device& device, c10::ScalarType dtype, int64_t N, int64_t K);
// Whether a GPU of this device index runs the device-offset grouped GEMM (sm90/sm100).
bool grouped_mm_device_ok(int device_index);
// offsets [E] int32 on x's device: offsets[e] is the end row of group e (the inclusive cumsum of
// the row counts; the last must be x's row count). Fails (TORCH_CHECK) where not supported.
torch::Tensor grouped_linear_offsets(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& offsets);

}  // namespace model

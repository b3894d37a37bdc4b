// FP8 matrix products for the linear layers (train.precision = "fp8"): activations and weights are
// quantised to float8 e4m3 with one scale per tensor taken from the current amax, gradients to e5m2,
// and the products run through at::_scaled_mm. Master weights stay fp32; outputs are bf16.
// The plain twin is at::linear under bf16 autocast; tests compare the two on the GPU.
#pragma once

#include <torch/types.h>

namespace model {

// Largest finite values of the two float8 formats.
constexpr double kFp8E4m3Max = 448.0;
constexpr double kFp8E5m2Max = 57344.0;

// Whether this GPU runs float8 matrix products (compute capability 8.9 or newer). False on the CPU.
bool fp8_supported(const torch::Device& device);

// x / scale cast to `fp8_type` with scale = amax(|x|) / fp8 max (1 when x is all zeros), so the
// largest value lands on the format's largest finite value. Returns (quantised, scale as a 0-dim
// fp32 tensor on x's device).
std::pair<torch::Tensor, torch::Tensor> quantize_fp8(const torch::Tensor& x, at::ScalarType fp8_type);

// An operand of the fp8 products: q [rows, cols] and, when asked for, its transpose qt [cols, rows]
// (both contiguous float8), with the per-tensor scale (0-dim fp32).
struct Fp8Operand {
  torch::Tensor q, qt, scale;
};
// quantize_fp8 of a 2-D x with unit column stride, plus its transpose when `transposed`. On a GPU
// through the fused kernels of kernels/fp8_quant.h (same bits as quantize_fp8), else quantize_fp8
// and a transposing copy.
Fp8Operand quantize_fp8_operand(const torch::Tensor& x, at::ScalarType fp8_type, bool transposed);

// y = x Wᵀ with both operands in e4m3; backward quantises the incoming gradient to e5m2.
// x [..., in] (any float dtype), weight [out, in] fp32; in, out and the token count must be
// multiples of 16 (fp8_linear_fits). Returns bf16 [..., out]. CUDA only.
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight);
bool fp8_linear_fits(const torch::Tensor& x, const torch::Tensor& weight);

// Tensors on `device` whose amax was inf or NaN since the last call (the only way a cast scaled by
// the current amax can saturate). Reads the device counter, so it synchronises.
int64_t take_fp8_saturations(const torch::Device& device);

}  // namespace model

// FP8 matrix products for the linear layers (train.precision = "fp8"): activations and weights are
// quantised to float8 e4m3 with one scale per tensor, gradients to e5m2, and the products run
// through at::_scaled_mm. Master weights stay fp32; outputs are bf16. The scales are delayed when
// the layer keeps an Fp8History (the models' layers do): each comes from the amaxes the same tensor
// had in the previous steps, with a margin, so quantising reads each tensor once; without one
// they come from the tensor's current amax (a pass of its own).
// The plain twin is at::linear under bf16 autocast; tests compare the two on the GPU.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8_quant.h"

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

// The output dtype an fp8 product writes for a result wanted in `wanted`: fp32 and fp16 as asked,
// bf16 otherwise (_scaled_mm's choices).
inline at::ScalarType fp8_product_dtype(at::ScalarType wanted) {
  return wanted == at::kFloat || wanted == at::kHalf ? wanted : at::kBFloat16;
}

// An operand of the fp8 products: q [rows, cols] and, when asked for, its transpose qt [cols, rows]
// (both contiguous float8), with the per-tensor scale (0-dim fp32).
struct Fp8Operand {
  torch::Tensor q, qt, scale;
};
// quantize_fp8 of a 2-D x with unit column stride, plus its transpose when `transposed`. On a GPU
// through the fused kernels of kernels/fp8_quant.h (same bits as quantize_fp8), else quantize_fp8
// and a transposing copy.
Fp8Operand quantize_fp8_operand(const torch::Tensor& x, at::ScalarType fp8_type, bool transposed);

// Delayed scaling's margin: the scale maps twice the largest recent amax onto the format's largest
// value, so an amax may double from one step to the next before values clip.
constexpr double kFp8DelayedMargin = 2.0;

// The delayed-scaling state of one fp8 product (a Linear, or the first Linear of a linear_cat
// group): amax records (kernels/fp8_quant.h) for its three quantised tensors.
struct Fp8History {
  enum Role : int64_t { kInput = 0, kWeight = 1, kGradient = 2 };
  torch::Tensor records;  // [3, kernels::kFp8RecordWords] fp32 on the device; undefined until first used
  torch::Tensor started;  // [3] bool on the CPU: the role was quantised once, so its history sets the scale
  // Creates the records (zeros) on `device` if they are not there yet.
  void ensure(const torch::Device& device);
  // Takes records saved in a checkpoint; a role whose history holds an amax counts as started.
  // Throws std::runtime_error naming `what` when the shape is not [3, kFp8RecordWords].
  void load(const torch::Tensor& saved, const torch::Device& device, const std::string& what);
};

// quantize_fp8_operand with delayed scaling on `h`'s record of `role` (created on x's device if
// needed): the role's first quantisation takes its scale from x's current amax, later ones from
// the history (max · kFp8DelayedMargin / fmax); x's amax then joins the history. On a GPU through
// kernels::fp8_quantize_delayed, else quantize_fp8_delayed_reference.
Fp8Operand quantize_fp8_operand_delayed(const torch::Tensor& x, at::ScalarType fp8_type, bool transposed,
                                        Fp8History& h, Fp8History::Role role);

// One delayed quantisation of a [rows, cols] value about to be launched by a quantising kernel on
// `like`'s device: the operand to fill (q, qt when `transposed`, and the scale, allocated), the
// role's record and the device's saturation counter as the kernels take them, and whether this is
// the role's first quantisation (now marked started). Shared by quantize_fp8_operand_delayed and
// the quantisers that compute what they quantise (model/fp8_swiglu_mlp.h); CUDA builds only.
struct Fp8DelayedLaunch {
  Fp8Operand operand;
  float* record = nullptr;
  unsigned long long* saturations = nullptr;
  float scale_per_amax = 0.f;
  bool from_current = false;
  bool e5m2 = false;
  void* stream = nullptr;
};
Fp8DelayedLaunch prepare_fp8_delayed(const torch::Tensor& like, int64_t rows, int64_t cols, at::ScalarType fp8_type,
                                     Fp8History& h, Fp8History::Role role, bool transposed = true);

// The ATen reference of one delayed quantisation on `record` ([kFp8RecordWords] fp32, updated in
// place as the kernel does): returns q and the scale, and counts a saturation (non-finite amax, or
// a delayed scale that clipped) on x's device like the kernels.
std::pair<torch::Tensor, torch::Tensor> quantize_fp8_delayed_reference(const torch::Tensor& x, at::ScalarType fp8_type,
                                                                       torch::Tensor record, bool from_current);

// y = x Wᵀ with both operands in e4m3; backward quantises the incoming gradient to e5m2.
// x [..., in] (any float dtype), weight [out, in] fp32; in, out and the token count must be
// multiples of 16 (fp8_linear_fits). Returns bf16 [..., out]. CUDA only. With `history`, the
// scales are delayed (Fp8History); without, each comes from its tensor's current amax.
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, Fp8History* history = nullptr);
bool fp8_linear_fits(const torch::Tensor& x, const torch::Tensor& weight);

// The same with W given as row blocks [W1; W2; ...] (projections that read the same x: q|k|v,
// gate|up), each [out_i, in]: one product over the concatenation, which with a history is never
// formed (quantize_fp8_rows_delayed reads the blocks where they are); each block's gradient is its
// rows of the one dW.
torch::Tensor fp8_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights, Fp8History* history);
bool fp8_linear_fits(const torch::Tensor& x, const std::vector<torch::Tensor>& weights);

// fp8_linear of row blocks, returning y's column blocks, one per weight ([..., out_i]; y whole for one
// weight): q|k|v from one product. Their gradients are quantised where they are, as one, instead of
// being concatenated first (quantize_fp8_cols_delayed).
std::vector<torch::Tensor> fp8_linear_split(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                                            Fp8History* history);

// quantize_fp8_operand_delayed (transposed) of the column-wise concatenation of `parts` (2-D, same
// row count, unit column stride), without forming it on a GPU (kernels::fp8_quantize_cols_delayed:
// one kernel dtype, at most kernels::kFp8MaxParts); elsewhere of torch::cat(parts, 1).
Fp8Operand quantize_fp8_cols_delayed(at::TensorList parts, at::ScalarType fp8_type, Fp8History& h,
                                     Fp8History::Role role);

// quantize_fp8_operand_delayed (transposed) of the row-wise concatenation of `parts` (2-D, same
// column count), without forming it on a GPU (kernels::fp8_quantize_rows_delayed: contiguous parts
// of one kernel dtype, at most kernels::kFp8MaxParts); elsewhere of torch::cat(parts).
Fp8Operand quantize_fp8_rows_delayed(at::TensorList parts, at::ScalarType fp8_type, Fp8History& h,
                                     Fp8History::Role role);

// `whole` split into consecutive row blocks of `part_rows` rows (views; `whole` itself for one).
std::vector<torch::Tensor> split_rows(const torch::Tensor& whole, const std::vector<int64_t>& part_rows);

// Quantisations on `device` since the last call whose amax was inf or NaN, or whose delayed scale
// was too small for their amax (values clipped to the format's largest). Reads the device counter,
// so it synchronises.
int64_t take_fp8_saturations(const torch::Device& device);

}  // namespace model

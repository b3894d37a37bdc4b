// Batched fp32 products for the fp32 cores (the gated delta rule's chunk math). On a GPU they run
// on tensor cores as split TF32 ("3×TF32", kernels/gemm_tf32x3.h): about 2⁻²¹ relative error per
// product, where an fp32 GEMM has 2⁻²⁴ and plain TF32 2⁻¹¹. Anywhere else, and for operand layouts
// the kernel does not take, they are ATen's fp32 bmm/baddbmm, which is also the reference the
// kernel is tested against. No autograd: the callers are hand-written backwards.
// Operands are fp32, or bf16 (the delta rule's intermediates under 16-bit training, model/gdr_scan.h,
// model/gdr_chunk_core.h): either or both of a product's operands, widened exactly, and the result
// is fp32. Beside a bf16 operand the kernel takes an fp32 one at TF32 accuracy (2⁻¹¹, below the
// bf16 operand's own 2⁻⁹ rounding; kernels/gemm_tf32x3.h), and two bf16 operands exactly; the ATen
// path computes in fp32.
#pragma once

#include <torch/types.h>

namespace model {

// alpha · a b for batches a [R, M, K] and b [R, K, N] (transposed views are fine).
// Returns a new contiguous [R, M, N]. Throws c10::Error on mismatched shapes.
torch::Tensor bmm_fp32(const torch::Tensor& a, const torch::Tensor& b, double alpha = 1.0);

// alpha · (a b + a2 b2) for batches a [R, M, K], b [R, K, N], a2 [R, M, K2], b2 [R, K2, N]: on a GPU
// one kernel pass over the output when both pairs' layouts fit it (kernels/gemm_tf32x3.h), else
// bmm_fp32 then bmm_fp32_accumulate. Returns a new contiguous [R, M, N]; with bf16_result in bf16, the
// fp32 sums rounded once (the kernel writes them so; elsewhere rounded after the fp32 result).
torch::Tensor bmm_fp32_sum(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& a2,
                           const torch::Tensor& b2, double alpha = 1.0, bool bf16_result = false);
// How many of bmm_fp32_sum's kernel launches wrote a bf16 result (for the tests).
int64_t bmm_fp32_bf16_result_launches();

// bmm_fp32_sum with its result's rows scattered into a new [n_rows, N]: row m of batch item i goes
// to row out_rows[i·M + m] (int32 [R·M] on a's device), and nowhere where that is −1. Every output
// row must be the target of exactly one result row (the rest of it is uninitialised). On a GPU the
// kernel writes each row where it belongs (the delta rule's output into token order, no copy).
torch::Tensor bmm_fp32_sum_scattered(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& a2,
                                     const torch::Tensor& b2, double alpha, const torch::Tensor& out_rows,
                                     int64_t n_rows);

// A batch [R, rows, D] gathered from the rows of a matrix src [n_src, D] (unit column stride): row r
// of item i is row map[i · rows + r] of src, and zeros where that entry is −1 (map int32 [R · rows]
// on src's device; every entry below n_src, which the GPU kernel does not check). The delta rule's backward reads its output gradient in token order so, by the
// output's row map (gdr_chunk_row_targets), instead of copying it into chunk rows first.
struct GatheredRows {
  torch::Tensor src, map;
  int64_t R = 0, rows = 0;
};
// The batch itself (a copy; the products below fall back on it where the kernel does not run).
torch::Tensor gathered(const GatheredRows& x);
// alpha · a b with a gathered ([R, M, K] = [R, rows, D]), b [R, K, N]: on a GPU the kernel reads a's
// rows where they are. Returns a new contiguous [R, M, N].
torch::Tensor bmm_fp32(const GatheredRows& a, const torch::Tensor& b, double alpha = 1.0);
// alpha · a b with a [R, M, K] and b gathered ([R, K, N] = [R, rows, D]).
torch::Tensor bmm_fp32(const torch::Tensor& a, const GatheredRows& b, double alpha = 1.0);

// out = alpha · a b + beta · out, in place on a contiguous fp32 `out` [R, M, N]; returns it.
torch::Tensor& bmm_fp32_accumulate(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, double alpha,
                                   double beta);

// Per-row dot products of two batches of one shape [R, ...]: out [R] = Σ a[r] ⊙ b[r] over all other
// dims, with no [R, ...] temporary; a and b fp32, or either or both bf16; out fp32. On a GPU one kernel
// (kernels/row_dot.h) for contiguous operands; elsewhere, or with the kernel off, the reference below.
torch::Tensor row_dot_fp32(const torch::Tensor& a, const torch::Tensor& b);
// The same as one batched product [R, 1, n] · [R, n, 1] in ATen (in fp32).
torch::Tensor row_dot_fp32_reference(const torch::Tensor& a, const torch::Tensor& b);

// The plain ATen product (TF32 off is the process's setting), for tests and measurements.
torch::Tensor bmm_fp32_reference(const torch::Tensor& a, const torch::Tensor& b, double alpha = 1.0);

// Turns the tensor-core path and the row-dot kernel off (false) or back on; for tests and before/after measurements.
// Any thread; takes effect at the next call.
void bmm_fp32_use_kernel(bool on);
// The tensor-core products in block tiles as wide as N takes (default, kernels::gemm_tf32x3_strips_for)
// or always 64 columns wide (false); for tests and before/after measurements. Any thread.
void bmm_fp32_wide_tiles(bool on);
// Products of two bf16 operands by bf16 mma (default) or TF32 mma on the widened values (false):
// exact products either way, fp32 sums in another order (kernels::GemmTf32x3Args::bf16_mma); for
// before/after measurements. Any thread.
void bmm_fp32_bf16_mma(bool on);

}  // namespace model

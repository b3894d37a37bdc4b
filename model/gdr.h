// The gated delta rule core of the Gated DeltaNet mixer (MODEL.md §4): the step-by-step reference
// recurrence and the chunkwise-parallel WY/UT form that trains. The chunked form is the one that
// runs; the reference is the ground truth every fast path (this one, and a future fused CUDA
// kernel) is tested against (tests/model/test_gdr.cpp).
//
// Device note: both functions run on whatever device the inputs live on (CPU or CUDA); the only
// host-side work is reading cu_seqlens (int64, on the CPU) to plan the chunk layout. The chunked
// form is one op with a hand-written backward (model/gdr_chunk_core.h): cuBLAS products around
// CUDA kernels for the gather, the gate math, the masks and the state scan on a GPU in fp32, and
// their ATen twins elsewhere; both are tested against gdr_forward_ref.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace model {

class GdrPlanSlots;

// L2Norm of q and k taken into the chunked rule's op (gdr_forward_chunked, gdr_chunk_core): with
// `on`, q and k come as the norm's inputs x and the op normalises them itself, y = x / sqrt(Σ x² +
// eps) over dk in `dtype` (model/fused_l2norm.h), and their gradients go back to x. Where the
// backward's tail kernel takes it (the 16-bit path at dk 96, dv 192: kernels::
// gdr_chunk_backward_tail_takes_norm) it writes those gradients directly, with no pass of the
// norm's own backward after it; elsewhere the norm's backward runs after the rule's.
struct GdrQkNorm {
  bool on = false;
  double eps = 1e-6;
  torch::ScalarType dtype = torch::kFloat32;
};

struct GdrOutput {
  torch::Tensor o;  // [B,T,H,dv] in the compute dtype; undefined when o_rows is returned instead
  torch::Tensor h;  // final state [B or n_docs, H, dk, dv] (key-major), compute dtype
  // gdr_forward_chunked with o_as_rows: o as the chunk layout's rows [M, dv] and o_row [B,T,H]
  // int32, the row of each (token, head) (gated_rms_norm_rows reads them in place). The rows are in
  // the compute dtype, or bf16 on the 16-bit path (model::gdr_bf16_output).
  torch::Tensor o_rows{}, o_row{};
  // With a fixed layout (model/gdr_plan_slots.h), the rows of o_rows o_row does not name
  // (GdrChunkLayout::pad_rows), for the output norm's backward to zero; else undefined. Or, where
  // the rule's backward reads o_rows' gradient through the layout's row map, which skips those rows
  // (gdr_output_grad_row_map), o_pad_rows_unread: nobody reads them, and nobody need zero them.
  torch::Tensor o_pad_rows{};
  bool o_pad_rows_unread = false;
};

// Inputs of both functions:
//   q, k [B,T,H,dk] (already L2-normalised), v [B,T,H,dv], beta, g [B,T,H] (g = log-decay ≤ 0).
//   h0: undefined (zeros), or [B,H,dk,dv] dense / [n_docs,H,dk,dv] varlen.
//   cu_seqlens: undefined (dense), or int64 CPU [n_docs+1] with B == 1 (packed row, MODEL.md §0).
// The compute dtype is fp64 when q is fp64 and fp32 otherwise; inputs are cast only when they are
// not in it already (MODEL.md §0: the whole core runs in fp32).
// Any thread may call them (pure functions of their inputs); bad shapes throw c10::Error.

// h = e^g h; h += k ⊗ β (v − hᵀk); o = scale · hᵀq, one token at a time per document.
// Differentiable through autograd (slow: tests and decoding only).
GdrOutput gdr_forward_ref(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& beta, const torch::Tensor& g, double scale, const torch::Tensor& h0,
                          const torch::Tensor& cu_seqlens);

// The chunkwise WY/UT form with chunk size `chunk`: all intra-chunk work batched over every chunk
// of every document and head, then one sequential scan over chunk index for the state. Chunks never
// straddle documents. Differentiable through autograd (saves the per-chunk entry states).
// tf32_scan: the state scan's kernel takes its products in plain TF32 (GdrScanPlan::tf32_products)
// and, on a GPU, keeps the chunk states and corrected values it saves in bf16 (bf16_states, unless
// switched off by gdr_bf16_states).
// o_as_rows: return o_rows and o_row instead of o, saving the copy into token order (and its
// gradient's copy back) for a consumer that reads rows by index, and that takes them in bf16 on
// the 16-bit path (model/gdr_chunk_core.h, bf16_output_ok: the Gated DeltaNet's output norm).
// slots: a packed row's plan at fixed device addresses (model/gdr_plan_slots.h, for steps captured
// as CUDA graphs; cu_seqlens is then its padded copy and no h0 is taken). h then covers the fixed
// layout's documents: the batch's first, in order, then its dummies' (zero) states.
// qk_norm: q and k are L2Norm's inputs, normalised here (GdrQkNorm).
// final_state: false leaves h undefined, for a caller that never reads it (a training forward): the
// states then stay in the scan's document order, with no reordering gather.
GdrOutput gdr_forward_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& beta, const torch::Tensor& g, double scale,
                              const torch::Tensor& h0, const torch::Tensor& cu_seqlens, int64_t chunk,
                              bool tf32_scan = false, bool o_as_rows = false, GdrPlanSlots* slots = nullptr,
                              bool final_state = true, const GdrQkNorm& qk_norm = {});

// Process-wide switch (default on), for benchmarks: whether the Gated DeltaNet layer takes the
// chunked rule's output as rows (o_as_rows, read in place by its output norm) or copied into token
// order.
void gdr_output_as_rows(bool on);
bool gdr_output_as_rows();

// Process-wide switch (default on), for benchmarks and tests: with o_as_rows and a fixed layout,
// the delta rule's backward reads the output's gradient through the layout's row map
// (GdrChunkLayout::row_map), skipping the chunk padding's rows, so that the output norm's backward
// leaves those rows of the gradient unwritten (GdrOutput::o_pad_rows_unread); off, it zeroes them
// by their list and the backward reads every row.
void gdr_output_grad_row_map(bool on);
bool gdr_output_grad_row_map();

// Process-wide switch (default on), for benchmarks: on a GPU under TF32 scan products with 16-bit
// activations (bf16 or fp16 training), the Gated DeltaNet layer's L2Norm emits q and k in the
// activations' dtype (computed in fp32, rounded once), which the delta rule's kernels stage as they
// come; off emits them in fp32.
void gdn_qk_in_activation_dtype(bool on);
bool gdn_qk_in_activation_dtype();

// Process-wide switch (default on), for benchmarks and tests: on a GPU the Gated DeltaNet layer
// hands q and k to the chunked rule before their L2Norm (GdrQkNorm), so that the backward's tail
// takes the norm's backward where it can; off runs the norm as an op of its own each way.
void gdn_l2norm_in_core(bool on);
bool gdn_l2norm_in_core();

// Process-wide switch (default on), for benchmarks and tests: where the Gated DeltaNet's input
// projections take mixed_linear (a GPU under 16-bit autocast inside the trainer's
// WeightGradInPlaceScope, not FP8), q|k|v|g and the gates' a|b come out of one GEMM each way (model::linear_cat_groups's one_product), not two: the a|b
// product's 12 columns cost three more passes over the layer's input or its gradient a step.
void gdn_gates_in_projection(bool on);
bool gdn_gates_in_projection();

// Process-wide switch (default on; it applies where gdn_output_weight_grad_beside_scan is −1; off
// to measure it, bench train --gdn-output-wgrad aside): the Gated DeltaNet's output projection keeps its weight-gradient GEMM on the backward's own stream
// (model::WeightGradsOnCallerStreamScope) instead of the second one, where it ran beside the gated
// norm's backward: 115 µs for the two side by side against 101 one after the other at hybrid base
// (docs/perf.md, stop 87). The same gradients either way.
void gdn_output_weight_grad_on_caller_stream(bool on);
bool gdn_output_weight_grad_on_caller_stream();
// Process-wide switch (default 0, on): ≥ 0, the Gated DeltaNet's output projection puts off its
// weight-gradient GEMM (model::WeightGradsDeferredScope) until the delta rule's backward launches
// its reverse scan and runs it on the second stream beside the scan, whose blocks (a document's
// head and half of dv each) end at different times with packed documents of different lengths: the
// GEMM takes the SMs they leave (docs/perf.md, stop 87); > 0 also has cuBLAS pick the GEMM's kernel for
// that many SMs (cublasSetSmCountTarget), to measure it. −1: where
// gdn_output_weight_grad_on_caller_stream says. The same gradients either way.
void gdn_output_weight_grad_beside_scan(int sms);
int gdn_output_weight_grad_beside_scan();

// What the scan's products should be for the config value model.gdn_scan_precision ("tf32",
// "fp32" or "auto") when the layer's matmuls run in `matmul_dtype`: "auto" is TF32 when they run in
// a 16-bit type (bf16 or fp8 training), where the products' 2⁻¹¹ is far below the inputs'
// rounding, and split TF32 in fp32 and fp64. Throws c10::Error for any other value.
bool gdr_scan_uses_tf32(const std::string& precision, torch::ScalarType matmul_dtype);

}  // namespace model

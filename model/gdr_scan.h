// The inter-chunk state scan of the chunked gated delta rule (model/gdr.cpp), split out so it has
// a fast path: on a GPU in fp32 it is one CUDA kernel each way (kernels/gdr_scan.h) instead of a
// few ATen launches per chunk step; elsewhere, and as the reference the kernel is tested against,
// it is the ATen loop gdr_scan_reference. Both are differentiable.
//
// Per step m of the plan, for the chunks still running (rows r = chunk · H + head):
//   h_in[r] = h;   v_new[r] = U[r] − W[r] h;   h = decay[r] · h + Kd[r]ᵀ v_new[r]
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace model {

// The step-major chunk list of model/gdr.cpp: at step m the first step_count[m] documents (in
// sorted order) are running and their chunks are step_off[m] + 0, 1, ...
struct GdrScanPlan {
  int64_t n_docs = 0;
  int64_t heads = 0;
  std::vector<int64_t> step_count;
  std::vector<int64_t> step_off;
  // The scan kernel's products in plain TF32 (one mma, about 2⁻¹¹ relative error per product, as
  // cuBLAS with TF32 allowed) instead of split TF32 (close to fp32): a faster scan for training in
  // bf16 or fp8 (kernels::GdrScanArgs::tf32x3). The ATen loop computes in fp32 either way.
  bool tf32_products = false;
  // With tf32_products, the kernel's h_in and v_new rounded to bf16 (the running state stays fp32,
  // h_final too): half the bytes the scan writes, the output products read and the backward keeps
  // and reads. Their consumers take bf16 operands (model/bmm_fp32.h). Only where the forward runs
  // on the tensor-core kernel (kernels::gdr_scan_takes_bf16_outputs); fp32 elsewhere.
  bool bf16_states = false;
  // The kernel's plan already on the device at fixed addresses (fixed layouts, model/gdr_plan_slots.h):
  // step offsets [steps] and per-document chunk counts [n_docs], int32. Undefined: made from the
  // vectors above. Documents may have no chunks (their final state is their initial one).
  torch::Tensor device_step_off, device_doc_chunks;
};

struct GdrScanResult {
  torch::Tensor h_in;     // [R, dk, dv]: the state each chunk starts from (fp32, or bf16: bf16_states)
  torch::Tensor v_new;    // [R, C, dv] (likewise)
  torch::Tensor h_final;  // [n_docs · H, dk, dv] in sorted document order
};

// W, Kd [R, C, dk], U [R, C, dv], decay [R], h0 [n_docs · H, dk, dv]; one dtype throughout.
GdrScanResult gdr_scan_reference(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& Kd,
                                 const torch::Tensor& decay, const torch::Tensor& h0, const GdrScanPlan& plan);
// Same result; through the kernel for fp32 CUDA tensors of sizes it takes (unless switched off),
// with h_in and v_new in bf16 where the plan asks for bf16_states and the kernel takes them.
// W, U and Kd may also come in bf16 (the chunk core's front writes them so under 16-bit training):
// the kernel reads them as they are where gdr_scan_takes_bf16_inputs (with bf16_states), and every
// other path widens them to fp32 first. h0 and decay are fp32; h0 undefined: zero states (made here
// as a tensor where the path needs one, not made where the kernel starts from zero itself, as
// gdr_scan_with_output's does). That bf16 form takes its products as
// bf16 mma by default (gdr_bf16_forward_scan_products below), so its results are close to, not the
// same bits as, those of fp32 tensors holding the same values.
GdrScanResult gdr_scan(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& Kd,
                       const torch::Tensor& decay, const torch::Tensor& h0, const GdrScanPlan& plan);

// gdr_scan's forward with the chunk output O = scale (P v_new + Qg h_in) [R, C, dv] taken in the
// same kernel, from the same bf16 v_new and h_in, rounded once to bf16 (in place of the separate
// product; docs/perf.md, issue 7, stop 56): where the warp-column forward scan runs (bf16 W, U, Kd,
// P [R, C, C] zero above its diagonal and Qg [R, C, dk], bf16 states and products, the kernel's
// sizes; kernels::gdr_scan_forward_output_width) and gdr_output_in_scan is on. Elsewhere O is left
// undefined; the scan's results are gdr_scan's either way (one launch). P and Qg contiguous. No
// autograd: for a caller's own forward (the chunk core), where the caller's backward takes over.
GdrScanResult gdr_scan_with_output(const torch::Tensor& W, const torch::Tensor& U, const torch::Tensor& Kd,
                                   const torch::Tensor& decay, const torch::Tensor& h0, const GdrScanPlan& plan,
                                   const torch::Tensor& P, const torch::Tensor& Qg, double scale, torch::Tensor& O);
// Process-wide switch (default on), for benchmarks and tests, and how many scans this process has
// launched that wrote the chunk output.
void gdr_output_in_scan(bool on);
int64_t gdr_scan_output_launches();

// Σ chunks / steps rounded up: the plan's documents' worth of full-length scans, which the
// kernel's automatic block width is picked for (kernels::GdrScanArgs::busy_docs); 0 without steps.
int64_t gdr_scan_busy_docs(const GdrScanPlan& plan);

// Whether the kernel reads bf16 W, U and Kd itself (forward) and bf16 W and Kd (backward) for a
// plan with these sizes on the current GPU: TF32 products on the tensor-core kernel, the same
// condition as its bf16 outputs. False without CUDA.
bool gdr_scan_takes_bf16_inputs(const GdrScanPlan& plan, int64_t C, int64_t dk, int64_t dv);

// The scan's backward without autograd, for callers with a hand-written backward
// (model/gdr_chunk_core.h): the same scan run in reverse on the gradients,
//   dh = dh_final;  for chunks in reverse: dh_next[r] = dh;  dU[r] = dVn[r] + Kd[r] dh;
//                                          dh = decay[r] · dh − W[r]ᵀ dU[r] + dHin[r]
// and dh0 is the last dh. d_hin and d_hfinal may be undefined (zero). Gradients of W, Kd and decay
// follow from the result: dW = −dU h_inᵀ, dKd = v_new dh_nextᵀ, ddecay = Σ h_in ⊙ dh_next.
struct GdrScanGrads {
  torch::Tensor dh_next;  // [R, dk, dv]: gradient of the state each chunk ends in
  torch::Tensor dU;       // [R, C, dv]
  torch::Tensor dh0;      // [n_docs · H, dk, dv] in sorted document order
};
GdrScanGrads gdr_scan_backward_reference(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& decay,
                                         const torch::Tensor& d_hin, const torch::Tensor& d_vnew,
                                         const torch::Tensor& d_hfinal, const GdrScanPlan& plan);
// Same result; through the kernel where gdr_scan would use it (W and Kd in bf16 too, as gdr_scan
// takes them; d_hin, d_vnew and d_hfinal are fp32).
GdrScanGrads gdr_scan_backward(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& decay,
                               const torch::Tensor& d_hin, const torch::Tensor& d_vnew, const torch::Tensor& d_hfinal,
                               const GdrScanPlan& plan);

// The scan's backward fed by the chunk output's gradient, for O = s (Qg h_in + Pm v_new) per chunk:
// the same result as gdr_scan_backward(W, Kd, decay, d_hin, d_vnew, d_hfinal, plan) with
//   d_hin = s Qgᵀ dO,   d_vnew = s Pmᵀ dO.
// On a GPU where gdr_scan_backward_takes_output_grad, one kernel takes both products inside the
// reverse scan (kernels::GdrScanArgs::dO) and returns dh_next in bf16 (rounded once from the fp32
// running state; dU and dh0 fp32); otherwise the two products (model/bmm_fp32.h), then
// gdr_scan_backward. dO holds the gradient's rows [n_rows, dv] (fp32, or bf16: the 16-bit path's,
// which the kernel's bf16 products read as it is and everything else widens): chunk row r·C + i is row dO_rows[r·C + i] (int32
// [R·C] on dO's device, −1 for zeros) or, with dO_rows undefined, row r·C + i. Pm [R, C, C] (zero
// above its diagonal, as the chunk core's P is), Qg [R, C, dk]. Mismatched shapes throw. With
// bf16_dU the kernel also writes dU rounded to bf16 (the fused backward's 16-bit mode,
// model::gdr_bf16_chunk_grads); off the kernel path dU is fp32 whatever bf16_dU says. With
// bf16_products the kernel takes its four products as bf16 mma where its sizes allow
// (kernels::GdrScanArgs::bf16_products, model::gdr_bf16_scan_products), the TF32 ones otherwise.
GdrScanGrads gdr_scan_backward_from_output_grad(const torch::Tensor& W, const torch::Tensor& Kd,
                                                const torch::Tensor& decay, const torch::Tensor& Pm,
                                                const torch::Tensor& Qg, const torch::Tensor& dO,
                                                const torch::Tensor& dO_rows, double scale,
                                                const torch::Tensor& d_hfinal, const GdrScanPlan& plan,
                                                bool bf16_dU = false, bool bf16_products = false);
// Whether gdr_scan_backward_from_output_grad runs its one kernel for these inputs: a GPU, the plan's
// TF32 products, W, Kd, Pm and Qg in bf16, dO fp32 or bf16, sizes the fused form's shared memory takes
// (kernels::gdr_scan_fused_width), and the switch below on. False without CUDA.
bool gdr_scan_backward_takes_output_grad(const torch::Tensor& W, const torch::Tensor& Kd, const torch::Tensor& Pm,
                                         const torch::Tensor& Qg, const torch::Tensor& dO, const GdrScanPlan& plan);
// Process-wide switch (default on) for benchmarks and tests: off, gdr_scan_backward_from_output_grad
// always takes the two products and then the scan.
void gdr_scan_fuse_output_grads(bool on);
// How many fused backward scans this process has launched (tests check the path was taken), and
// how many of them took bf16 products.
int64_t gdr_scan_fused_backward_launches();
int64_t gdr_scan_bf16_product_launches();
// How many of them read a bf16 dO as it is (kernels::GdrScanArgs::dO_bf16) rather than widened.
int64_t gdr_scan_bf16_output_grad_launches();

// Process-wide switch for benchmarks that time the kernel against the ATen loop (default on).
void gdr_scan_use_kernel(bool on);

// Process-wide switch (default on), for benchmarks and tests: whether the chunked rule asks for
// bf16_states when its scan runs with TF32 products (model.gdn_scan_precision tf32, or auto under
// 16-bit training); off keeps h_in and v_new in fp32.
void gdr_bf16_states(bool on);
bool gdr_bf16_states();

// Process-wide switch (default on), for benchmarks and tests: whether the forward scan of bf16
// inputs and states (the 16-bit training path) takes its two products as bf16 mma, the running
// state and the corrected values rounded to bf16 as operands (kernels::GdrScanArgs::bf16_products;
// sums and the state stay fp32); off, TF32 products. And how many forward scans this process has
// launched with bf16 products (tests check the path was taken).
void gdr_bf16_forward_scan_products(bool on);
int64_t gdr_scan_bf16_forward_launches();

// How many scan kernels this process has launched asking for each product mode (both directions;
// the FMA variants compute in fp32 whatever is asked), so a test or a benchmark can see which mode
// a training step's forward and backward ran in.
struct GdrScanLaunchCounts {
  int64_t split_tf32 = 0;
  int64_t tf32 = 0;
};
GdrScanLaunchCounts gdr_scan_launch_counts();

// Process-wide choice of the scan kernel, for tests and benchmarks that cover each
// (kernels::GdrScanVariant): 4 (default) tensor cores in the block width that spreads the blocks
// best over the GPU's SMs (kernels::gdr_scan_mma_width_for), else 1; 2, 3, 5, 6 tensor cores in
// blocks of 32, 64, 96, 128 columns (else 1); 1 fp32 FMA in 16-warp blocks; 0 the same in 8-warp
// blocks.
void gdr_scan_variant(int variant);

}  // namespace model

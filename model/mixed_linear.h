// A linear product in bf16/fp16 over fp32 weights, whose weight gradients go straight into the
// weights' fp32 .grad: the weight-gradient GEMM writes its fp32 result there (the first backward
// after the gradients were cleared) or adds it (gradient accumulation). Under autocast the same
// product made a bf16 weight gradient that autograd then cast to fp32 (one more pass over it) and,
// for a fused q|k|v or gate|up product, took out of the fp32 concatenation of the weights, which
// the forward had built (a pass) before casting it (another). Here the forward casts the fp32
// blocks straight into one low-precision matrix (kernels/weight_cast.h), and the backward's one
// GEMM lands the fused product's gradient in one fp32 buffer whose row blocks become the weights'
// .grad.
//
// The weights' gradients bypass autograd's accumulation: hooks on the weights do not see them and
// torch::autograd::grad() does not return them. So the layers take this path only inside a
// WeightGradInPlaceScope, which the trainer opens around its forward passes when nothing else
// reads the gradients on their way (one rank: no data-parallel gradient buckets).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace model {

// While alive, this thread's Linear layers and linear_cat products take mixed_linear where it
// applies (when `on`, and the process-wide switch below is on). Restores the previous state. Nests.
// `grad_stream`: their backward also runs the weight-gradient GEMMs on a second stream of the
// device (weight_grad_stream below), where they overlap the rest of the backward: nothing later in
// the backward reads a weight gradient, and those GEMMs' small outputs fill few of the SMs. The
// caller must then call join_weight_grad_stream after backward, before anything reads a gradient.
// `no_workspace`: the products' GEMMs (forward, input and weight gradients) run without cuBLAS's
// workspace (model/linear.h product), for a step captured as a CUDA graph: the kernels cuBLAS
// picks with its workspace each need a semaphore memset, a graph node with a gap on both sides
// (GPT-124M: about 130 a step); without it, kernels that need none. Eager steps keep the
// workspace: their memsets overlap the host's launches, and the split kernels are faster there.
class WeightGradInPlaceScope {
 public:
  explicit WeightGradInPlaceScope(bool on = true, bool grad_stream = false, bool no_workspace = false);
  ~WeightGradInPlaceScope();
  WeightGradInPlaceScope(const WeightGradInPlaceScope&) = delete;
  WeightGradInPlaceScope& operator=(const WeightGradInPlaceScope&) = delete;
  static bool active();
  // Whether this thread's products run their GEMMs without cuBLAS's workspace now (`no_workspace`
  // asked for, the scope active and the process-wide switch on). The LM head's loss reads it too.
  static bool without_workspace();

 private:
  bool was_active_, was_stream_, was_no_workspace_;
};

// While alive, this thread's products keep their weight-gradient GEMMs on the stream their backward
// runs on, even inside a scope that puts them on the second stream: for a product whose backward's
// next kernel loses more beside the GEMM than the GEMM gains there. Restores the previous state.
// Nests.
class WeightGradsOnCallerStreamScope {
 public:
  WeightGradsOnCallerStreamScope();
  ~WeightGradsOnCallerStreamScope();
  WeightGradsOnCallerStreamScope(const WeightGradsOnCallerStreamScope&) = delete;
  WeightGradsOnCallerStreamScope& operator=(const WeightGradsOnCallerStreamScope&) = delete;

 private:
  bool was_stream_;
};

// While alive, this thread's products on a GPU, inside a scope that puts their weight gradients on
// the second stream, put off their weight-gradient GEMMs: their backward queues them, and
// run_deferred_weight_grads starts them on the second stream after the point
// deferred_weight_grads_ready_here marked on the caller's stream. For a GEMM that fits beside a
// later kernel that leaves SMs idle (the Gated DeltaNet's output projection beside the delta rule's
// reverse scan, whose blocks end unevenly, model::gdn_output_weight_grad_beside_scan). join_weight_grad_stream starts any
// still queued first. Nests.
class WeightGradsDeferredScope {
 public:
  WeightGradsDeferredScope();
  ~WeightGradsDeferredScope();
  WeightGradsDeferredScope(const WeightGradsDeferredScope&) = delete;
  WeightGradsDeferredScope& operator=(const WeightGradsDeferredScope&) = delete;

 private:
  bool was_defer_;
};
// Marks the current stream's point the queued GEMMs of `device` wait for (nothing when none are
// queued).
void deferred_weight_grads_ready_here(const at::Device& device);
// Starts the queued GEMMs of `device` on its second stream, after the point marked (or, where none
// was, after everything queued so far on the current stream). `sms` > 0: cuBLAS picks its kernels
// for that many SMs (cublasSetSMCountTarget).
void run_deferred_weight_grads(const at::Device& device, int sms = 0);
// How many products' backwards have queued their weight-gradient GEMMs, for tests.
int64_t weight_grads_deferred();

// How many products' backwards have put their weight-gradient GEMMs on the second stream (one
// count a backward), for tests.
int64_t weight_grads_run_aside();

// Process-wide switch, on by default: off, scopes never activate and the products go through
// autocast and autograd as before (`bench train --weight-grads autograd`, to measure the change).
void weight_grads_in_place(bool on);

// Process-wide switch, on by default: off, scopes never put the weight-gradient GEMMs on the second
// stream (`bench train --weight-grad-stream off`, to measure it).
void weight_grad_stream(bool on);

// Process-wide switch, on by default: off, scopes never run the GEMMs without cuBLAS's workspace
// (`bench train --graph-gemms workspace`, to measure it).
void gemms_without_workspace(bool on);

// Makes the device's current stream wait for the weight-gradient GEMMs queued on its second
// stream since the last join (nothing when there are none). Call after backward, on the thread
// and stream that read the gradients next; captured into a CUDA graph like any stream wait.
void join_weight_grad_stream(const at::Device& device);

// Whether the product x · [W1; W2; ...]ᵀ takes mixed_linear here: inside an active scope, grad mode
// on, CUDA autocast on in bf16 or fp16, x on a GPU (fp32, bf16 or fp16) and every weight a 2-D fp32
// leaf of x's device that requires grad, with x.size(-1) columns.
bool mixed_linear_applies(const at::Tensor& x, at::TensorList weights);

// y [..., Σ out_i] = x [..., in] · [W1; W2; ...]ᵀ in `dtype` (bf16 or fp16), the weights'
// gradients written or added into their .grad in fp32 as described above; x's gradient flows back
// through autograd in x's dtype. Any device (on the CPU through ATen, the reference the GPU test
// compares with). Throws c10::Error on mismatched shapes.
at::Tensor mixed_linear(const at::Tensor& x, at::TensorList weights, at::ScalarType dtype);

// Several products of the same x as one op: group g takes the next group_sizes[g] weights and gives
// y_g = x · [W_g1; W_g2; ...]ᵀ, one output per group, each as mixed_linear's. x's gradient comes
// out once: each group's GEMM after the first adds into it in fp32 (one rounding), where separate
// mixed_linear calls would each make one and autograd would add them (a pass over x's gradient
// per extra call). For projections of one input that cannot share one product (their outputs need
// their own row strides). Throws c10::Error on group sizes that do not cover the weights.
std::vector<at::Tensor> mixed_linear_groups(const at::Tensor& x, at::TensorList weights,
                                            const std::vector<int64_t>& group_sizes, at::ScalarType dtype);

// One product of x with all the weights, y = x · [W1; W2; ...]ᵀ as mixed_linear's, handed out as
// consecutive column splits (split_sizes, adding up to the weights' rows): each output a view of
// its columns in the product's rows, whose width is the columns rounded up to 16 bytes on a GPU.
// For projections whose outputs' consumers read rows at any stride (the Gated DeltaNet's q|k|v|g
// and a|b): the narrow split's products would otherwise each be a GEMM of their own, a pass over x
// (or over x's gradient) apiece. The backward takes the splits' gradients as one matrix, in place
// where the first split's gradient already sits at the start of such rows in a buffer with room
// for the rest (counted by mixed_linear_split_gradients_in_place), and runs one GEMM for x's
// gradient and one for the weights'. An output that gets no gradient counts as zeros (its weights'
// gradients are written as zeros, where mixed_linear_groups leaves a group's untouched). Throws
// c10::Error on split sizes that do not cover the rows.
std::vector<at::Tensor> mixed_linear_split(const at::Tensor& x, at::TensorList weights,
                                           const std::vector<int64_t>& split_sizes, at::ScalarType dtype);
int64_t mixed_linear_split_gradients_in_place();
// How many mixed_linear_split products have run (forward), for tests.
int64_t mixed_linear_split_products();
// Process-wide switch, on by default: mixed_linear_split's backward writes its parts' gradients
// (and the zeros of parts without one and of the padding) into the product's gradient rows with one
// kernel (kernels/column_blocks.h); off, with a copy_ or zero_ a part (`bench train
// --split-gradients aten`, to measure it). And how many of those launches have run, for tests.
void split_gradient_columns_kernel(bool on);
int64_t split_gradient_columns_kernel_launches();

// [W1; W2; ...] [Σ out_i, in] cast to `dtype`: one kernel on a GPU for up to 4 contiguous fp32
// blocks, else torch::cat(weights).to(dtype) (the reference). Stacked experts' weights [E, out_i,
// in] (MoE) concatenate per expert: [E, Σ out_i, in], torch::cat(weights, 1).
at::Tensor cast_weight_blocks(at::TensorList weights, at::ScalarType dtype);
// The same written into `out` (contiguous, bf16 or fp16), for a kept buffer.
void cast_weight_blocks_into(at::Tensor& out, at::TensorList weights);

}  // namespace model

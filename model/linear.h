// A bias-free linear layer y = x Wᵀ whose product can run in FP8. Every projection of the models is
// one of these, so the fp8 precision mode switches them all with one scope (Fp8Scope) and the
// parameter layout stays the plain "weight" [out, in] of Linear.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <vector>

#include "model/fp8_linear.h"

namespace model {

class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out);
  // FP8 (fp8_linear) when this thread is inside an Fp8Scope and the shapes allow it; else at::linear
  // (which autocast, when on, runs in bf16/fp16).
  torch::Tensor forward(const torch::Tensor& x);
  // Kaiming-uniform like Linear; the models re-initialise per MODEL.md §7.
  void reset_parameters();
  torch::Tensor weight;  // [out, in]
  // FP8 delayed scaling's amax records for this layer's product (also for a linear_cat group it
  // leads); empty until the layer first runs in fp8. Checkpoints carry them (fp8_histories).
  Fp8History fp8;
};
TORCH_MODULE(Linear);

// y = x [W1; W2; ...]ᵀ: one matmul for projections that read the same input (q|k|v, gate|up),
// in FP8 under an Fp8Scope like LinearImpl::forward (with the first layer's Fp8History). FP8
// quantises the weights where they are; the plain product forms the concatenated weight per call
// (small next to the activations). Each part's gradient flows back to its own parameter. One matmul instead of several also means one gradient for x,
// not a sum of several.
torch::Tensor linear_cat(const torch::Tensor& x, const std::vector<Linear>& layers);

// linear_cat's output split per layer ([..., out_i] each). Its backward concatenates the parts'
// gradients (split's backward), except in FP8, where the product's backward quantises them where they
// are (fp8_linear_split).
std::vector<torch::Tensor> linear_cat_split(const torch::Tensor& x, const std::vector<Linear>& layers);

// linear_cat over each group of layers, all reading the same x: one output per group. Where the
// products take mixed_linear, one op (mixed_linear_groups) whose backward sums x's gradient inside
// its GEMMs; with `one_product` there, one GEMM for all the groups (mixed_linear_split), each
// output a view of its columns in the product's rows (for consumers that read rows at any stride).
// Else (FP8, CPU, no scope) one linear_cat per group, autograd adding their gradients.
std::vector<torch::Tensor> linear_cat_groups(const torch::Tensor& x, const std::vector<std::vector<Linear>>& groups,
                                             bool one_product = false);

// linear_cat_groups with one_product, its outputs cut at split_sizes (each group's columns in one
// or more consecutive splits, adding up to the group's rows) instead of one a group: where the
// products take mixed_linear, one GEMM each way whose outputs are views of their columns in the
// product's rows (mixed_linear_split), so that a group's output needs no further split (whose
// backward would concatenate its parts' gradients before the product's backward copied them in
// again); else linear_cat_groups's outputs split. Throws c10::Error on split sizes that do not
// fall on the groups' boundaries.
std::vector<torch::Tensor> linear_cat_columns(const torch::Tensor& x, const std::vector<std::vector<Linear>>& groups,
                                              const std::vector<int64_t>& split_sizes);

// Every Linear of `model` that has run in fp8, by module path, with its Fp8History.
std::vector<std::pair<std::string, Fp8History*>> fp8_histories(torch::nn::Module& model);

// c += aᵀ · b for a weight gradient summed over chunks: c [M,N] fp32, a [K,M], b [K,N]. On a GPU
// with bf16/fp16 a and b, one GEMM accumulates straight into c in fp32 (kernels/gemm_accumulate.h);
// elsewhere c += (aᵀ b) converted to c's dtype. Throws on a shape mismatch.
void add_at_b_(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b);
// add_at_b_ when `accumulate`, else c = aᵀ · b (c's old values never read: it may be uninitialised).
// `no_workspace`: on a GPU, cuBLAS runs the product without its workspace (kernels/gemm_accumulate.h
// gemm_rowmajor: no semaphore memsets, which a CUDA graph pays for).
void at_b_into_(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, bool accumulate,
                bool no_workspace = false);

// a [M, K] · b [K, N] (b_trans: b stored [N, K], the product a · bᵀ), a new [M, N] tensor of a's
// dtype: torch::mm, or on a GPU with `no_workspace`, bf16/fp16 contiguous operands, cuBLAS without
// its workspace as above.
torch::Tensor product(const torch::Tensor& a, const torch::Tensor& b, bool b_trans, bool no_workspace);
// product written into c [M, N] (a's dtype, rows contiguous: a row block of a larger matrix does), or
// with `accumulate` added to c's values (the GEMM's beta = 1: fp32 accumulation, one rounding).
void product_into(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, bool b_trans, bool no_workspace,
                  bool accumulate = false);

// While alive, this thread's Linear layers multiply in FP8 (train.precision = "fp8") when `on`, or
// not when !on; restores the previous mode after. Nests.
class Fp8Scope {
 public:
  explicit Fp8Scope(bool on = true);
  ~Fp8Scope();
  Fp8Scope(const Fp8Scope&) = delete;
  Fp8Scope& operator=(const Fp8Scope&) = delete;
  static bool active();

 private:
  bool was_active_;
};

}  // namespace model

#include "trainer/grad_clip.h"

#include <torch/torch.h>

#include <cmath>

#include "model/expert_grads_in_pieces.h"
#include "model/grad_square_sums.h"

namespace trainer {

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

namespace {

// Σ‖g‖² in fp64 on the gradients' device. On a GPU each tensor's norm is one fused multi-tensor
// kernel (a tree reduction, accurate to fp32 rounding); on the CPU the pairwise `sum` of squares.
at::Tensor sum_of_squares_read(const std::vector<at::Tensor>& grads) {
  if (grads.front().is_cuda()) {
    auto norms = torch::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat64);
    return norms.pow(2).sum();
  }
  std::vector<at::Tensor> sums;
  for (const auto& g : grads) sums.push_back(g.pow(2).sum().to(torch::kFloat64));
  return torch::stack(sums).sum();
}

// Σ‖g‖² over the params' gradients: the sums their producers recorded where still valid
// (model/grad_square_sums.h; those of gradients left in pieces for the optimizer among them), the
// other defined gradients read. Undefined when there are none.
at::Tensor sum_of_squares(const std::vector<at::Tensor>& params) {
  model::materialize_expert_grad_pieces_beside_grads(params);  // a gradient in two parts is summed first
  std::vector<at::Tensor> read, recorded;
  for (const auto& p : params) {
    auto s = model::recorded_grad_square_sum(p);
    if (s.defined()) recorded.push_back(s);
    else if (p.grad().defined()) read.push_back(p.grad());
  }
  at::Tensor total;
  if (!read.empty()) total = sum_of_squares_read(read);
  if (!recorded.empty()) {
    auto r = torch::stack(recorded).sum();
    total = total.defined() ? total + r : r;
  }
  return total;
}

}  // namespace

at::Tensor clip_grad_norm_async(const std::vector<at::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  // Gradients in pieces are not scaled here: their only reader divides them itself (the trainer
  // leaves them there only when clipping rides in AdamW's update). Write them to .grad first.
  model::materialize_expert_grad_pieces(params);
  auto grads = defined_grads(params);
  if (grads.empty()) return torch::zeros({}, torch::kFloat64);
  auto norm = sum_of_squares(params).sqrt();
  if (std::isfinite(max_norm)) {
    // min(1, max_norm / (norm + 1e-6)): multiplying by exactly 1 leaves a small gradient untouched.
    auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0).to(grads.front().scalar_type());
    at::_foreach_mul_(grads, coef);
  }
  return norm;
}

std::pair<at::Tensor, at::Tensor> grad_norm_and_clip_divisor_async(const std::vector<at::Tensor>& params,
                                                                   double max_norm) {
  torch::NoGradGuard no_grad;
  auto squares = sum_of_squares(params);
  if (!squares.defined()) return {torch::zeros({}, torch::kFloat64), at::Tensor()};
  auto norm = squares.sqrt();
  if (!std::isfinite(max_norm)) return {norm, at::Tensor()};
  // The same coefficient as clip_grad_norm_async; its reciprocal is exactly 1 when it is.
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0).to(torch::kFloat);
  return {norm, coef.reciprocal()};
}

double global_grad_norm(const std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  auto squares = sum_of_squares(params);
  if (!squares.defined()) return 0;
  return std::sqrt(squares.item<double>());
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  return clip_grad_norm_async(params, max_norm).item<double>();
}

}  // namespace trainer

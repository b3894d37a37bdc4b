#include "trainer/grad_clip.h"

#include <torch/torch.h>

#include <cmath>

namespace trainer {

double global_grad_norm(const std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  for (const auto& p : params)
    if (p.grad().defined()) sums.push_back(p.grad().pow(2).sum().to(torch::kFloat64));
  if (sums.empty()) return 0;
  return std::sqrt(torch::stack(sums).sum().item<double>());
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    torch::NoGradGuard no_grad;
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
  }
  return norm;
}

}  // namespace trainer

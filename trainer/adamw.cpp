#include "trainer/adamw.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace trainer {

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<bool> decay, AdamWOptions opt)
    : params_(std::move(named_params)), decay_(std::move(decay)), opt_(opt) {
  if (decay_.size() != params_.size()) throw std::invalid_argument("AdamW: one decay flag per parameter expected");
  for (const auto& [name, p] : params_) {
    exp_avg_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  }
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g = p.grad();
    if (!g.defined()) continue;
    // Same order of operations as torch.optim.AdamW (single-tensor path).
    if (decay_[i] && opt_.weight_decay != 0) p.mul_(1.0 - lr * opt_.weight_decay);
    exp_avg_[i].lerp_(g, 1.0 - opt_.beta1);
    exp_avg_sq_[i].mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    auto denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(opt_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].first, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].first, exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto* kind : {"exp_avg.", "exp_avg_sq."}) {
      const std::string key = kind + params_[i].first;
      auto it = by_name.find(key);
      if (it == by_name.end()) throw std::runtime_error("optimizer state: tensor '" + key + "' missing");
      auto& dst = std::string(kind) == "exp_avg." ? exp_avg_[i] : exp_avg_sq_[i];
      if (it->second.sizes() != dst.sizes()) {
        throw std::runtime_error("optimizer state: '" + key + "' has shape " + c10::str(it->second.sizes()) +
                                 ", the model needs " + c10::str(dst.sizes()));
      }
      dst.copy_(it->second);
    }
  }
  steps_ = steps;
}

}  // namespace trainer

// Newton–Schulz on the wide orientation (rows ≤ cols) keeps A = X·Xᵀ the small square.
#include "trainer/muon.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace trainer {

at::Tensor newton_schulz_orthogonalize(const at::Tensor& G, int64_t steps) {
  TORCH_CHECK(G.dim() == 2, "newton_schulz: expected a matrix, got ", G.sizes());
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = G.size(0) > G.size(1);
  auto X = tall ? G.t() : G;
  X = X / (X.norm() + 1e-7);
  for (int64_t i = 0; i < steps; ++i) {
    auto A = torch::matmul(X, X.t());
    auto B = b * A + c * torch::matmul(A, A);
    X = a * X + torch::matmul(B, X);
  }
  return tall ? X.t() : X;
}

Muon::Muon(std::vector<std::pair<std::string, at::Tensor>> params, MuonOptions opt)
    : params_(std::move(params)), opt_(opt) {
  for (const auto& [name, p] : params_) {
    if (p.dim() != 2) throw std::invalid_argument("muon: '" + name + "' is not a matrix; give it to AdamW");
    momentum_.push_back(torch::zeros_like(p));
  }
}

void Muon::step(double lr) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    auto g = p.grad();
    if (!g.defined()) continue;
    auto& m = momentum_[i];
    m.mul_(opt_.momentum).add_(g);
    auto dir = opt_.nesterov ? g.add(m, opt_.momentum) : m;
    auto u = newton_schulz_orthogonalize(dir, opt_.ns_steps);
    const double shape_scale = std::sqrt(std::max(1.0, static_cast<double>(p.size(0)) / static_cast<double>(p.size(1))));
    if (opt_.weight_decay > 0) p.mul_(1.0 - lr * opt_.weight_decay);
    p.add_(u, -lr * shape_scale);
  }
}

std::vector<std::pair<std::string, at::Tensor>> Muon::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back("muon_momentum." + params_[i].first, momentum_[i]);
  return out;
}

void Muon::load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = by_name.find("muon_momentum." + params_[i].first);
    if (it == by_name.end() || it->second.sizes() != momentum_[i].sizes())
      throw std::runtime_error("checkpoint: no usable 'muon_momentum." + params_[i].first + "'");
    momentum_[i].copy_(it->second);
  }
}

}  // namespace trainer

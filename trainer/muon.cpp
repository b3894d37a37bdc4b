// Newton–Schulz on the wide orientation (rows ≤ cols) keeps A = X·Xᵀ the small square. A stack of
// matrices runs as batched products over its first dimension, each matrix normalised by its own norm.
#include "trainer/muon.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace trainer {

at::Tensor newton_schulz_orthogonalize(const at::Tensor& G, int64_t steps) {
  TORCH_CHECK(G.dim() == 2 || G.dim() == 3, "newton_schulz: expected a matrix or a stack of them, got ",
              G.sizes());
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = G.size(-2) > G.size(-1);
  auto X = tall ? G.transpose(-2, -1) : G;
  // Each matrix of a stack by its own norm (a matrix by X.norm(), as before stacks were taken: the same bits).
  X = X.dim() == 2 ? X / (X.norm() + 1e-7)
                   : X / (torch::linalg_vector_norm(X, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) + 1e-7);
  for (int64_t i = 0; i < steps; ++i) {
    auto A = torch::matmul(X, X.transpose(-2, -1));
    auto B = b * A + c * torch::matmul(A, A);
    X = a * X + torch::matmul(B, X);
  }
  return tall ? X.transpose(-2, -1) : X;
}

Muon::Muon(std::vector<std::pair<std::string, at::Tensor>> params, MuonOptions opt)
    : params_(std::move(params)), opt_(opt) {
  for (const auto& [name, p] : params_) {
    if (p.dim() != 2 && p.dim() != 3)
      throw std::invalid_argument("muon: '" + name + "' is neither a matrix nor a stack of them; give it to AdamW");
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
    const double shape_scale =
        std::sqrt(std::max(1.0, static_cast<double>(p.size(-2)) / static_cast<double>(p.size(-1))));
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

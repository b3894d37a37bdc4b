// Newton–Schulz keeps A the small square: A = X·Xᵀ for a wide matrix (rows ≤ cols) and X ← B'·X; a
// tall one is iterated as it lies, from the right, A = Xᵀ·X and X ← X·B' (the wide form on Xᵀ,
// transposed back: B' is symmetric), so no transposed copy is made. A stack of matrices runs as
// batched products over its first dimension, each matrix normalised by its own norm.
#include "trainer/muon.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>

#include "model/weight_shadow.h"

namespace trainer {

at::Tensor newton_schulz_orthogonalize(const at::Tensor& G, int64_t steps) {
  TORCH_CHECK(G.dim() == 2 || G.dim() == 3, "newton_schulz: expected a matrix or a stack of them, got ",
              G.sizes());
  if (G.dim() == 2) return newton_schulz_orthogonalize(G.unsqueeze(0), steps).squeeze(0);  // a stack of one
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = G.size(-2) > G.size(-1);
  const auto Gc = G.contiguous();
  // Each matrix by its own norm.
  auto X = Gc / (torch::linalg_vector_norm(Gc, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) + 1e-7);
  for (int64_t i = 0; i < steps; ++i) {
    const auto A = tall ? torch::matmul(X.transpose(-2, -1), X) : torch::matmul(X, X.transpose(-2, -1));
    // B' = a·I + b·A + c·A²: b·A + c·A² in the GEMM's epilogue, then a on the diagonal, so that one
    // plain product gives a·X + (b·A + c·A²)·X. (An epilogue adding a·X would first copy X, the
    // large operand, into the product's output.)
    auto B = torch::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
    B.diagonal(0, -2, -1).add_(a);
    X = tall ? torch::matmul(X, B) : torch::matmul(B, X);
  }
  return X;
}

Muon::Muon(std::vector<std::pair<std::string, at::Tensor>> params, MuonOptions opt)
    : params_(std::move(params)), opt_(opt) {
  std::map<std::tuple<int64_t, int64_t, std::string>, size_t> group_of;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    if (p.dim() != 2 && p.dim() != 3)
      throw std::invalid_argument("muon: '" + name + "' is neither a matrix nor a stack of them; give it to AdamW");
    if (p.device() != params_.front().second.device())
      throw std::invalid_argument("muon: '" + name + "' is on " + p.device().str() + ", the others on " +
                                  params_.front().second.device().str() + " (one lr scalar serves them all)");
    momentum_.push_back(torch::zeros_like(p));
    const auto key = std::make_tuple(p.size(-2), p.size(-1), p.device().str() + " " + c10::toString(p.scalar_type()));
    auto [it, added] = group_of.emplace(key, same_size_.size());
    if (added) same_size_.emplace_back();
    same_size_[it->second].push_back(i);
  }
  if (!params_.empty()) lr_device_ = torch::zeros({}, params_.front().second.options().dtype(at::kFloat));
}

void Muon::step(double lr) {
  begin_step(lr);
  update();
}

void Muon::begin_step(double lr) {
  if (lr_device_.defined()) lr_device_.fill_(lr);
}

namespace {

// Matrices in a parameter: a stack's first size, or one.
int64_t matrices_of(const at::Tensor& p) { return p.dim() == 3 ? p.size(0) : 1; }

}  // namespace

void Muon::update(bool write_shadows) {
  torch::NoGradGuard no_grad;
  // Momenta of every matrix with a gradient, a few launches for them all.
  std::vector<bool> has_grad(params_.size(), false);
  std::vector<at::Tensor> grads, moms;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].second.grad();
    if (!g.defined()) continue;
    has_grad[i] = true;
    grads.push_back(g);
    moms.push_back(momentum_[i]);
  }
  if (grads.empty()) return;
  at::_foreach_mul_(moms, opt_.momentum);
  at::_foreach_add_(moms, grads);
  // w · (1 − lr·wd) and −lr, from the lr on the device.
  const at::Tensor keep = opt_.weight_decay > 0 ? 1.0 - lr_device_ * opt_.weight_decay : at::Tensor();
  const at::Tensor neg_lr = -lr_device_;
  for (const std::vector<size_t>& group : same_size_) {
    std::vector<size_t> members;
    int64_t count = 0;  // matrices in the group's stack
    for (size_t i : group) {
      if (!has_grad[i]) continue;
      members.push_back(i);
      count += matrices_of(params_[i].second);
    }
    if (members.empty()) continue;
    const auto& first_p = params_[members[0]].second;
    const int64_t rows = first_p.size(-2), cols = first_p.size(-1);
    // The directions (g + μ·m with Nesterov, else m) written straight into the group's stack
    // [Σ matrices, rows, cols] in the iteration's dtype, rounded as they are written: no fp32
    // directions, concatenation or cast of their own.
    auto X = torch::empty({count, rows, cols}, first_p.options().dtype(opt_.ns_dtype));
    int64_t first = 0;
    for (size_t i : members) {
      const auto& p = params_[i].second;
      const int64_t n = matrices_of(p);
      auto into = X.narrow(0, first, n);
      const auto m = momentum_[i].reshape({n, rows, cols});
      if (opt_.nesterov) at::add_out(into, p.grad().reshape({n, rows, cols}), m, opt_.momentum);
      else into.copy_(m);
      first += n;
    }
    const auto u = newton_schulz_orthogonalize(X, opt_.ns_steps);
    // rows / cols are the group's own: one scale for all its matrices.
    const double shape_scale = std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
    std::vector<at::Tensor> weights;
    for (size_t i : members) weights.push_back(params_[i].second);
    if (keep.defined()) at::_foreach_mul_(weights, keep);
    // w += scale · u · (−lr), u read in the iteration's dtype where it lies.
    first = 0;
    for (auto& w : weights) {
      w.addcmul_(u.narrow(0, first, matrices_of(w)).reshape(w.sizes()), neg_lr, shape_scale);
      first += matrices_of(w);
    }
    if (write_shadows) {
      std::vector<at::Tensor> shadows, shadowed;
      for (const auto& w : weights) {
        if (at::Tensor s = model::weight_shadow_of(w); s.defined()) {
          shadows.push_back(s);
          shadowed.push_back(w);
        }
      }
      if (!shadows.empty()) at::_foreach_copy_(shadows, shadowed);
    }
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

// Newton–Schulz keeps A the small square: A = X·Xᵀ for a wide matrix (rows ≤ cols) and X ← B'·X; a
// tall one is iterated as it lies, from the right, A = Xᵀ·X and X ← X·B' (the wide form on Xᵀ,
// transposed back: B' is symmetric), so no transposed copy is made. A stack of matrices runs as
// batched products over its first dimension, each matrix normalised by its own norm.
#include "trainer/muon.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>

#include "kernels/muon_update.h"
#include "model/kernel_dtype.h"
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

std::atomic<bool> own_kernels{true};
std::atomic<int64_t> kernel_updates{0};

// Matrices in a parameter: a stack's first size, or one.
int64_t matrices_of(const at::Tensor& p) { return p.dim() == 3 ? p.size(0) : 1; }

}  // namespace

// The matrices of one (rows, cols) group that have a gradient this step, and their stack.
struct Muon::GroupStep {
  std::vector<size_t> members;  // indexes of the parameters
  std::vector<int64_t> first;   // each member's first matrix in the stack
  int64_t rows = 0, cols = 0;
  at::Tensor X;                 // [Σ matrices, rows, cols], the directions in the iteration's dtype
  at::Tensor u;                 // the same, orthogonalised
};

void Muon::use_own_kernels(bool on) { own_kernels = on; }
int64_t Muon::kernel_updates_taken() { return kernel_updates; }

void Muon::update(bool write_shadows) {
  torch::NoGradGuard no_grad;
  std::vector<GroupStep> groups;
  for (const std::vector<size_t>& group : same_size_) {
    GroupStep gs;
    int64_t count = 0;
    for (size_t i : group) {
      if (!params_[i].second.grad().defined()) continue;
      gs.members.push_back(i);
      gs.first.push_back(count);
      count += matrices_of(params_[i].second);
    }
    if (gs.members.empty()) continue;
    const auto& p = params_[gs.members[0]].second;
    gs.rows = p.size(-2);
    gs.cols = p.size(-1);
    gs.X = torch::empty({count, gs.rows, gs.cols}, p.options().dtype(opt_.ns_dtype));
    groups.push_back(std::move(gs));
  }
  if (groups.empty()) return;
  const bool by_kernels = own_kernels && lr_device_.is_cuda() && momentum_and_directions_by_kernel(groups);
  if (!by_kernels) momentum_and_directions(groups);
  for (GroupStep& gs : groups) gs.u = newton_schulz_orthogonalize(gs.X, opt_.ns_steps);
  if (by_kernels && apply_by_kernel(groups)) ++kernel_updates;
  else apply(groups, write_shadows);
}

// ATen's form, the reference: the momenta through foreach kernels, then each matrix's direction
// (g + μ·m with Nesterov, else m) into its slice of the stack, rounded as it is written.
void Muon::momentum_and_directions(std::vector<GroupStep>& groups) {
  std::vector<at::Tensor> grads, moms;
  for (const GroupStep& gs : groups)
    for (size_t i : gs.members) {
      grads.push_back(params_[i].second.grad());
      moms.push_back(momentum_[i]);
    }
  at::_foreach_mul_(moms, opt_.momentum);
  at::_foreach_add_(moms, grads);
  for (GroupStep& gs : groups)
    for (size_t k = 0; k < gs.members.size(); ++k) {
      const size_t i = gs.members[k];
      const int64_t n = matrices_of(params_[i].second);
      auto into = gs.X.narrow(0, gs.first[k], n);
      const auto m = momentum_[i].reshape({n, gs.rows, gs.cols});
      if (opt_.nesterov) at::add_out(into, params_[i].second.grad().reshape({n, gs.rows, gs.cols}), m, opt_.momentum);
      else into.copy_(m);
    }
}

// ATen's form, the reference: w · (1 − lr·wd) by foreach, w += scale · u · (−lr) per matrix, and
// with write_shadows each weight's shadow copied from it.
void Muon::apply(const std::vector<GroupStep>& groups, bool write_shadows) {
  const at::Tensor keep = opt_.weight_decay > 0 ? 1.0 - lr_device_ * opt_.weight_decay : at::Tensor();
  const at::Tensor neg_lr = -lr_device_;
  std::vector<at::Tensor> shadows, shadowed;
  for (const GroupStep& gs : groups) {
    // rows / cols are the group's own: one scale for all its matrices.
    const double scale = std::sqrt(std::max(1.0, static_cast<double>(gs.rows) / static_cast<double>(gs.cols)));
    std::vector<at::Tensor> group_weights;
    for (size_t i : gs.members) group_weights.push_back(params_[i].second);
    if (keep.defined()) at::_foreach_mul_(group_weights, keep);
    for (size_t k = 0; k < gs.members.size(); ++k) {
      auto& w = params_[gs.members[k]].second;
      w.addcmul_(gs.u.narrow(0, gs.first[k], matrices_of(w)).reshape(w.sizes()), neg_lr, scale);
      if (!write_shadows) continue;
      if (at::Tensor s = model::weight_shadow_of(w); s.defined()) {
        shadows.push_back(s);
        shadowed.push_back(w);
      }
    }
  }
  if (!shadows.empty()) at::_foreach_copy_(shadows, shadowed);
}

// kernels/muon_update.h: the momenta and directions in one pass over every matrix. False, nothing
// launched, where a tensor does not suit it (not contiguous fp32).
bool Muon::momentum_and_directions_by_kernel(std::vector<GroupStep>& groups) {
#if defined(DD_HAVE_CUDA)
  kernels::DType x_dt;
  if (!model::kernel_dtype(opt_.ns_dtype, x_dt)) return false;
  std::vector<kernels::MuonMomentumTensor> table;
  for (GroupStep& gs : groups)
    for (size_t k = 0; k < gs.members.size(); ++k) {
      const size_t i = gs.members[k];
      const auto& p = params_[i].second;
      const auto& g = p.grad();
      auto& m = momentum_[i];
      if (g.scalar_type() != at::kFloat || !g.is_contiguous() || !m.is_contiguous() || g.device() != p.device())
        return false;
      kernels::MuonMomentumTensor t;
      t.m = m.data_ptr<float>();
      t.g = g.data_ptr<float>();
      t.x = gs.X.narrow(0, gs.first[k], matrices_of(p)).data_ptr();
      t.n = p.numel();
      table.push_back(t);
    }
  model::check_kernel_launch(kernels::muon_momentum(table.data(), static_cast<int>(table.size()),
                                                    static_cast<float>(opt_.momentum), opt_.nesterov, x_dt,
                                                    model::stream_of(lr_device_)),
                             "Muon's momenta");
  return true;
#else
  (void)groups;
  return false;
#endif
}

// kernels/muon_update.h: decay, update and shadow in one pass over every weight. The kernel writes
// the weights through raw pointers, which bump no version, so it writes every shadow there is,
// asked or not (as our AdamW does): the forward's check could not see them go stale. False,
// nothing launched, where a weight or shadow does not suit it (the experts' stacked shadows are
// laid out in runs); ATen's form then updates through versioned ops.
bool Muon::apply_by_kernel(const std::vector<GroupStep>& groups) {
#if defined(DD_HAVE_CUDA)
  kernels::DType u_dt = kernels::DType::F32;
  if (!model::kernel_dtype(opt_.ns_dtype, u_dt)) return false;
  std::vector<kernels::MuonApplyTensor> table;
  std::vector<at::Tensor> shadows;  // kept alive until the launch
  for (const GroupStep& gs : groups) {
    if (!gs.u.is_contiguous() || gs.u.scalar_type() != opt_.ns_dtype) return false;
    const double scale = std::sqrt(std::max(1.0, static_cast<double>(gs.rows) / static_cast<double>(gs.cols)));
    for (size_t k = 0; k < gs.members.size(); ++k) {
      auto& w = params_[gs.members[k]].second;
      if (w.scalar_type() != at::kFloat || !w.is_contiguous()) return false;
      kernels::MuonApplyTensor t;
      t.w = w.data_ptr<float>();
      t.u = gs.u.narrow(0, gs.first[k], matrices_of(w)).data_ptr();
      t.n = w.numel();
      t.scale = static_cast<float>(scale);
      if (at::Tensor s = model::weight_shadow_of(w); s.defined()) {
        if (!s.is_contiguous() || s.numel() != w.numel() || !model::kernel_dtype(s.scalar_type(), t.shadow_dt) ||
            t.shadow_dt == kernels::DType::F32)
          return false;
        t.shadow = s.data_ptr();
        shadows.push_back(s);
      }
      table.push_back(t);
    }
  }
  model::check_kernel_launch(kernels::muon_apply(table.data(), static_cast<int>(table.size()),
                                                 lr_device_.data_ptr<float>(), static_cast<float>(opt_.weight_decay),
                                                 u_dt, model::stream_of(lr_device_)),
                             "Muon's update");
  return true;
#else
  (void)groups;
  return false;
#endif
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

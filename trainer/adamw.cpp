#include "trainer/adamw.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>

#if defined(DD_HAVE_CUDA)
#include "kernels/adamw.h"
#include "model/kernel_dtype.h"
#endif

#include "model/expert_grads_in_pieces.h"
#include "model/weight_shadow.h"

namespace trainer {

namespace {
std::atomic<bool> own_kernel{true};
}  // namespace

void AdamW::use_own_kernel(bool on) { own_kernel = on; }

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<bool> decay, AdamWOptions opt)
    : params_(std::move(named_params)), decay_(std::move(decay)), opt_(opt) {
  if (decay_.size() != params_.size()) throw std::invalid_argument("AdamW: one decay flag per parameter expected");
  for (const auto& [name, p] : params_) {
    exp_avg_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  }
  fused_ = !params_.empty() && params_.front().second.is_cuda();
  if (fused_) {
    for (const auto& [name, p] : params_) {
      if (!p.is_cuda() || p.scalar_type() != at::kFloat || p.device() != params_.front().second.device())
        throw std::invalid_argument("AdamW: parameter '" + name + "' is not fp32 on " +
                                    params_.front().second.device().str() + " like the others");
    }
    lr_device_ = torch::zeros({}, params_.front().second.options());
    step_device_ = torch::zeros({}, params_.front().second.options());
  }
}

void AdamW::step(double lr, const at::Tensor& grad_divisor) {
  begin_step(lr);
  update(grad_divisor);
}

void AdamW::begin_step(double lr) {
  ++steps_;
  lr_ = lr;
  if (fused_) lr_device_.fill_(lr);
}

void AdamW::update(const at::Tensor& grad_divisor) {
  torch::NoGradGuard no_grad;
  if (fused_) return fused_update(grad_divisor);
  model::materialize_expert_grad_pieces(param_tensors());  // the written-out update reads .grad only
  const double lr = lr_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    const auto g = grad_divisor.defined() ? p.grad() / grad_divisor.to(p.grad().device()) : p.grad();
    // Same order of operations as torch.optim.AdamW (single-tensor path).
    if (decay_[i] && opt_.weight_decay != 0) p.mul_(1.0 - lr * opt_.weight_decay);
    exp_avg_[i].lerp_(g, 1.0 - opt_.beta1);
    exp_avg_sq_[i].mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    auto denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(opt_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

// Our kernel (kernels/adamw.h) where it takes the tensors, else torch.optim.AdamW(fused=True): one
// multi-tensor kernel per weight-decay group. Both read the step count (bias correction) after it
// goes up here and the lr from the device, so a replayed graph of this update follows the schedule.
// A divisor divides each gradient as the kernel reads it (ATen's kernel: its grad_scale).
void AdamW::fused_update(const at::Tensor& grad_divisor) {
  step_device_.add_(1.0);
  if (own_kernel && own_kernel_update(grad_divisor)) return;
  model::materialize_expert_grad_pieces(param_tensors());  // ATen's kernel reads .grad only
  for (bool with_decay : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, steps;
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& grad = params_[i].second.grad();
      if (decay_[i] != with_decay || !grad.defined()) continue;
      p.push_back(params_[i].second);
      g.push_back(grad);
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
      steps.push_back(step_device_);
    }
    if (p.empty()) continue;
    at::_fused_adamw_(p, g, m, v, {}, steps, lr_device_, opt_.beta1, opt_.beta2, with_decay ? opt_.weight_decay : 0.0,
                      opt_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      grad_divisor.defined() ? std::optional<at::Tensor>(grad_divisor) : std::nullopt);
  }
  // ATen's kernel does not write the weights' shadows (model/weight_shadow.h): recast them.
  model::invalidate_weight_shadows();
}

// Every parameter with a gradient in one table for kernels/adamw.h. Takes contiguous fp32 tensors
// only (false, nothing launched, otherwise).
bool AdamW::own_kernel_update(const at::Tensor& grad_divisor) {
#if defined(DD_HAVE_CUDA)
  // A gradient both in .grad and in pieces is summed into .grad first.
  model::materialize_expert_grad_pieces_beside_grads(param_tensors());
  std::vector<kernels::AdamWTensor> table, from_pieces;
  std::vector<kernels::AdamWGradPieces> pieces;  // from_pieces[i]'s gradient
  std::vector<at::Tensor> shadows;  // kept alive until the launch
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g = p.grad();
    // A gradient left in its product's bf16 pieces (model/expert_grads_in_pieces.h).
    const model::ExpertGradPieces* gp = g.defined() ? nullptr : model::expert_grad_pieces_of(p);
    if (!g.defined() && gp == nullptr) continue;
    if (gp != nullptr) {
      kernels::AdamWGradPieces src;
      const at::Tensor& all = gp->pieces;
      if (!all.is_contiguous() || all.device() != p.device() || !model::kernel_dtype(all.scalar_type(), src.dt) ||
          src.dt == kernels::DType::F32 || p.dim() != 3 || p.size(1) != gp->rows || p.size(2) != all.size(2) ||
          p.size(1) * p.size(2) >= (int64_t{1} << 31) ||
          p.size(0) != (gp->first.defined() ? gp->first.size(0) : all.size(0)))  // the kernel indexes first/pieces by expert
        return false;
      src.src = static_cast<const char*>(all.data_ptr()) + gp->row0 * all.size(2) * all.element_size();
      src.block = static_cast<int32_t>(p.size(1) * p.size(2));
      src.piece_stride = all.size(1) * all.size(2);
      if (gp->first.defined()) {
        src.first = gp->first.data_ptr<int32_t>();
        src.count = gp->count.data_ptr<int32_t>();
      }
      pieces.push_back(src);
    } else if (g.scalar_type() != at::kFloat || g.device() != p.device() || !g.is_contiguous() ||
               g.numel() != p.numel()) {
      return false;
    }
    if (!p.is_contiguous() || !exp_avg_[i].is_contiguous() || !exp_avg_sq_[i].is_contiguous()) return false;
    kernels::AdamWTensor t;
    t.p = p.data_ptr<float>();
    t.g = gp != nullptr ? nullptr : g.data_ptr<float>();
    t.m = exp_avg_[i].data_ptr<float>();
    t.v = exp_avg_sq_[i].data_ptr<float>();
    t.n = p.numel();
    t.weight_decay = decay_[i] ? static_cast<float>(opt_.weight_decay) : 0.f;
    // The kernel writes p's raw memory, which no version counter sees: it must also write the
    // weight's bf16/fp16 shadow, if it has one, or the next forward would multiply with stale values.
    const at::Tensor shadow = model::weight_shadow_of(p);
    if (shadow.defined()) {
      if (shadow.numel() != p.numel() || (shadow.scalar_type() != at::kBFloat16 && shadow.scalar_type() != at::kHalf))
        return false;
      if (!shadow.is_contiguous()) {
        // An expert's block of a stacked shadow [E, Σ n_i, K]: contiguous within each expert.
        const bool runs = shadow.dim() == 3 && shadow.sizes() == p.sizes() && shadow.stride(2) == 1 &&
                          shadow.stride(1) == shadow.size(2) && shadow.stride(0) < (int64_t{1} << 31);
        if (!runs) return false;
        t.shadow_block = static_cast<int32_t>(shadow.size(1) * shadow.size(2));
        t.shadow_stride = static_cast<int32_t>(shadow.stride(0));
      }
      t.shadow = shadow.data_ptr();
      t.shadow_dt = shadow.scalar_type() == at::kBFloat16 ? kernels::DType::BF16 : kernels::DType::F16;
      shadows.push_back(shadow);
    }
    (gp != nullptr ? from_pieces : table).push_back(t);
  }
  if (grad_divisor.defined() && (grad_divisor.scalar_type() != at::kFloat || grad_divisor.device() != lr_device_.device()))
    return false;
  const float* divisor = grad_divisor.defined() ? grad_divisor.data_ptr<float>() : nullptr;
  const auto b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2), eps = static_cast<float>(opt_.eps);
  // The pieces first: their launch validates its table before anything is updated.
  if (!from_pieces.empty())
    model::check_kernel_launch(
        kernels::adamw_update_from_pieces(from_pieces.data(), pieces.data(), static_cast<int>(from_pieces.size()),
                                          lr_device_.data_ptr<float>(), step_device_.data_ptr<float>(), divisor, b1, b2,
                                          eps, model::stream_of(lr_device_)),
        "AdamW update from gradient pieces");
  model::check_kernel_launch(kernels::adamw_update(table.data(), static_cast<int>(table.size()), lr_device_.data_ptr<float>(),
                                                   step_device_.data_ptr<float>(), divisor, b1, b2, eps,
                                                   model::stream_of(lr_device_)),
                             "AdamW update");
  return true;
#else
  (void)grad_divisor;
  return false;
#endif
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  model::forget_expert_grad_pieces(param_tensors());
}

std::vector<at::Tensor> AdamW::param_tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& [name, p] : params_) out.push_back(p);
  return out;
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
  if (step_device_.defined()) step_device_.fill_(static_cast<double>(steps));
}

}  // namespace trainer

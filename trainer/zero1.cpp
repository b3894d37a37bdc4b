#include "trainer/zero1.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "trainer/comm.h"

namespace trainer {

ShardedAdamW::ShardedAdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<bool> decay,
                           AdamWOptions opt, Communicator& comm)
    : params_(std::move(named_params)), opt_(opt), comm_(comm) {
  if (decay.size() != params_.size()) throw std::invalid_argument("ShardedAdamW: one decay flag per parameter");
  const int64_t world = comm_.world();
  std::vector<at::Tensor> masks;
  for (size_t i = 0; i < params_.size(); ++i) {
    total_ += params_[i].second.numel();
    masks.push_back(torch::full({params_[i].second.numel()}, decay[i] ? 1.0 : 0.0, params_[i].second.options()));
  }
  shard_ = (total_ + world - 1) / world;
  decay_mask_ = my_slice(masks);
  exp_avg_ = torch::zeros({shard_}, params_.front().second.options());
  exp_avg_sq_ = torch::zeros_like(exp_avg_);
}

at::Tensor ShardedAdamW::flatten(const std::vector<at::Tensor>& parts) const {
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  const int64_t pad = shard_ * comm_.world() - total_;
  if (pad > 0) flat.push_back(torch::zeros({pad}, parts.front().options()));
  return torch::cat(flat);
}

at::Tensor ShardedAdamW::my_slice(const std::vector<at::Tensor>& parts) const {
  const int64_t begin = comm_.rank() * shard_, end = begin + shard_;
  std::vector<at::Tensor> pieces;
  int64_t off = 0, got = 0;
  for (const auto& p : parts) {
    const int64_t lo = std::max(begin, off), hi = std::min(end, off + p.numel());
    if (lo < hi) {
      pieces.push_back(p.reshape({-1}).narrow(0, lo - off, hi - lo));
      got += hi - lo;
    }
    off += p.numel();
  }
  if (got < shard_) pieces.push_back(torch::zeros({shard_ - got}, parts.front().options()));
  return torch::cat(pieces);
}

void ShardedAdamW::unflatten(const at::Tensor& flat, std::vector<at::Tensor>& into) const {
  int64_t off = 0;
  for (auto& t : into) {
    t.copy_(flat.narrow(0, off, t.numel()).view_as(t));
    off += t.numel();
  }
}

ShardedAdamW::StepResult ShardedAdamW::step(double lr, double loss_scale, double max_norm, bool check_nonfinite) {
  torch::NoGradGuard no_grad;
  const int64_t world = comm_.world();
  std::vector<at::Tensor> grads;
  for (auto& [n, p] : params_) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  at::Tensor flat_grad = flatten(grads);
  at::Tensor g = torch::empty({shard_}, flat_grad.options());
  comm_.reduce_scatter_sum(g, flat_grad, "reduce-scattering gradients (ZeRO-1)");
  g.mul_(1.0 / (static_cast<double>(world) * loss_scale));
  StepResult r;
  if (check_nonfinite) {
    // One all-reduce carries both the inf/NaN count and the squared norm of every slice.
    at::Tensor stats = torch::stack({torch::logical_not(torch::isfinite(g)).sum().to(torch::kFloat64),
                                     g.pow(2).sum().to(torch::kFloat64)});
    std::vector<at::Tensor> st{stats};
    comm_.all_reduce_sum(st, "summing the gradient norm (ZeRO-1)");
    const at::Tensor host = st[0].to(torch::kCPU);  // the one read-back
    r.found_inf = host[0].item<double>() > 0;
    if (r.found_inf) {
      r.grad_norm = INFINITY;
      r.grad_norm_tensor = torch::full({}, INFINITY, g.options().dtype(torch::kFloat64));
      return r;
    }
    r.grad_norm = std::sqrt(host[1].item<double>());
    r.grad_norm_tensor = torch::full({}, r.grad_norm, g.options().dtype(torch::kFloat64));
    // As trainer::clip_grad_norm: scale by max_norm / (norm + 1e-6) when that is below 1.
    const double coef = max_norm / (r.grad_norm + 1e-6);
    if (coef < 1.0) g.mul_(coef);
  } else {
    std::vector<at::Tensor> st{g.pow(2).sum().to(torch::kFloat64).reshape({1})};
    comm_.all_reduce_sum(st, "summing the gradient norm (ZeRO-1)");
    r.grad_norm = NAN;
    r.grad_norm_tensor = st[0].sqrt().reshape({});
    // The same clip, its factor on the device: min(1, max_norm / (norm + 1e-6)), rounded to g's
    // dtype as the host's double factor is (a factor of 1 leaves g as it is).
    if (std::isfinite(max_norm)) {
      const at::Tensor max_t = torch::full({}, max_norm, r.grad_norm_tensor.options());  // a true division below
      g.mul_((max_t / (r.grad_norm_tensor + 1e-6)).clamp_max(1.0).to(g.scalar_type()));
    }
  }

  ++steps_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(steps_));
  std::vector<at::Tensor> live;
  for (auto& [n, p] : params_) live.push_back(p.detach());
  at::Tensor w = my_slice(live);
  // trainer::AdamW's order of operations, with the decay applied through the mask.
  if (opt_.weight_decay != 0) w.mul_(1.0 - lr * opt_.weight_decay * decay_mask_);
  exp_avg_.lerp_(g, 1.0 - opt_.beta1);
  exp_avg_sq_.mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
  auto denom = (exp_avg_sq_.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
  w.addcdiv_(exp_avg_, denom, -lr / bc1);
  at::Tensor flat_w = torch::empty({shard_ * world}, w.options());
  comm_.all_gather(flat_w, w, "all-gathering updated weights (ZeRO-1)");
  unflatten(flat_w, live);
  return r;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdamW::state_tensors() {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [kind, shard] : {std::make_pair("exp_avg.", exp_avg_), std::make_pair("exp_avg_sq.", exp_avg_sq_)}) {
    at::Tensor flat = torch::empty({shard_ * comm_.world()}, shard.options());
    comm_.all_gather(flat, shard, "gathering the optimizer state (ZeRO-1)");
    std::vector<at::Tensor> full;
    for (auto& [n, p] : params_) full.push_back(torch::empty_like(p));
    unflatten(flat, full);
    for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(kind + params_[i].first, full[i]);
  }
  return out;
}

void ShardedAdamW::load_state(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t steps) {
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  for (auto* kind : {"exp_avg.", "exp_avg_sq."}) {
    std::vector<at::Tensor> parts;
    for (auto& [n, p] : params_) {
      auto it = by_name.find(kind + n);
      if (it == by_name.end()) throw std::runtime_error(std::string("optimizer state: tensor '") + kind + n + "' missing");
      if (it->second.sizes() != p.sizes())
        throw std::runtime_error(std::string("optimizer state: '") + kind + n + "' has shape " +
                                 c10::str(it->second.sizes()) + ", the model needs " + c10::str(p.sizes()));
      parts.push_back(it->second.to(p.options()));
    }
    auto slice = my_slice(parts);
    (std::string(kind) == "exp_avg." ? exp_avg_ : exp_avg_sq_).copy_(slice);
  }
  steps_ = steps;
}

}  // namespace trainer

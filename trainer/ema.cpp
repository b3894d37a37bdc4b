// lerp_ does the whole update in one kernel per tensor: ema + (1−decay)·(w − ema).
#include "trainer/ema.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>

namespace trainer {

Ema::Ema(const NamedParams& params, double decay) : params_(params), decay_(decay) {
  if (!(decay >= 0 && decay < 1)) throw std::invalid_argument("train.ema_decay: must be in [0, 1)");
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params_) shadow_.push_back(p.detach().clone());
}

void Ema::update() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) shadow_[i].lerp_(params_[i].second.detach(), 1.0 - decay_);
}

void Ema::swap_all() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    // set_data exchanges which storage the parameter points at; nothing is copied.
    at::Tensor live = p.data();
    p.set_data(shadow_[i]);
    shadow_[i] = live;
  }
}

Ema::Swap::Swap(Ema& ema) : ema_(ema) { ema_.swap_all(); }

Ema::Swap::~Swap() { ema_.swap_all(); }

NamedParams Ema::state_tensors() const {
  NamedParams out;
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back("ema." + params_[i].first, shadow_[i]);
  return out;
}

void Ema::load_state(const NamedParams& tensors) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = by_name.find("ema." + params_[i].first);
    if (it == by_name.end()) throw std::runtime_error("checkpoint: no EMA tensor 'ema." + params_[i].first + "'");
    if (it->second.sizes() != shadow_[i].sizes())
      throw std::runtime_error("checkpoint: EMA tensor 'ema." + params_[i].first + "' has the wrong shape");
    shadow_[i].copy_(it->second);
  }
}

}  // namespace trainer

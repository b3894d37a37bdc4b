#include "model/linear.h"

#include <torch/torch.h>

#include <cmath>

#include "model/fp8_linear.h"

namespace model {

namespace {
thread_local bool fp8_active = false;
}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out) {
  weight = register_parameter("weight", torch::empty({out, in}));
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(weight.size(1)));
  weight.uniform_(-bound, bound);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (fp8_active && fp8_linear_fits(x, weight)) return fp8_linear(x, weight);
  return torch::linear(x, weight);
}

torch::Tensor linear_cat(const torch::Tensor& x, const std::vector<torch::Tensor>& weights) {
  auto w = weights.size() == 1 ? weights[0] : torch::cat(weights, 0);
  if (fp8_active && fp8_linear_fits(x, w)) return fp8_linear(x, w);
  return torch::linear(x, w);
}

Fp8Scope::Fp8Scope(bool on) : was_active_(fp8_active) { fp8_active = on; }
Fp8Scope::~Fp8Scope() { fp8_active = was_active_; }
bool Fp8Scope::active() { return fp8_active; }

}  // namespace model

// The scale lives on the host: it changes at most once per step, and keeping it there saves a
// device read. The finiteness check is accumulated on the device and read once.
#include "trainer/loss_scaler.h"

#include <torch/torch.h>

#include <stdexcept>

#include "trainer/grad_clip.h"

namespace trainer {

LossScaler::LossScaler(LossScalerOptions opt) : opt_(opt), scale_(opt.init_scale) {
  if (!(opt_.init_scale > 0) || !(opt_.growth_factor > 1) || !(opt_.backoff_factor > 0 && opt_.backoff_factor < 1) ||
      opt_.growth_interval < 1)
    throw std::invalid_argument("loss scaler: needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                                "growth_interval >= 1");
}

bool loss_scaling_enabled(const std::string& mode, const std::string& precision) {
  return mode == "dynamic" || (mode == "auto" && precision == "fp16");
}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const { return opt_.enabled ? loss * scale_ : loss; }

bool LossScaler::unscale_and_check(const std::vector<at::Tensor>& params) const {
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = defined_grads(params);
  if (grads.empty()) return false;
  // One pass multiplies by 1/scale and sets found_inf where a value is inf or NaN (before or after
  // the multiplication), as torch.amp.GradScaler does; per-tensor ATen checks were ~8 kernels each.
  auto f32 = grads.front().options().dtype(torch::kFloat);
  auto found_inf = torch::zeros({1}, f32);
  auto inv_scale = torch::full({1}, 1.0 / scale(), f32);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  return found_inf.item<float>() != 0.f;
}

void LossScaler::update(bool found_inf) {
  if (!opt_.enabled) return;
  if (found_inf) {
    scale_ *= opt_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
  } else if (++growth_tracker_ == opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    growth_tracker_ = 0;
  }
}

void LossScaler::load_state(const std::vector<double>& s) {
  if (s.size() != 3 || !(s[0] > 0)) throw std::runtime_error("loss scaler: bad saved state");
  scale_ = s[0];
  growth_tracker_ = static_cast<int64_t>(s[1]);
  skipped_ = static_cast<int64_t>(s[2]);
}

}  // namespace trainer

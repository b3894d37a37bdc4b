// Dynamic loss scaling with torch.amp.GradScaler's semantics: the loss is multiplied by `scale`
// before backward; before clipping the gradients are divided by it and checked; a step with any
// inf/NaN gradient is skipped and the scale halves; after `growth_interval` finite steps in a row
// the scale doubles. Disabled, the scale is 1 and nothing is ever skipped.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

// Whether train.loss_scaling = `mode` ("auto" | "dynamic" | "off") scales the loss at `precision`.
// "auto" scales fp16 only: fp16 gradients underflow without it, while bf16 has fp32's range and
// fp8's gradients reach the products in bf16 and are scaled per tensor (by their recent amaxes)
// when cast to e5m2, so a global loss scale changes nothing there but costs a check and blocks the CUDA graph.
bool loss_scaling_enabled(const std::string& mode, const std::string& precision);

struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions opt);
  bool enabled() const { return opt_.enabled; }
  double scale() const { return opt_.enabled ? scale_ : 1.0; }
  // loss × scale (the loss itself when disabled).
  at::Tensor scale_loss(const at::Tensor& loss) const;
  // Divides every defined gradient by the scale in place and reports whether any is not finite:
  // one fused multi-tensor pass over the gradients (ATen's GradScaler kernel), one host sync.
  // Disabled: checks only (the division is by 1). Step-loop thread.
  bool unscale_and_check(const std::vector<at::Tensor>& params) const;
  // After a step: found_inf halves the scale and counts a skipped step; otherwise counts a finite
  // step and doubles the scale every growth_interval of them. No-op when disabled.
  void update(bool found_inf);
  int64_t skipped_steps() const { return skipped_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // For checkpoints: scale, growth tracker and skipped steps, and back.
  std::vector<double> state() const { return {scale_, static_cast<double>(growth_tracker_), static_cast<double>(skipped_)}; }
  void load_state(const std::vector<double>& s);

 private:
  LossScalerOptions opt_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace trainer

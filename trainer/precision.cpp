#include "trainer/precision.h"

#include <ATen/autocast_mode.h>

#include <optional>

#include "model/linear.h"
#include "model/mixed_linear.h"

namespace trainer {

struct ForwardPrecision::State {
  bool autocast = false;
  c10::DeviceType type = c10::kCPU;
  bool was_enabled = false;
  at::ScalarType was_dtype = at::kBFloat16;
  std::optional<model::Fp8Scope> fp8;
  std::optional<model::WeightGradInPlaceScope> weight_grads;
};

ForwardPrecision::ForwardPrecision(const std::string& precision, const c10::Device& device,
                                   bool weight_grads_in_place, bool graph_step)
    : state_(std::make_unique<State>()) {
  if (precision == "fp32") return;
  State& s = *state_;
  s.autocast = true;
  s.type = device.type();
  s.was_enabled = at::autocast::is_autocast_enabled(s.type);
  s.was_dtype = at::autocast::get_autocast_dtype(s.type);
  at::autocast::set_autocast_enabled(s.type, true);
  at::autocast::set_autocast_dtype(s.type, precision == "fp16" ? at::kHalf : at::kBFloat16);
  at::autocast::increment_nesting();
  if (precision == "fp8") s.fp8.emplace(true);
  // The trainer joins the weight-gradient stream after every backward (train_loop.cpp).
  s.weight_grads.emplace(weight_grads_in_place, /*grad_stream=*/weight_grads_in_place, /*no_workspace=*/graph_step);
}

ForwardPrecision::~ForwardPrecision() {
  State& s = *state_;
  if (!s.autocast) return;
  s.weight_grads.reset();
  s.fp8.reset();
  // Leaving the outermost autocast region drops the cached low-precision weight copies.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(s.type, s.was_enabled);
  at::autocast::set_autocast_dtype(s.type, s.was_dtype);
}

}  // namespace trainer

#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainer {

double lr_at(const TrainConfig& c, int64_t step) {
  // Warmup reaches the peak at the end of step warmup_steps - 1, never multiplies by 0 at step 0.
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.schedule == "constant") return c.lr;
  const double floor_lr = c.lr * c.lr_final_frac;
  if (c.schedule == "wsd") {
    // Warmup-stable-decay: hold the peak, then decay linearly over the last 20% of the steps.
    const double decay_start = static_cast<double>(c.steps) * 0.8;
    if (static_cast<double>(step) < decay_start) return c.lr;
    const double span = std::max(1.0, static_cast<double>(c.steps) - decay_start);
    const double progress = std::min(1.0, (static_cast<double>(step) - decay_start) / span);
    return c.lr + (floor_lr - c.lr) * progress;
  }
  const double decay_steps = std::max<double>(1.0, static_cast<double>(c.steps - c.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) / decay_steps);
  return floor_lr + 0.5 * (c.lr - floor_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace trainer

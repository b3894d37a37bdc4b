// Learning-rate schedules: linear warmup from 0, then cosine down to lr * lr_final_frac,
// warmup-stable-decay (linear decay over the last 20% of the steps), or constant. Torch-free.
#pragma once

#include <cstdint>

#include "trainer/api.h"

namespace trainer {

// Learning rate for optimizer step `step` (0-based) of `c.steps`.
double lr_at(const TrainConfig& c, int64_t step);

}  // namespace trainer

// Plain log lines of headless runs, in the style users know from torchtitan and llm.c:
//   step 120/5000 | loss 3.412 | grad_norm 0.84 | lr 2.9e-04 | 45.2k tok/s | 1m12s
// Pure functions over event values, so the format is tested without a run.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/api.h"

namespace ui {

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);
// "452k", "1.25M", "830".
std::string format_count(double v);
// One line for a metrics event: train metrics as above, or "eval step 200 | val_loss ... | val_ppl ...".
// Empty for events that are neither a training step nor an evaluation (telemetry samples).
std::string format_metrics_line(const trainer::MetricsEvent& m, int64_t total_steps);

}  // namespace ui

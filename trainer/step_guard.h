// StepGuard: the decision, per optimizer step, about a loss or gradient that went wrong. It sees
// each step's loss and global grad norm after they were averaged across ranks, so every rank holds
// the same numbers and takes the same decision without talking to the others.
//   - non-finite (NaN or inf loss, or a non-finite grad norm): the update is skipped;
//   - a spike: a finite loss more than `zscore` standard deviations above the mean of the last
//     `window` finite losses, once warm-up is over and the window is full: flagged, and skipped
//     when `skip_spikes`;
//   - after `max_skipped` skipped steps in a row the run must stop (diverged) instead of skipping
//     forever.
// Non-finite and skipped values never enter the window, so one NaN cannot poison the statistics for
// good (llm.c's outlier detector stays NaN after one). The window and counters are saved in
// checkpoints (state()/load_state()), so a resumed run decides exactly as an uninterrupted one.
// No torch here.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace trainer {

struct StepGuardOptions {
  double zscore = 6.0;        // 0: no spike detection
  int64_t window = 100;       // losses in the window (>= 2)
  bool skip_spikes = false;   // spike_action = "skip"
  int64_t max_skipped = 20;   // skipped steps in a row that stop the run; 0 = never
  int64_t warmup_steps = 0;   // no spike is flagged at or before this step
};

struct StepVerdict {
  bool nonfinite = false;  // loss or grad norm not finite
  bool spike = false;      // flagged as a spike
  bool skip = false;       // the update must be (or, lagged, should have been) skipped
  bool diverged = false;   // max_skipped skipped steps in a row: stop the run
  double zscore = 0;       // of a spike
  double mean = 0, stddev = 0;  // the window's, when a spike was judged
};

class StepGuard {
 public:
  explicit StepGuard(StepGuardOptions opt) : opt_(opt) {}

  // Would this loss alone skip the step (non-finite, or a spike to skip)? Changes nothing; for
  // paths that must decide before the gradient norm exists (ZeRO-1 steps inside its optimizer).
  bool loss_skips(int64_t step, double loss) const;
  // Judges step `step` from its loss and grad norm (pass +inf for the norm when the loss scaler
  // found a non-finite gradient) and updates the window and counters. Call once per step, in step
  // order. Never throws. `scaler_backoff`: the loss scaler overflowed at a scale above 1 with a
  // finite loss. That is the scaler finding its range, not a broken step: it is skipped but neither
  // counts towards max_skipped nor breaks a run of skips (at a scale of 1 or below the gradient
  // itself overflows, and that counts).
  StepVerdict record(int64_t step, double loss, double grad_norm, bool scaler_backoff = false);

  int64_t skipped_in_a_row() const { return in_a_row_; }
  int64_t skipped_total() const { return total_; }
  int64_t spikes_total() const { return spikes_; }

  // For checkpoints: "v1;<in a row>;<total>;<spikes>;<loss>,<loss>,..." with every loss written so
  // it reads back to the same double. load_state throws std::runtime_error on malformed text.
  std::string state() const;
  void load_state(const std::string& text);

 private:
  // The spike test on the current window; fills v's zscore/mean/stddev.
  bool is_spike(int64_t step, double loss, StepVerdict* v) const;
  StepGuardOptions opt_;
  std::deque<double> window_;
  int64_t in_a_row_ = 0, total_ = 0, spikes_ = 0;
};

}  // namespace trainer

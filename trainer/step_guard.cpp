// The window statistics are recomputed from the deque on each judged step (a window of ~100
// doubles): a running sum would drift with rounding, and an exact resume needs the same bits.
#include "trainer/step_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace trainer {

bool StepGuard::is_spike(int64_t step, double loss, StepVerdict* v) const {
  if (!(opt_.zscore > 0) || step <= opt_.warmup_steps || static_cast<int64_t>(window_.size()) < opt_.window)
    return false;
  double mean = 0;
  for (double x : window_) mean += x;
  mean /= static_cast<double>(window_.size());
  double var = 0;
  for (double x : window_) var += (x - mean) * (x - mean);
  var /= static_cast<double>(window_.size() - 1);
  // A floor on the spread: a window of (nearly) equal losses would otherwise flag any wobble.
  const double stddev = std::max(std::sqrt(var), 1e-3 * std::fabs(mean) + 1e-12);
  const double z = (loss - mean) / stddev;
  if (v) {
    v->zscore = z;
    v->mean = mean;
    v->stddev = stddev;
  }
  return z > opt_.zscore;
}

bool StepGuard::loss_skips(int64_t step, double loss) const {
  if (!std::isfinite(loss)) return true;
  return opt_.skip_spikes && is_spike(step, loss, nullptr);
}

StepVerdict StepGuard::record(int64_t step, double loss, double grad_norm, bool scaler_backoff) {
  StepVerdict v;
  if (scaler_backoff && std::isfinite(loss)) {
    v.nonfinite = true;
    v.skip = true;
    v.diverged = opt_.max_skipped > 0 && in_a_row_ >= opt_.max_skipped;
    return v;
  }
  v.nonfinite = !std::isfinite(loss) || !std::isfinite(grad_norm);
  if (!v.nonfinite) v.spike = is_spike(step, loss, &v);
  v.skip = v.nonfinite || (v.spike && opt_.skip_spikes);
  if (v.spike) ++spikes_;
  if (v.skip) {
    ++in_a_row_;
    ++total_;
  } else {
    in_a_row_ = 0;
    // A flagged spike that was trained on stays in the window, so a lasting shift in the loss
    // (a new data mixture) stops being flagged once the window has seen it.
    window_.push_back(loss);
    while (static_cast<int64_t>(window_.size()) > opt_.window) window_.pop_front();
  }
  v.diverged = opt_.max_skipped > 0 && in_a_row_ >= opt_.max_skipped;
  return v;
}

std::string StepGuard::state() const {
  std::string out = "v1;" + std::to_string(in_a_row_) + ";" + std::to_string(total_) + ";" +
                    std::to_string(spikes_) + ";";
  char buf[40];
  for (size_t i = 0; i < window_.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.17g", i ? "," : "", window_[i]);
    out += buf;
  }
  return out;
}

void StepGuard::load_state(const std::string& text) {
  std::stringstream in(text);
  std::string version, a, b, c, losses;
  if (!std::getline(in, version, ';') || version != "v1" || !std::getline(in, a, ';') || !std::getline(in, b, ';') ||
      !std::getline(in, c, ';'))
    throw std::runtime_error("step guard state: expected \"v1;<in a row>;<total>;<spikes>;<losses>\", got \"" +
                             text.substr(0, 80) + "\"");
  std::getline(in, losses);
  try {
    in_a_row_ = std::stoll(a);
    total_ = std::stoll(b);
    spikes_ = std::stoll(c);
    window_.clear();
    std::stringstream ls(losses);
    for (std::string x; std::getline(ls, x, ',');) window_.push_back(std::stod(x));
  } catch (const std::exception& e) {
    throw std::runtime_error("step guard state: bad number in \"" + text.substr(0, 80) + "\" (" + e.what() + ")");
  }
}

}  // namespace trainer

// Events drawn as markers on a plot's x axis: loss-scaler back-offs and skipped steps (found in the
// loss_scale and skipped_steps series) and checkpoints (their steps). Markers are kept by step and
// placed on whichever x axis the plot uses through a reference series of the same run.
#pragma once

#include <cstdint>
#include <vector>

#include "ui/gui/series.h"

namespace ui {

// Steps at which a series went down from its previous point (loss_scale: a back-off).
std::vector<double> steps_where_decreasing(const MetricSeries& s, const Timeline& tl);
// Steps at which a series went up from its previous point (skipped_steps: steps were skipped).
std::vector<double> steps_where_increasing(const MetricSeries& s, const Timeline& tl);
// The steps where a series rose (up) and fell (down), kept up to date as points arrive: an update
// costs O(new points); a replaced tail (resume) starts over. For the loss-scale plot of a long
// run, where scanning a million points every frame would cost milliseconds.
struct ChangeMarkers {
  std::vector<double> up, down;
  size_t seen = 0;
  uint64_t truncations = 0;
  void update(const MetricSeries& s, const Timeline& tl);
};

// The x of `step` on `axis`, read from the reference series' nearest point at or after the step
// (tokens and wall time are known only where something was logged); the step itself on the step
// axis or when the reference is empty.
double x_at_step(const MetricSeries* reference, const Timeline& tl, double step, XAxis axis);

}  // namespace ui

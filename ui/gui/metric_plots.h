// Building a plot's series from a run's history: the view on the chosen x axis, the smoothed copy
// when smoothing is on, a cache key that changes only when that series changes.
#pragma once

#include <map>
#include <string>

#include "ui/gui/plot.h"
#include "ui/gui/series.h"
#include "ui/gui/smoothing.h"

namespace ui {

// Appends the series of `key` to `out` (nothing when the run has no such metric). weight > 0
// smooths (the smoothed copy is kept in `smoothed`, updated incrementally), except evaluation
// metrics (val_*), which are drawn as they are. Returns whether added.
bool add_plot_series(const RunHistory& h, std::map<std::string, SmoothedSeries>& smoothed, const std::string& key,
                     XAxis axis, double weight, const std::string& label, ImU32 color, std::vector<PlotSeries>& out);

// Metric keys of the form prefix<i>suffix present in the history ("gpu", ".util" -> gpu0.util, gpu1.util...),
// ordered by i.
std::vector<std::string> indexed_keys(const RunHistory& h, const std::string& prefix, const std::string& suffix);

// The newest value of a metric; NaN when absent.
double last_value(const RunHistory& h, const std::string& key);
// The smallest finite value of a metric; NaN when absent.
double min_value(const RunHistory& h, const std::string& key);
// The value at exactly `step`; NaN when not logged there.
double value_at_step(const RunHistory& h, const std::string& key, double step);

}  // namespace ui

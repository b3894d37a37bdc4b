// The plot widget: several series over step, tokens or wall time; linear or log y; y range from
// all points or ignoring outliers; EMA smoothing drawn over the faint raw series; hover readout of
// every series at the cursor; wheel zoom, drag pan, double-click auto-fit; markers on the x axis.
//
// Drawing never touches every point: each series is reduced to one min/max per pixel column
// (downsample.h, O(W log N) through the series' pyramid), so a 1M-point series costs what a
// 2000-point one does and a single spike still shows. The reduced columns are cached in PlotState
// and rebuilt only when the view, the width or the data change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <imgui.h>

#include "ui/gui/downsample.h"

namespace ui {

// The x range shared by the plots of one view (zooming one zooms them all, as in TensorBoard).
struct XRange {
  bool auto_fit = true;
  double x0 = 0, x1 = 1;    // the view when not auto-fitting
  XAxis axis = XAxis::Step;
};

// One line of a plot, set up by the caller each frame.
struct PlotSeries {
  std::string label;
  ImU32 color = 0;
  SeriesView raw;
  SeriesView smooth;        // n == 0: not smoothed
  uint64_t version = 0;     // changes whenever the points change (cache key)
};

struct PlotMarker {
  double x = 0;             // on the plot's x axis
  ImU32 color = 0;
  std::string label;        // hover text
  int64_t id = 0;           // caller's handle (a checkpoint's step)
  bool clickable = false;   // clicking it reports the marker (checkpoints: "resume from here")
};

// Per plot, kept between frames by the panel that owns the plot.
struct PlotState {
  bool log_y = false;
  bool ignore_outliers = false;
  bool auto_fit_y = true;
  double y0 = 0, y1 = 1;    // the view when not auto-fitting (value space; log axes too)
  // Where the plot area was last drawn and the colours of its series (screen pixels): tests check
  // a screenshot's pixels there.
  ImVec2 area_min, area_max;
  int drawn_frame = -1;     // ImGui::GetFrameCount() of that frame
  std::vector<ImU32> colors;
  std::vector<size_t> counts;  // points of each series in the visible range
  // Cache of the last frame's reduction.
  struct Cached {
    std::vector<Downsampled> raw, smooth;
    double x0 = 0, x1 = 0;
    int width = 0;
    uint64_t key = 0;
  } cache;
};

struct PlotResult {
  bool hovered = false;
  int clicked_marker = -1;  // index into markers, or -1
  double hover_x = 0;       // cursor's x on the axis (valid when hovered)
};

// Draws a plot of the given height filling the available width. Main thread, inside an ImGui window.
PlotResult draw_plot(const char* title, PlotState& st, XRange& xr, const std::vector<PlotSeries>& series,
                     const std::vector<PlotMarker>& markers, float height);

// Ten colours that stay apart on the dark background; index wraps.
ImU32 series_color(size_t i);
// A colour with its alpha scaled (the faint raw series behind a smoothed one).
ImU32 with_alpha(ImU32 c, float alpha);

// The full x extent of the series (for auto-fit); false when there are no points.
bool x_extent(const std::vector<PlotSeries>& series, double& lo, double& hi);

}  // namespace ui

#include "ui/gui/plot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ui/gui/plot_math.h"

namespace ui {

namespace {

constexpr float WHEEL_ZOOM = 0.85f;      // view span factor per wheel notch
constexpr size_t POLYLINE_CHUNK = 4000;  // points per AddPolyline (16-bit indices cap one call)

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}
uint64_t bits(double d) {
  uint64_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// Maps values to screen pixels for one frame.
struct Frame {
  ImVec2 lo, hi;           // the plot area (inside the axes)
  double x0, x1, y0, y1;   // y in value space
  bool log_y;
  double ty(double v) const { return log_y ? (v > 0 ? std::log10(v) : -1e300) : v; }
  float px(double x) const { return lo.x + static_cast<float>((x - x0) / (x1 - x0)) * (hi.x - lo.x); }
  float py(double v) const {
    const double a = ty(y0), b = ty(y1);
    double f = (ty(v) - a) / (b - a);
    // Far-off values are clamped so the line still leaves the plot in the right direction.
    f = std::max(-4.0, std::min(5.0, f));
    return hi.y - static_cast<float>(f) * (hi.y - lo.y);
  }
  double x_at(float sx) const { return x0 + (sx - lo.x) / (hi.x - lo.x) * (x1 - x0); }
  double y_at(float sy) const {
    const double a = ty(y0), b = ty(y1);
    const double t = a + (hi.y - sy) / (hi.y - lo.y) * (b - a);
    return log_y ? std::pow(10.0, t) : t;
  }
};

void flush(ImDrawList* dl, std::vector<ImVec2>& pts, ImU32 color, float thickness) {
  for (size_t start = 0; start + 1 < pts.size(); start += POLYLINE_CHUNK - 1) {
    const size_t n = std::min(POLYLINE_CHUNK, pts.size() - start);
    dl->AddPolyline(pts.data() + start, static_cast<int>(n), color, 0, thickness);
  }
  // A lone point (one evaluation so far, or a gap on both sides) still shows.
  if (pts.size() == 1) dl->AddCircleFilled(pts[0], thickness + 2.0f, color, 12);
  pts.clear();
}

// Axis-aligned bars in batches (one PrimReserve per batch; 16-bit indices cap a batch).
void flush_bars(ImDrawList* dl, std::vector<ImVec4>& bars, ImU32 color) {
  constexpr size_t BATCH = 8000;
  for (size_t start = 0; start < bars.size(); start += BATCH) {
    const size_t n = std::min(BATCH, bars.size() - start);
    dl->PrimReserve(static_cast<int>(n * 6), static_cast<int>(n * 4));
    for (size_t i = start; i < start + n; ++i)
      dl->PrimRect(ImVec2(bars[i].x, bars[i].y), ImVec2(bars[i].z, bars[i].w), color);
  }
  bars.clear();
}

// One series' columns. A column of one or two points contributes them to a polyline; a denser
// column is a vertical bar over its min..max, stretched to reach the previous column's last value
// so neighbouring columns always touch: two triangles per pixel column whatever the number of
// points, and a single spike is a full-height stroke. A non-finite value breaks the line.
void draw_columns(ImDrawList* dl, const Frame& f, const Downsampled& d, ImU32 color, float thickness,
                  std::vector<ImVec2>& pts, std::vector<ImVec4>& bars) {
  pts.clear();
  bars.clear();
  bool bridge = false;  // pts holds only the end of a bar, to join the next sparse point to it
  auto add = [&](double x, double y) {
    bridge = false;
    if (!std::isfinite(y) || (f.log_y && y <= 0)) {
      flush(dl, pts, color, thickness);
      return;
    }
    pts.push_back(ImVec2(f.px(x), f.py(y)));
  };
  bool have_prev = d.has_before && std::isfinite(d.y_before);
  float prev_y = have_prev ? f.py(d.y_before) : 0;
  if (d.has_before && !d.columns.empty()) add(d.x_before, d.y_before);
  for (const Column& c : d.columns) {
    if (c.count <= 2 || !(c.y_min <= c.y_max)) {
      add(c.x_first, c.y_first);
      if (c.count > 1) add(c.x_last, c.y_last);
      have_prev = std::isfinite(c.y_last);
      if (have_prev) prev_y = f.py(c.y_last);
      continue;
    }
    // A dense column: the polyline so far ends here; the bar carries on from its last point.
    if (bridge) pts.clear();
    else flush(dl, pts, color, thickness);
    float top = f.py(c.y_max), bottom = f.py(c.y_min);
    if (have_prev) {
      top = std::min(top, prev_y);
      bottom = std::max(bottom, prev_y);
    }
    // One pixel wide (the next column's bar continues it) and at least `thickness` tall, so a flat
    // stretch reads as a line of the same weight as the sparse polyline; no wider, because a
    // noisy series is a solid band and every extra pixel is blended (a software rasteriser's
    // fill rate is the frame's limit).
    if (bottom - top < thickness) {
      const float mid = (top + bottom) * 0.5f;
      top = mid - thickness * 0.5f;
      bottom = mid + thickness * 0.5f;
    }
    const float x = f.lo.x + static_cast<float>(c.px);
    bars.push_back(ImVec4(x, top, x + 1.0f, bottom));
    have_prev = std::isfinite(c.y_last);
    if (have_prev) {
      prev_y = f.py(c.y_last);
      pts.push_back(ImVec2(f.lo.x + static_cast<float>(c.px) + 0.5f, prev_y));
      bridge = true;
    }
  }
  if (d.has_after && !d.columns.empty()) add(d.x_after, d.y_after);
  // A view between two points (zoomed far in) still shows the segment crossing it.
  if (d.columns.empty() && d.has_before && d.has_after) {
    add(d.x_before, d.y_before);
    add(d.x_after, d.y_after);
  }
  if (bridge) pts.clear();
  flush(dl, pts, color, thickness);
  flush_bars(dl, bars, color);
}

// A toggle drawn as a small button, highlighted while on.
bool toggle(const char* label, bool* v) {
  if (*v) ImGui::PushStyleColor(ImGuiCol_Button, ImGui::GetStyleColorVec4(ImGuiCol_ButtonActive));
  const bool clicked = ImGui::SmallButton(label);
  if (*v) ImGui::PopStyleColor();
  if (clicked) *v = !*v;
  return clicked;
}

}  // namespace

ImU32 series_color(size_t i) {
  static constexpr ImU32 PALETTE[] = {
      IM_COL32(86, 180, 233, 255),  IM_COL32(230, 159, 0, 255),   IM_COL32(0, 200, 140, 255),
      IM_COL32(240, 90, 90, 255),   IM_COL32(204, 121, 167, 255), IM_COL32(240, 228, 66, 255),
      IM_COL32(150, 150, 255, 255), IM_COL32(160, 220, 110, 255), IM_COL32(255, 140, 200, 255),
      IM_COL32(190, 190, 190, 255)};
  return PALETTE[i % (sizeof PALETTE / sizeof PALETTE[0])];
}

ImU32 with_alpha(ImU32 c, float alpha) {
  const ImU32 a = static_cast<ImU32>(((c >> IM_COL32_A_SHIFT) & 0xFF) * alpha);
  return (c & ~IM_COL32_A_MASK) | (a << IM_COL32_A_SHIFT);
}

bool x_extent(const std::vector<PlotSeries>& series, double& lo, double& hi) {
  bool any = false;
  for (const auto& s : series) {
    if (s.raw.n == 0) continue;
    const double a = s.raw.x(0), b = s.raw.x(s.raw.n - 1);
    if (!any) {
      lo = a;
      hi = b;
      any = true;
    } else {
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    }
  }
  return any;
}

PlotResult draw_plot(const char* title, PlotState& st, XRange& xr, const std::vector<PlotSeries>& series,
                     const std::vector<PlotMarker>& markers, float height) {
  PlotResult res;
  ImGui::PushID(title);
  const float font = ImGui::GetFontSize();

  // Header: title, then the per-plot toggles on the right of this cell.
  ImGui::TextUnformatted(title);
  {
    const ImGuiStyle& style = ImGui::GetStyle();
    const float w = ImGui::CalcTextSize("log").x + ImGui::CalcTextSize("ignore outliers").x +
                    ImGui::CalcTextSize("fit").x + 6 * style.FramePadding.x + 2 * style.ItemSpacing.x;
    ImGui::SameLine();
    const float avail = ImGui::GetContentRegionAvail().x;
    if (avail > w) ImGui::SetCursorPosX(ImGui::GetCursorPosX() + avail - w);
    if (toggle("log", &st.log_y)) st.auto_fit_y = true;
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Logarithmic y axis");
    ImGui::SameLine();
    if (toggle("ignore outliers", &st.ignore_outliers)) st.auto_fit_y = true;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("Fit the y range to the 2nd-98th percentile of the visible points, so one spike does not "
                        "flatten the rest of the curve");
    ImGui::SameLine();
    if (ImGui::SmallButton("fit")) {
      st.auto_fit_y = true;
      xr.auto_fit = true;
    }
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Fit both axes to the data (or double-click the plot)");
  }

  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float full_w = std::max(ImGui::GetContentRegionAvail().x, 100.0f);
  const ImVec2 size(full_w, std::max(height, 4 * font));
  ImGui::InvisibleButton("##plot", size);
  const bool hovered = ImGui::IsItemHovered();
  const bool active = ImGui::IsItemActive();
  ImDrawList* dl = ImGui::GetWindowDrawList();

  Frame f;
  const float left = font * 4.2f, bottom = font * 1.5f;
  f.lo = ImVec2(origin.x + left, origin.y + font * 0.4f);
  f.hi = ImVec2(origin.x + size.x - font * 0.6f, origin.y + size.y - bottom);
  f.log_y = st.log_y;
  const int width = std::max(1, static_cast<int>(f.hi.x - f.lo.x));

  // x range
  double x0 = xr.x0, x1 = xr.x1;
  if (xr.auto_fit) {
    if (!x_extent(series, x0, x1)) {
      x0 = 0;
      x1 = 1;
    }
  }
  if (!(x1 > x0)) {
    x0 -= 0.5;
    x1 += 0.5;
  }
  f.x0 = x0;
  f.x1 = x1;

  // The reduction, rebuilt only when the view, the width or the data changed.
  uint64_t key = mix(mix(mix(bits(x0), bits(x1)), static_cast<uint64_t>(width)), series.size());
  for (const auto& s : series) {
    key = mix(key, s.version);
    key = mix(key, s.raw.n);
    key = mix(key, s.smooth.n);
    key = mix(key, reinterpret_cast<uintptr_t>(s.raw.y));
    key = mix(key, reinterpret_cast<uintptr_t>(s.smooth.y));
    key = mix(key, static_cast<uint64_t>(xr.axis));
  }
  auto& cache = st.cache;
  if (cache.key != key || cache.raw.size() != series.size()) {
    cache.raw.clear();
    cache.smooth.clear();
    for (const auto& s : series) {
      cache.smooth.emplace_back();
      cache.raw.push_back(downsample(s.raw, x0, x1, width, s.smooth.n ? &s.smooth : nullptr,
                                     s.smooth.n ? &cache.smooth.back() : nullptr));
    }
    cache.key = key;
  }

  // y range
  if (st.auto_fit_y) {
    std::vector<double> mins, maxes;
    for (size_t i = 0; i < series.size(); ++i)
      for (const Downsampled* d : {&cache.raw[i], &cache.smooth[i]})
        for (const Column& c : d->columns) {
          mins.push_back(c.y_min);
          maxes.push_back(c.y_max);
        }
    MinMax r = pad_range(y_range(mins, maxes, st.ignore_outliers, st.log_y), 0.05, st.log_y);
    if (r.empty()) r = st.log_y ? MinMax{1, 10} : MinMax{0, 1};
    st.y0 = r.lo;
    st.y1 = r.hi;
  }
  if (!(st.y1 > st.y0) || (st.log_y && !(st.y0 > 0))) {
    st.auto_fit_y = true;
    st.y0 = st.log_y ? 1 : 0;
    st.y1 = st.log_y ? 10 : 1;
  }
  f.y0 = st.y0;
  f.y1 = st.y1;

  // Frame, grid and tick labels.
  const ImU32 grid = ImGui::GetColorU32(ImGuiCol_Border, 0.45f);
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  // No filled background (fill rate is what a software rasteriser runs out of): grid and frame only.
  {
    const int ny = std::max(2, static_cast<int>((f.hi.y - f.lo.y) / (font * 2.2f)));
    const auto yt = st.log_y ? log_ticks(f.y0, f.y1, ny) : nice_ticks(f.y0, f.y1, ny);
    for (double v : yt) {
      const float y = f.py(v);
      dl->AddLine(ImVec2(f.lo.x, y), ImVec2(f.hi.x, y), grid);
      const std::string s = std::fabs(v) >= 1e3 ? format_compact(v) : format_value(v, 3);
      const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
      dl->AddText(ImVec2(f.lo.x - ts.x - font * 0.3f, y - ts.y * 0.5f), text, s.c_str());
    }
    const int nx = std::max(2, static_cast<int>((f.hi.x - f.lo.x) / (font * 6.0f)));
    for (double v : nice_ticks(f.x0, f.x1, nx)) {
      const float x = f.px(v);
      dl->AddLine(ImVec2(x, f.lo.y), ImVec2(x, f.hi.y), grid);
      const std::string s = format_x(v, xr.axis);
      const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
      dl->AddText(ImVec2(x - ts.x * 0.5f, f.hi.y + font * 0.2f), text, s.c_str());
    }
  }

  // MetricSeries: raw faint behind a smoothed line, or raw alone.
  dl->PushClipRect(f.lo, f.hi, true);
  std::vector<ImVec2> pts;
  std::vector<ImVec4> bars;
  for (size_t i = 0; i < series.size(); ++i) {
    const bool smoothed = series[i].smooth.n > 0;
    // Whole-pixel widths: ImGui draws those anti-aliased from its font texture, two triangles a
    // segment instead of six, which is what keeps a dashboard of dense series at 60 frames/s.
    draw_columns(dl, f, cache.raw[i], smoothed ? with_alpha(series[i].color, 0.3f) : series[i].color,
                 smoothed ? 1.0f : 2.0f, pts, bars);
    if (smoothed) draw_columns(dl, f, cache.smooth[i], series[i].color, 2.0f, pts, bars);
  }
  dl->PopClipRect();

  // Markers: small triangles standing on the x axis.
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  int hovered_marker = -1;
  for (size_t m = 0; m < markers.size(); ++m) {
    const float x = f.px(markers[m].x);
    if (x < f.lo.x - 1 || x > f.hi.x + 1) continue;
    const float r = font * 0.35f;
    dl->AddTriangleFilled(ImVec2(x, f.hi.y - 2 * r), ImVec2(x - r, f.hi.y), ImVec2(x + r, f.hi.y), markers[m].color);
    if (hovered && std::fabs(mouse.x - x) <= r + 1 && mouse.y >= f.hi.y - 3 * r && mouse.y <= f.hi.y + r)
      hovered_marker = static_cast<int>(m);
  }
  dl->AddRect(f.lo, f.hi, ImGui::GetColorU32(ImGuiCol_Border));
  st.drawn_frame = ImGui::GetFrameCount();
  st.area_min = f.lo;
  st.area_max = f.hi;
  st.colors.clear();
  st.counts.clear();
  for (size_t i = 0; i < series.size(); ++i) {
    st.colors.push_back(series[i].color);
    st.counts.push_back(cache.raw[i].points_in_range);
  }

  // Interaction: wheel zooms x around the cursor (shift: y), drag pans, double-click fits.
  ImGuiIO& io = ImGui::GetIO();
  const bool inside = mouse.x >= f.lo.x && mouse.x <= f.hi.x && mouse.y >= f.lo.y && mouse.y <= f.hi.y;
  if (hovered && io.MouseWheel != 0) {
    const float k = std::pow(WHEEL_ZOOM, io.MouseWheel);
    if (io.KeyShift) {
      const double c = f.y_at(mouse.y);
      st.auto_fit_y = false;
      if (st.log_y) {
        const double lc = std::log10(c), a = std::log10(f.y0), b = std::log10(f.y1);
        st.y0 = std::pow(10.0, lc + (a - lc) * k);
        st.y1 = std::pow(10.0, lc + (b - lc) * k);
      } else {
        st.y0 = c + (f.y0 - c) * k;
        st.y1 = c + (f.y1 - c) * k;
      }
    } else {
      const double c = f.x_at(mouse.x);
      xr.auto_fit = false;
      xr.x0 = c + (f.x0 - c) * k;
      xr.x1 = c + (f.x1 - c) * k;
    }
  }
  if (active && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 2.0f)) {
    const ImVec2 d = io.MouseDelta;
    if (d.x != 0) {
      const double dx = -d.x / (f.hi.x - f.lo.x) * (f.x1 - f.x0);
      xr.auto_fit = false;
      xr.x0 = f.x0 + dx;
      xr.x1 = f.x1 + dx;
    }
    if (d.y != 0) {
      st.auto_fit_y = false;
      st.y0 = f.y_at(f.hi.y - d.y);
      st.y1 = f.y_at(f.lo.y - d.y);
    }
  }
  if (hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
    xr.auto_fit = true;
    st.auto_fit_y = true;
  }
  if (hovered_marker >= 0) {
    ImGui::SetTooltip("%s%s", markers[hovered_marker].label.c_str(),
                      markers[hovered_marker].clickable ? "\n(click for actions)" : "");
    // A click, not the end of a pan that happened to finish on the marker.
    if (markers[hovered_marker].clickable && ImGui::IsMouseReleased(ImGuiMouseButton_Left) &&
        io.MouseDragMaxDistanceSqr[0] < io.MouseDragThreshold * io.MouseDragThreshold)
      res.clicked_marker = hovered_marker;
  } else if (hovered && inside && !active) {
    // Hover readout: a cursor line and every series' value at its nearest point.
    const double hx = f.x_at(mouse.x);
    res.hover_x = hx;
    dl->AddLine(ImVec2(mouse.x, f.lo.y), ImVec2(mouse.x, f.hi.y), ImGui::GetColorU32(ImGuiCol_Text, 0.35f));
    ImGui::BeginTooltip();
    ImGui::Text("%s %s", x_axis_name(xr.axis), format_x(hx, xr.axis).c_str());
    for (const auto& s : series) {
      const SeriesView& v = s.smooth.n ? s.smooth : s.raw;
      if (v.n == 0) continue;
      const size_t i = nearest_index(s.raw, hx);
      const double px = f.px(s.raw.x(i));
      if (px >= f.lo.x && px <= f.hi.x && std::isfinite(v.y[i]))
        dl->AddCircleFilled(ImVec2(static_cast<float>(px), f.py(v.y[i])), 3.0f, s.color, 10);
      const ImVec2 c = ImGui::GetCursorScreenPos();
      ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(c.x, c.y + font * 0.25f),
                                                ImVec2(c.x + font * 0.5f, c.y + font * 0.75f), s.color);
      ImGui::Dummy(ImVec2(font * 0.6f, font));
      ImGui::SameLine();
      if (s.smooth.n)
        ImGui::Text("%s  %s  (raw %s, at %s)", s.label.c_str(), format_value(v.y[i], 5).c_str(),
                    format_value(s.raw.y[i], 5).c_str(), format_x(s.raw.x(i), xr.axis).c_str());
      else
        ImGui::Text("%s  %s  (at %s)", s.label.c_str(), format_value(v.y[i], 5).c_str(),
                    format_x(s.raw.x(i), xr.axis).c_str());
    }
    ImGui::EndTooltip();
  }
  res.hovered = hovered;
  ImGui::PopID();
  return res;
}

}  // namespace ui

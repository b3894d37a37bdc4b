#include "ui/tui/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "ui/log/log_line.h"

namespace ui::tui {

namespace {

// Braille dot bits by (column within the cell, row within the cell): U+2800 + the sum.
constexpr uint8_t DOT_BITS[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};

std::string braille(uint8_t bits) {
  const unsigned cp = 0x2800u + bits;
  std::string out;
  out += static_cast<char>(0xE0 | (cp >> 12));
  out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  out += static_cast<char>(0x80 | (cp & 0x3F));
  return out;
}

// The plot area as dots: a bit mask per cell and the colour of the last line drawn into it.
struct Canvas {
  int cw, ch;  // cells
  std::vector<uint8_t> bits;
  std::vector<Color> colors;
  Canvas(int w, int h) : cw(w), ch(h), bits(static_cast<size_t>(w * h), 0), colors(static_cast<size_t>(w * h)) {}
  void dot(int dx, int dy, Color c) {
    if (dx < 0 || dy < 0 || dx >= cw * 2 || dy >= ch * 4) return;
    const size_t cell = static_cast<size_t>((dy / 4) * cw + dx / 2);
    bits[cell] |= DOT_BITS[dx % 2][dy % 4];
    colors[cell] = c;
  }
  void line(int x0, int y0, int x1, int y1, Color c) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      dot(x0, y0, c);
      if (x0 == x1 && y0 == y1) return;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
};

bool usable(double v, bool log_y) { return std::isfinite(v) && (!log_y || v > 0); }

}  // namespace

std::string short_number(double v) {
  const double a = std::fabs(v);
  char buf[32];
  if (a >= 1e4) return (v < 0 ? "-" : "") + format_count(a);
  if (a == 0) return "0";
  if (a >= 100) std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (a >= 0.01) std::snprintf(buf, sizeof buf, "%.3g", v);
  else std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

void draw_chart(Screen& s, int x, int y, int w, int h, const ChartSpec& spec) {
  if (w < 8 || h < 1) return;
  // Title: the chart's name, then each line's newest value in its colour.
  int cx = s.put(x, y, spec.title, Style{Color::Default, true}, w);
  for (const ChartLine& l : spec.lines) {
    if (!l.points || l.points->empty()) continue;
    const std::string v = (l.name.empty() ? "" : l.name + " ") + short_number(l.points->back().value);
    cx = s.put(cx, y, "  ", {}, x + w - cx);
    cx = s.put(cx, y, v, Style{l.color}, x + w - cx);
  }
  if (h < 3) return;

  // The ranges over every line's usable points.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  int64_t x_lo = std::numeric_limits<int64_t>::max(), x_hi = std::numeric_limits<int64_t>::min();
  for (const ChartLine& l : spec.lines) {
    if (!l.points) continue;
    for (const SeriesPoint& p : *l.points) {
      if (!usable(p.value, spec.log_y)) continue;
      const double v = spec.log_y ? std::log2(p.value) : p.value;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      x_lo = std::min(x_lo, p.step);
      x_hi = std::max(x_hi, p.step);
    }
  }
  const int label_w = 7;
  const int pw = w - label_w - 1, ph = h - 2;
  if (pw < 2 || ph < 1) return;
  if (!(lo <= hi)) {
    s.put(x + label_w + 1, y + 1 + ph / 2, "no data yet", Style{Color::Gray}, pw);
    return;
  }
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
    // A flat line sits in the middle of a small band around its value.
    const double pad = spec.log_y ? 1.0 : std::max(1e-9, std::fabs(hi) * 0.05);
    lo -= pad;
    hi += pad;
  }
  const int64_t last_step = x_hi;
  if (x_hi == x_lo) ++x_hi;
  const int dots_x = pw * 2, dots_y = ph * 4;
  auto col_of = [&](int64_t step) {
    return static_cast<int>(std::llround(static_cast<double>(step - x_lo) / static_cast<double>(x_hi - x_lo) * (dots_x - 1)));
  };
  auto row_of = [&](double v) {
    const double t = ((spec.log_y ? std::log2(v) : v) - lo) / (hi - lo);
    return std::clamp(static_cast<int>(std::llround((1.0 - t) * (dots_y - 1))), 0, dots_y - 1);
  };

  Canvas canvas(pw, ph);
  struct Bin {
    int first = -1, last = -1, top = 0, bottom = 0;
  };
  for (const ChartLine& l : spec.lines) {
    if (!l.points) continue;
    std::vector<Bin> bins(static_cast<size_t>(dots_x));
    for (const SeriesPoint& p : *l.points) {
      if (!usable(p.value, spec.log_y)) continue;
      Bin& b = bins[static_cast<size_t>(std::clamp(col_of(p.step), 0, dots_x - 1))];
      const int r = row_of(p.value);
      if (b.first < 0) {
        b.first = b.top = b.bottom = r;
      }
      b.top = std::min(b.top, r);
      b.bottom = std::max(b.bottom, r);
      b.last = r;
    }
    int prev_col = -1, prev_row = 0;
    for (int c = 0; c < dots_x; ++c) {
      const Bin& b = bins[static_cast<size_t>(c)];
      if (b.first < 0) continue;
      if (prev_col >= 0) canvas.line(prev_col, prev_row, c, b.first, l.color);
      canvas.line(c, b.top, c, b.bottom, l.color);
      prev_col = c;
      prev_row = b.last;
    }
  }
  for (int r = 0; r < ph; ++r) {
    for (int c = 0; c < pw; ++c) {
      const size_t cell = static_cast<size_t>(r * pw + c);
      if (canvas.bits[cell]) s.set(x + label_w + 1 + c, y + 1 + r, braille(canvas.bits[cell]), Style{canvas.colors[cell]});
    }
    s.set(x + label_w, y + 1 + r, "│", Style{Color::Gray});
  }
  auto label = [&](double v) { return short_number(spec.log_y ? std::exp2(v) : v); };
  auto right_aligned = [&](const std::string& t, int row) {
    const int n = static_cast<int>(t.size());
    s.put(x + std::max(0, label_w - n), row, t, Style{Color::Gray}, label_w);
  };
  right_aligned(label(hi), y + 1);
  if (ph >= 2) right_aligned(label(lo), y + ph);
  const std::string left = "step " + std::to_string(x_lo);
  const std::string right = std::to_string(last_step);
  s.put(x + label_w + 1, y + h - 1, left, Style{Color::Gray}, pw);
  if (static_cast<int>(left.size() + right.size()) + 2 <= pw) {
    s.put(x + label_w + 1 + pw - static_cast<int>(right.size()), y + h - 1, right, Style{Color::Gray});
  }
}

}  // namespace ui::tui

#include "ui/tui/screen.h"

#include <algorithm>

namespace ui::tui {

namespace {

std::string sgr(const Style& s) {
  std::string out = "\x1b[0";
  if (s.bold) out += ";1";
  if (s.inverse) out += ";7";
  switch (s.fg) {
    case Color::Default: break;
    case Color::Gray: out += ";90"; break;
    default: out += ";3" + std::to_string(static_cast<int>(s.fg)); break;
  }
  return out + "m";
}

}  // namespace

std::vector<std::string> split_glyphs(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (!ok) {
      out.emplace_back("?");
      ++i;
      continue;
    }
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

void Screen::resize(int cols, int rows) {
  cols_ = std::max(1, cols);
  rows_ = std::max(1, rows);
  cells_.assign(static_cast<size_t>(cols_ * rows_), Cell{});
}

void Screen::clear() { std::fill(cells_.begin(), cells_.end(), Cell{}); }

void Screen::set(int x, int y, const std::string& glyph, Style style) {
  if (x < 0 || y < 0 || x >= cols_ || y >= rows_) return;
  Cell& c = cells_[static_cast<size_t>(y * cols_ + x)];
  c.glyph = glyph;
  c.style = style;
}

int Screen::put(int x, int y, const std::string& text, Style style, int max_cols) {
  if (y < 0 || y >= rows_) return x;
  const int limit = max_cols < 0 ? cols_ : std::min(cols_, x + max_cols);
  for (const std::string& g : split_glyphs(text)) {
    if (x >= limit) break;
    const bool control = g.size() == 1 && (static_cast<unsigned char>(g[0]) < 0x20 || g[0] == 0x7f);
    set(x, y, control ? " " : g, style);
    ++x;
  }
  return x;
}

void Screen::fill_style(int x, int y, int width, Style style) {
  if (y < 0 || y >= rows_) return;
  for (int i = std::max(0, x); i < std::min(cols_, x + width); ++i) cells_[static_cast<size_t>(y * cols_ + i)].style = style;
}

std::string Screen::row_text(int y) const {
  std::string out;
  for (int x = 0; x < cols_; ++x) out += at(x, y).glyph;
  return out;
}

std::string Screen::row_ansi(int y) const {
  std::string out;
  Style current;
  out += sgr(current);
  for (int x = 0; x < cols_; ++x) {
    const Cell& c = at(x, y);
    if (c.style != current) {
      current = c.style;
      out += sgr(current);
    }
    out += c.glyph;
  }
  return out + "\x1b[0m";
}

std::string Screen::diff(std::vector<std::string>& previous) const {
  std::string out;
  if (previous.size() != static_cast<size_t>(rows_)) {
    previous.assign(static_cast<size_t>(rows_), std::string());
    out += "\x1b[0m\x1b[2J";
  }
  for (int y = 0; y < rows_; ++y) {
    std::string row = row_ansi(y);
    if (row == previous[static_cast<size_t>(y)]) continue;
    out += "\x1b[" + std::to_string(y + 1) + ";1H" + row;
    previous[static_cast<size_t>(y)] = std::move(row);
  }
  return out;
}

}  // namespace ui::tui

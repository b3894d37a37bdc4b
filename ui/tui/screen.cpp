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

// The code point of one well-formed glyph from split_glyphs.
uint32_t code_point(const std::string& g) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(g[i])); };
  switch (g.size()) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

struct Range {
  uint32_t first, last;
};

bool in(const Range* ranges, size_t n, uint32_t c) {
  for (size_t i = 0; i < n; ++i)
    if (c >= ranges[i].first && c <= ranges[i].last) return true;
  return false;
}

// Marks drawn on the glyph before them: combining accents, variation selectors, joiners.
constexpr Range kZeroWidth[] = {
    {0x0300, 0x036F}, {0x0483, 0x0489}, {0x0591, 0x05BD}, {0x0610, 0x061A}, {0x064B, 0x065F},
    {0x0E31, 0x0E31}, {0x0E34, 0x0E3A}, {0x0E47, 0x0E4E}, {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF},
    {0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x2064}, {0x20D0, 0x20FF}, {0xFE00, 0xFE0F},
    {0xFE20, 0xFE2F}, {0xFEFF, 0xFEFF}, {0x1F3FB, 0x1F3FF}, {0xE0000, 0xE007F}, {0xE0100, 0xE01EF},
};
// Two columns in a terminal: East Asian wide and full-width forms, and emoji drawn as pictures.
constexpr Range kWide[] = {
    {0x1100, 0x115F},   {0x231A, 0x231B},   {0x2329, 0x232A},   {0x23E9, 0x23EC},   {0x23F0, 0x23F0},
    {0x23F3, 0x23F3},   {0x25FD, 0x25FE},   {0x2614, 0x2615},   {0x2648, 0x2653},   {0x267F, 0x267F},
    {0x2693, 0x2693},   {0x26A1, 0x26A1},   {0x26AA, 0x26AB},   {0x26BD, 0x26BE},   {0x26C4, 0x26C5},
    {0x26CE, 0x26CE},   {0x26D4, 0x26D4},   {0x26EA, 0x26EA},   {0x26F2, 0x26F3},   {0x26F5, 0x26F5},
    {0x26FA, 0x26FA},   {0x26FD, 0x26FD},   {0x2705, 0x2705},   {0x270A, 0x270B},   {0x2728, 0x2728},
    {0x274C, 0x274C},   {0x274E, 0x274E},   {0x2753, 0x2755},   {0x2757, 0x2757},   {0x2795, 0x2797},
    {0x27B0, 0x27B0},   {0x27BF, 0x27BF},   {0x2B1B, 0x2B1C},   {0x2B50, 0x2B50},   {0x2B55, 0x2B55},
    {0x2E80, 0x303E},   {0x3041, 0x33FF},   {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xA000, 0xA4CF},
    {0xA960, 0xA97F},   {0xAC00, 0xD7A3},   {0xF900, 0xFAFF},   {0xFE10, 0xFE19},   {0xFE30, 0xFE6F},
    {0xFF00, 0xFF60},   {0xFFE0, 0xFFE6},   {0x16FE0, 0x16FE4}, {0x17000, 0x18CFF}, {0x1B000, 0x1B2FF},
    {0x1F004, 0x1F004}, {0x1F0CF, 0x1F0CF}, {0x1F18E, 0x1F18E}, {0x1F191, 0x1F19A}, {0x1F200, 0x1F251},
    {0x1F300, 0x1F320}, {0x1F32D, 0x1F335}, {0x1F337, 0x1F37C}, {0x1F37E, 0x1F393}, {0x1F3A0, 0x1F3CA},
    {0x1F3CF, 0x1F3D3}, {0x1F3E0, 0x1F3F0}, {0x1F3F4, 0x1F3F4}, {0x1F3F8, 0x1F43E}, {0x1F440, 0x1F440},
    {0x1F442, 0x1F4FC}, {0x1F4FF, 0x1F53D}, {0x1F54B, 0x1F54E}, {0x1F550, 0x1F567}, {0x1F57A, 0x1F57A},
    {0x1F595, 0x1F596}, {0x1F5A4, 0x1F5A4}, {0x1F5FB, 0x1F64F}, {0x1F680, 0x1F6C5}, {0x1F6CC, 0x1F6CC},
    {0x1F6D0, 0x1F6D2}, {0x1F6D5, 0x1F6D7}, {0x1F6DC, 0x1F6DF}, {0x1F6EB, 0x1F6EC}, {0x1F6F4, 0x1F6FC},
    {0x1F7E0, 0x1F7EB}, {0x1F7F0, 0x1F7F0}, {0x1F90C, 0x1F93A}, {0x1F93C, 0x1F945}, {0x1F947, 0x1F9FF},
    {0x1FA70, 0x1FAFF}, {0x20000, 0x2FFFD}, {0x30000, 0x3FFFD},
};

}  // namespace

int glyph_width(const std::string& glyph) {
  if (glyph.empty()) return 0;
  const uint32_t c = code_point(glyph);
  if (c < 0x20 || c == 0x7F) return 1;  // shown as a space
  if (in(kZeroWidth, sizeof(kZeroWidth) / sizeof(kZeroWidth[0]), c)) return 0;
  return in(kWide, sizeof(kWide) / sizeof(kWide[0]), c) ? 2 : 1;
}

int text_width(const std::string& text) {
  int w = 0;
  for (const std::string& g : split_glyphs(text)) w += glyph_width(g);
  return w;
}

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
  const size_t i = static_cast<size_t>(y * cols_ + x);
  // Overwriting half of a two-column glyph blanks its other half, which would draw over this cell.
  if (cells_[i].glyph.empty() && x > 0) cells_[i - 1].glyph = " ";
  if (x + 1 < cols_ && cells_[i + 1].glyph.empty()) cells_[i + 1].glyph = " ";
  cells_[i].glyph = glyph;
  cells_[i].style = style;
}

int Screen::put(int x, int y, const std::string& text, Style style, int max_cols) {
  if (y < 0 || y >= rows_) return x;
  const int start = x;
  const int limit = max_cols < 0 ? cols_ : std::min(cols_, x + max_cols);
  for (const std::string& g : split_glyphs(text)) {
    const int w = glyph_width(g);
    if (w == 0) {
      // A mark joins the glyph it follows (one written by this call), or is dropped.
      if (x > start && x - 1 >= 0) {
        int prev = x - 1;
        if (prev > 0 && at(prev, y).glyph.empty()) --prev;
        cells_[static_cast<size_t>(y * cols_ + prev)].glyph += g;
      }
      continue;
    }
    if (x + w > limit) {
      if (x < limit) set(x, y, " ", style);  // a wide glyph that does not fit leaves a blank
      break;
    }
    const bool control = g.size() == 1 && (static_cast<unsigned char>(g[0]) < 0x20 || g[0] == 0x7f);
    set(x, y, control ? " " : g, style);
    if (w == 2) {
      set(x + 1, y, " ", style);  // clears what a wide glyph there covered
      // The second column marks itself as covered only beside its first (left of the screen, a
      // glyph's visible half stays a blank).
      if (x >= 0) cells_[static_cast<size_t>(y * cols_ + x + 1)].glyph.clear();
    }
    x += w;
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

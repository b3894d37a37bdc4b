// Screen: a grid of one-column glyphs with a colour each, drawn by the dashboard every frame and
// turned into ANSI text. Only rows that differ from the previous frame are sent, so a dashboard
// over ssh costs a few hundred bytes per frame. A glyph takes the columns a terminal gives it: one
// for most, two for East Asian wide characters and emoji (glyph_width), none for combining marks,
// which join the glyph before them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ui::tui {

enum class Color : uint8_t { Default = 0, Red, Green, Yellow, Blue, Magenta, Cyan, White, Gray };

struct Style {
  Color fg = Color::Default;
  bool bold = false;
  bool inverse = false;
  bool operator==(const Style& o) const { return fg == o.fg && bold == o.bold && inverse == o.inverse; }
  bool operator!=(const Style& o) const { return !(*this == o); }
};

struct Cell {
  // One UTF-8 code point (and the marks drawn on it); empty in the second column of a wide glyph.
  std::string glyph = " ";
  Style style;
};

class Screen {
 public:
  Screen(int cols = 80, int rows = 24) { resize(cols, rows); }
  // Clears to blanks at the new size.
  void resize(int cols, int rows);
  void clear();
  int cols() const { return cols_; }
  int rows() const { return rows_; }

  // Writes text from (x, y), clipped at the right edge and at max_cols columns (-1: no limit; a
  // wide glyph that would cross it leaves a blank); control characters show as spaces. Returns
  // the column after the last glyph written.
  int put(int x, int y, const std::string& text, Style style = {}, int max_cols = -1);
  // One glyph (a UTF-8 code point) at (x, y); ignored outside the screen.
  void set(int x, int y, const std::string& glyph, Style style = {});
  // Paints `style` over a row segment (e.g. an inverse title bar), keeping the glyphs.
  void fill_style(int x, int y, int width, Style style);
  const Cell& at(int x, int y) const { return cells_[static_cast<size_t>(y * cols_ + x)]; }

  // One row as plain text (no escapes), for tests.
  std::string row_text(int y) const;
  // One row as ANSI text: glyphs with SGR colour changes, attributes reset at the end.
  std::string row_ansi(int y) const;
  // The escapes that turn `previous` (the last frame sent; empty = unknown) into this frame:
  // cursor moves and the rows that differ. Updates previous.
  std::string diff(std::vector<std::string>& previous) const;

 private:
  int cols_ = 0, rows_ = 0;
  std::vector<Cell> cells_;
};

// Splits UTF-8 text into code points (invalid bytes become '?').
std::vector<std::string> split_glyphs(const std::string& text);
// Columns a terminal gives one code point: 0 (combining marks, joiners, variation selectors),
// 2 (East Asian wide and full-width, emoji) or 1; control characters 1 (put shows them as spaces).
int glyph_width(const std::string& glyph);
// Columns of a whole text, as put lays it out with no limit.
int text_width(const std::string& text);

}  // namespace ui::tui

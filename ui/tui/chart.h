// Line charts in braille: each character cell holds 2×4 dots, so a 40×8 cell chart is 80×32 dots.
// Points are binned by dot column (min..max of each bin drawn, neighbours joined by lines), so a
// chart of a million steps costs one pass over the points and the noise band stays visible.
#pragma once

#include <string>
#include <vector>

#include "ui/run_view.h"
#include "ui/tui/screen.h"

namespace ui::tui {

struct ChartLine {
  const Series* points = nullptr;
  Color color = Color::Cyan;
  std::string name;     // shown in the title with the newest value ("train 1.93  val 2.01")
};

struct ChartSpec {
  std::string title;
  std::vector<ChartLine> lines;  // drawn in order; a later line's colour wins a shared cell
  bool log_y = false;            // log scale (values <= 0 left out), e.g. the loss scale
};

// Draws the chart into the box at (x, y) of w×h cells: a title row, the plot with the y range
// labelled on the left, and a row with the step range. Boxes under 3 rows show the title only.
// "no data yet" while every line is empty.
void draw_chart(Screen& s, int x, int y, int w, int h, const ChartSpec& spec);

// Compact axis and value labels: "0.0123", "3.41", "452k", "1.25M", "65536".
std::string short_number(double v);

}  // namespace ui::tui

// Checks a desktop-app screenshot: every plot area listed in IMAGE.plots (written next to it by the
// app's `screenshot` script command: "title x0 y0 x1 y1 RRGGBB:POINTS...") must hold pixels of each
// of its series' colours, not just the plot background. A series with a single point in view (an
// evaluation, the first telemetry sample) is a dot, so it needs fewer. Prints one line per plot;
// exit 1 on failure.
//   gui_png_check IMAGE.png MIN_PLOTS [MIN_PIXELS_PER_COLOUR]
#include <stb_image.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Rgb {
  int r, g, b;
};

Rgb parse_hex(const std::string& h) {
  const unsigned v = static_cast<unsigned>(std::strtoul(h.c_str(), nullptr, 16));
  return {static_cast<int>((v >> 16) & 0xFF), static_cast<int>((v >> 8) & 0xFF), static_cast<int>(v & 0xFF)};
}

int distance(const unsigned char* p, Rgb c) { return std::abs(p[0] - c.r) + std::abs(p[1] - c.g) + std::abs(p[2] - c.b); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s IMAGE.png MIN_PLOTS [MIN_PIXELS_PER_COLOUR]\n", argv[0]);
    return 2;
  }
  const std::string image = argv[1];
  const int min_plots = std::atoi(argv[2]);
  const int min_pixels = argc > 3 ? std::atoi(argv[3]) : 25;
  int w = 0, h = 0, n = 0;
  unsigned char* px = stbi_load(image.c_str(), &w, &h, &n, 3);
  if (!px) {
    std::fprintf(stderr, "FAIL: cannot read %s\n", image.c_str());
    return 1;
  }
  std::ifstream plots(image + ".plots");
  std::string line;
  int checked = 0, failed = 0;
  while (std::getline(plots, line)) {
    std::istringstream in(line);
    std::string title;
    int x0, y0, x1, y1;
    if (!(in >> title >> x0 >> y0 >> x1 >> y1)) continue;
    std::vector<Rgb> colours;
    std::vector<long> points;
    for (std::string item; in >> item;) {
      colours.push_back(parse_hex(item.substr(0, item.find(':'))));
      points.push_back(item.find(':') == std::string::npos ? 1000 : std::atol(item.c_str() + item.find(':') + 1));
    }
    if (x0 < 0 || y0 < 0 || x1 > w || y1 > h || x1 <= x0 || y1 <= y0 || colours.empty()) {
      std::printf("FAIL %s: bad area %d,%d-%d,%d in a %dx%d image\n", title.c_str(), x0, y0, x1, y1, w, h);
      ++failed;
      continue;
    }
    // A pixel "of" a colour is within a small distance of it (anti-aliased edges are not counted).
    std::vector<int> hits(colours.size(), 0);
    int uniform = 0;
    // The background is the area's most common colour (a corner pixel may lie on a grid line when a
    // tick falls on the plot's edge).
    std::map<int, int> counts;
    for (int y = y0 + 1; y < y1 - 1; ++y)
      for (int x = x0 + 1; x < x1 - 1; ++x) {
        const unsigned char* p = px + (static_cast<size_t>(y) * w + x) * 3;
        ++counts[(p[0] << 16) | (p[1] << 8) | p[2]];
      }
    int bg = 0, bg_count = -1;
    for (const auto& [c, k] : counts)
      if (k > bg_count) bg = c, bg_count = k;
    const Rgb background{(bg >> 16) & 0xFF, (bg >> 8) & 0xFF, bg & 0xFF};
    for (int y = y0 + 1; y < y1 - 1; ++y)
      for (int x = x0 + 1; x < x1 - 1; ++x) {
        const unsigned char* p = px + (static_cast<size_t>(y) * w + x) * 3;
        if (distance(p, background) < 6) ++uniform;
        for (size_t c = 0; c < colours.size(); ++c)
          if (distance(p, colours[c]) <= 45) ++hits[c];
      }
    const int area = (x1 - x0 - 2) * (y1 - y0 - 2);
    bool ok = true;
    std::printf("%s %s: %dx%d area, background %d%%, series pixels", title.c_str(), image.c_str(), x1 - x0, y1 - y0,
                100 * uniform / area);
    for (size_t c = 0; c < colours.size(); ++c) {
      std::printf(" %d", hits[c]);
      const long need = points[c] >= 2 ? min_pixels : 5;
      ok &= hits[c] >= need && points[c] >= 1;
    }
    // Drawn series on a background, not a blank or flooded rectangle.
    ok &= uniform > area / 4 && uniform < area;
    std::printf(" -> %s\n", ok ? "ok" : "FAIL");
    failed += !ok;
    ++checked;
  }
  stbi_image_free(px);
  if (checked < min_plots) {
    std::printf("FAIL: %d plots listed in %s.plots, expected at least %d\n", checked, image.c_str(), min_plots);
    return 1;
  }
  return failed ? 1 : 0;
}

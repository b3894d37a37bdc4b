// The desktop app's font atlas. DejaVu Sans (assets/fonts) draws Latin, Greek, punctuation and the
// arrows; text the app shows in other scripts (a run named 実験-1, a Cyrillic note) gets the glyphs
// of its characters only, from DejaVu where it has them and else from a fallback font of the
// system: DELTADECK_FALLBACK_FONT, then Noto Sans CJK, WenQuanYi, Droid Sans Fallback, then what
// fc-match offers for the first missing character. ImGui 1.86's atlas is fixed once built, so when
// new characters appear it is built again with them between two frames (and re-uploaded), a few
// milliseconds. Characters past U+FFFF (emoji) stay ImGui's '?' (its glyph index is 16-bit here).
#pragma once

#include <imgui.h>

#include <cstdint>
#include <set>
#include <string>

namespace ui {
struct GuiState;
}

namespace app {

// The code points of UTF-8 text, in order; malformed bytes (overlong forms, surrogates, values past
// U+10FFFF, cut-short sequences) are skipped.
std::u32string decode_utf8(const std::string& text);

class GuiFonts {
 public:
  explicit GuiFonts(std::string assets_dir);
  // Builds the atlas at the content scale with every character asked for so far (and the style's
  // sizes at that scale are the caller's). The caller then re-creates the backend's font texture.
  void build(float scale);
  // Collects the characters of the text the state shows (run names, notes, tags, messages, events,
  // the status line) when any of it may have changed; true when the atlas lacks some of them and
  // build() should run. Main thread, between frames.
  bool wants_rebuild(const ui::GuiState& s);
  // After the backend uploaded the atlas (which builds it): for a character asked for that no font
  // in it has, looks for a fallback font (once), then for one more (fc-match, once), and returns
  // true when build() should run again with it; else notes it for take_missing_font_notice. Also
  // true, without the fallbacks, when a fallback left the atlas unbuilt (a file stb_truetype cannot
  // parse).
  bool check_coverage();
  // The fallback font in use ("" when no extra character was needed yet, or none was found), and
  // a line for the status bar once, when characters were needed that no font here has.
  const std::string& fallback_font() const { return fallback_; }
  std::string take_missing_font_notice();

 private:
  void want(const std::string& text);

  std::string assets_dir_;
  std::set<uint32_t> extra_;      // characters beyond the base ranges asked for
  size_t built_extra_ = 0;        // extra_.size() at the last build (extra_ only grows)
  std::string fallback_, second_;   // the fallback font, and one more for what it lacks
  bool fallback_searched_ = false, second_searched_ = false;
  bool notice_due_ = false, notice_given_ = false;
  uint64_t seen_key_ = ~0ull;     // the state's text as of the last scan (a cheap signature)
  ImVector<ImWchar> dejavu_ranges_, fallback_ranges_;  // must live as long as the atlas
};

// Whether the atlas' font draws every character of the text itself (not its '?'), control
// characters aside. Main thread, with a built atlas.
bool font_draws(const std::string& text);

}  // namespace app

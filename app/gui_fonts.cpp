#include "app/gui_fonts.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>

#include "storage/file_util.h"
#include "ui/gui/gui_state.h"

namespace app {

namespace {

constexpr float BASE_FONT_PX = 16.0f;  // at content scale 1
// What DejaVu draws for every run: Latin, Greek (the μ of μP), dashes and quotes, the arrows.
constexpr ImWchar BASE_RANGES[] = {0x0020, 0x00FF, 0x0370, 0x03FF, 0x2010, 0x2027, 0x2190, 0x21FF, 0};
// At most this many extra characters join the atlas (a few thousand CJK glyphs are a few MB of
// texture); later ones keep ImGui's '?'.
constexpr size_t MAX_EXTRA = 4000;

bool in_base(uint32_t c) {
  for (const ImWchar* r = BASE_RANGES; r[0] != 0; r += 2)
    if (c >= r[0] && c <= r[1]) return true;
  return false;
}

// Fonts with CJK glyphs where Debian's packages put them (fonts-noto-cjk, fonts-wqy-microhei,
// fonts-wqy-zenhei, fonts-droid-fallback).
const char* const KNOWN_FALLBACKS[] = {
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
};

// fc-match's pick for a font that has character c, or "" (no fontconfig, or nothing found).
std::string fc_match_for(uint32_t c) {
  char cmd[96];
  std::snprintf(cmd, sizeof cmd, "fc-match -f '%%{file}' ':charset=%x' 2>/dev/null", static_cast<unsigned>(c));
  FILE* p = popen(cmd, "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  pclose(p);
  // Only a TrueType/OpenType file stb_truetype reads (not a Type 1 or bitmap font).
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return out.size() >= s.size() && out.compare(out.size() - s.size(), s.size(), s) == 0;
  };
  if (!(ends_with(".ttf") || ends_with(".ttc") || ends_with(".otf"))) return "";
  return storage::files::exists(out) ? out : "";
}

std::string find_fallback_font(uint32_t first_missing) {
  if (const char* env = std::getenv("DELTADECK_FALLBACK_FONT"); env != nullptr && *env != '\0')
    if (storage::files::exists(env)) return env;
  for (const char* path : KNOWN_FALLBACKS)
    if (storage::files::exists(path)) return path;
  return fc_match_for(first_missing);
}

// Every piece of text the panels show from the state that a user or a run wrote.
void for_each_shown_text(const ui::GuiState& s, const std::function<void(const std::string&)>& f) {
  for (const ui::RunRow& r : s.rows) {
    f(r.name);
    f(r.notes);
    f(r.message);
    for (const std::string& t : r.tags) f(t);
  }
  for (const auto& [id, run] : s.loaded)
    for (const storage::EventRecord& e : run.events) f(e.text);
  f(s.live.view.run_name);
  f(s.live.view.end_message);
  for (const ui::LogRecord& e : s.live.view.events) f(e.text);
  f(s.launcher.draft.name);
  f(s.status);
}

// A cheap signature of that text's sources: when it is unchanged, nothing needs a scan.
uint64_t shown_text_key(const ui::GuiState& s) {
  uint64_t key = s.rows_version * 1000003u;
  for (const auto& [id, run] : s.loaded) key = key * 31 + static_cast<uint64_t>(id) * 7 + run.events.size();
  const std::hash<std::string> h;
  key = key * 31 + static_cast<uint64_t>(s.live.view.events_total);
  key = key * 31 + h(s.live.view.run_name) + 3 * h(s.live.view.end_message);
  key = key * 31 + h(s.launcher.draft.name) + 5 * h(s.status);
  return key;
}

}  // namespace

std::u32string decode_utf8(const std::string& text) {
  std::u32string out;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    // Lead bytes C0, C1 and F5 – FF never start a valid sequence (overlong or past U+10FFFF).
    const int n = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >> 4) == 0xE ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (n == 0 || i + n > text.size()) {
      ++i;  // a stray continuation byte, an invalid lead byte, or a sequence cut short
      continue;
    }
    uint32_t c = n == 1 ? b : b & (0x7F >> n);
    bool ok = true;
    for (int k = 1; k < n; ++k) {
      const auto cb = static_cast<unsigned char>(text[i + k]);
      ok = ok && (cb & 0xC0) == 0x80;
      c = (c << 6) | (cb & 0x3F);
    }
    constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};  // the shortest form's first value
    ok = ok && c >= kLeast[n - 1] && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
    if (!ok) {
      ++i;
      continue;
    }
    out.push_back(c);
    i += n;
  }
  return out;
}

GuiFonts::GuiFonts(std::string assets_dir) : assets_dir_(std::move(assets_dir)) {}

void GuiFonts::want(const std::string& text) {
  for (const char32_t c : decode_utf8(text)) {
    if (c < 0x20 || c > 0xFFFF || in_base(c) || extra_.size() >= MAX_EXTRA) continue;
    extra_.insert(static_cast<uint32_t>(c));
  }
}

bool GuiFonts::wants_rebuild(const ui::GuiState& s) {
  const uint64_t key = shown_text_key(s);
  if (key == seen_key_) return false;
  seen_key_ = key;
  for_each_shown_text(s, [this](const std::string& t) { want(t); });
  return extra_.size() != built_extra_;
}

void GuiFonts::build(float scale) {
  ImGuiIO& io = ImGui::GetIO();
  io.Fonts->Clear();
  const float px = std::round(BASE_FONT_PX * scale);
  const std::string dejavu = assets_dir_.empty() ? "" : assets_dir_ + "/fonts/DejaVuSans.ttf";
  ImFontGlyphRangesBuilder base;
  base.AddRanges(BASE_RANGES);
  for (const uint32_t c : extra_) base.AddChar(static_cast<ImWchar>(c));
  dejavu_ranges_.clear();
  base.BuildRanges(&dejavu_ranges_);
  if (dejavu.empty() || !storage::files::exists(dejavu) ||
      !io.Fonts->AddFontFromFileTTF(dejavu.c_str(), px, nullptr, dejavu_ranges_.Data)) {
    ImFontConfig cfg;
    cfg.SizePixels = std::round(13.0f * scale);
    io.Fonts->AddFontDefault(&cfg);
  }
  built_extra_ = extra_.size();
  if (extra_.empty() || (fallback_.empty() && second_.empty())) return;
  // The characters DejaVu lacks come from the fallbacks, merged into the same font (the first
  // font's glyphs win where several have one).
  ImFontGlyphRangesBuilder more;
  for (const uint32_t c : extra_) more.AddChar(static_cast<ImWchar>(c));
  fallback_ranges_.clear();
  more.BuildRanges(&fallback_ranges_);
  ImFontConfig merge;
  merge.MergeMode = true;
  merge.OversampleH = 1;  // CJK glyphs are dense; horizontal oversampling only doubles the atlas
  for (std::string* path : {&fallback_, &second_}) {
    if (!path->empty() && io.Fonts->AddFontFromFileTTF(path->c_str(), px, &merge, fallback_ranges_.Data) == nullptr)
      path->clear();  // unreadable
  }
}

bool GuiFonts::check_coverage() {
  ImFontAtlas* atlas = ImGui::GetIO().Fonts;
  // A fallback stb_truetype could not parse leaves the atlas unbuilt (no text at all): without it.
  if (!atlas->IsBuilt() || atlas->Fonts.empty() || atlas->Fonts[0]->Glyphs.empty()) {
    if (fallback_.empty() && second_.empty()) return false;
    fallback_.clear();
    second_.clear();
    fallback_searched_ = second_searched_ = true;
    notice_due_ = true;
    return true;
  }
  const ImFont* font = atlas->Fonts[0];
  for (const uint32_t c : extra_) {
    if (font->FindGlyphNoFallback(static_cast<ImWchar>(c)) != nullptr) continue;
    // The first character no font in the atlas has: a fallback for it, then (what that one lacks,
    // another script) what fontconfig has for it, each looked for once.
    if (!fallback_searched_) {
      fallback_searched_ = true;
      fallback_ = find_fallback_font(c);
      if (!fallback_.empty()) return true;
    }
    if (!second_searched_) {
      second_searched_ = true;
      second_ = fc_match_for(c);
      if (second_ == fallback_) second_.clear();
      if (!second_.empty()) return true;
    }
    notice_due_ = true;
    return false;
  }
  return false;
}

std::string GuiFonts::take_missing_font_notice() {
  if (!notice_due_ || notice_given_) return "";
  notice_given_ = true;
  return "Some names use characters no font here has (shown as '?'): install one that has them (Debian: "
         "fonts-noto-cjk, fonts-noto-core) or point DELTADECK_FALLBACK_FONT at a .ttf/.ttc/.otf file";
}

bool font_draws(const std::string& text) {
  // The atlas' own font: ImGui::GetFont() is set by NewFrame, and dangles after a rebuild until then.
  const ImFontAtlas* atlas = ImGui::GetIO().Fonts;
  if (atlas->Fonts.empty()) return false;
  const ImFont* font = atlas->Fonts[0];
  for (const char32_t c : decode_utf8(text)) {
    if (c < 0x20) continue;
    if (c > 0xFFFF || font->FindGlyphNoFallback(static_cast<ImWchar>(c)) == nullptr) return false;
  }
  return true;
}

}  // namespace app

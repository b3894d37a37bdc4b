// The terminal dashboard without a terminal: the screen grid and its diff, braille charts, the
// layout at a few sizes, and what each key does.
#include <gtest/gtest.h>

#include "ui/tui/chart.h"
#include "ui/tui/dashboard.h"
#include "ui/tui/screen.h"

namespace {

using namespace ui::tui;

bool contains(const Screen& s, const std::string& text) {
  for (int y = 0; y < s.rows(); ++y)
    if (s.row_text(y).find(text) != std::string::npos) return true;
  return false;
}

int braille_cells(const Screen& s) {
  int n = 0;
  for (int y = 0; y < s.rows(); ++y)
    for (int x = 0; x < s.cols(); ++x) {
      const std::string& g = s.at(x, y).glyph;
      // U+2801..U+28FF: E2 A0 81 .. E2 A3 BF
      n += g.size() == 3 && static_cast<unsigned char>(g[0]) == 0xE2 && (static_cast<unsigned char>(g[1]) & 0xFC) == 0xA0;
    }
  return n;
}

ui::RunView sample_view() {
  ui::RunView v;
  v.run_id = 3;
  v.run_name = "demo";
  v.model = "gpt/tiny";
  v.params = 1200000;
  v.devices = "cpu";
  v.total_steps = 100;
  v.status = "running";
  for (int64_t i = 1; i <= 50; ++i) {
    ui::apply_event(v, trainer::MetricsEvent{i, i * 2048, i * 0.5,
                                             {{"loss", 5.0 / (1 + 0.1 * i)}, {"grad_norm", 1.0 / i}, {"lr", 1e-3},
                                              {"loss_scale", 1}, {"tokens_per_s", 4000 + 10 * i}}});
  }
  ui::apply_event(v, trainer::MetricsEvent{50, 50 * 2048, 25, {{"val_loss", 1.9}, {"val_ppl", 6.7}}});
  ui::apply_event(v, trainer::CheckpointEvent{50, "/runs/demo/checkpoints/step_00000050", 4000000, "", {}});
  return v;
}

TEST(TuiScreen, PutClipsAndDiffSendsOnlyChangedRows) {
  Screen s(10, 3);
  EXPECT_EQ(s.put(7, 1, "abcdef"), 10);
  EXPECT_EQ(s.row_text(1), "       abc");
  s.put(0, 2, "x\ty", {}, 2);
  EXPECT_EQ(s.row_text(2), "x         ");  // tab shown as a space, then clipped at 2 columns
  std::vector<std::string> prev;
  const std::string first = s.diff(prev);
  EXPECT_NE(first.find("\x1b[2J"), std::string::npos);  // unknown previous frame: clear first
  EXPECT_EQ(s.diff(prev), "");                           // nothing changed
  s.put(0, 0, "hi");
  const std::string second = s.diff(prev);
  EXPECT_NE(second.find("\x1b[1;1H"), std::string::npos);
  EXPECT_EQ(second.find("\x1b[2;1H"), std::string::npos);
  EXPECT_EQ(split_glyphs("a\xe2\xa3\xbf\xff").size(), 3u);  // ASCII, one braille glyph, one bad byte
  EXPECT_EQ(split_glyphs("\xff")[0], "?");
}

TEST(TuiScreen, WideGlyphsTakeTwoColumnsAndMarksNone) {
  EXPECT_EQ(glyph_width("a"), 1);
  EXPECT_EQ(glyph_width("\xe6\x97\xa5"), 2);      // U+65E5, CJK
  EXPECT_EQ(glyph_width("\xf0\x9f\x9a\x80"), 2);  // U+1F680, an emoji
  EXPECT_EQ(glyph_width("\xcc\x81"), 0);          // U+0301, a combining acute accent
  EXPECT_EQ(glyph_width("\xe2\xa3\xbf"), 1);      // braille, the charts' dots
  EXPECT_EQ(glyph_width("\xe2\x94\x80"), 1);      // box drawing
  EXPECT_EQ(text_width("\xe6\x97\xa5\xe6\x9c\xac-e\xcc\x81"), 6);  // 日本-é: 2 + 2 + 1 + 1

  Screen s(8, 3);
  EXPECT_EQ(s.put(0, 0, "\xe6\x97\xa5\xe6\x9c\xacx"), 5);  // 日本x
  EXPECT_EQ(s.row_text(0), "\xe6\x97\xa5\xe6\x9c\xacx   ");
  EXPECT_EQ(s.at(1, 0).glyph, "");  // the second column of 日
  // The ANSI row sends each glyph once: the terminal moves two columns for it.
  const std::string ansi = s.row_ansi(0);
  EXPECT_NE(ansi.find("\xe6\x97\xa5\xe6\x9c\xacx   \x1b[0m"), std::string::npos);
  // Writing over the second half of 日 blanks its first half.
  s.put(1, 0, "z");
  EXPECT_EQ(s.row_text(0), " z\xe6\x9c\xacx   ");
  // A wide glyph that would cross the limit leaves a blank and ends the text.
  EXPECT_EQ(s.put(0, 1, "ab\xe6\x97\xa5" "c", {}, 3), 2);
  EXPECT_EQ(s.row_text(1), "ab      ");
  // A mark joins the glyph before it; one at the start of a text is dropped.
  EXPECT_EQ(s.put(0, 2, "\xcc\x81" "e\xcc\x81!"), 2);
  EXPECT_EQ(s.at(0, 2).glyph, "e\xcc\x81");
  EXPECT_EQ(s.at(1, 2).glyph, "!");
  // Started left of the screen, a wide glyph's visible half is a blank.
  s.put(-1, 2, "\xe6\x97\xa5" "x");
  EXPECT_EQ(s.row_text(2), " x      ");
}

TEST(TuiDashboard, WideRunNameKeepsTheHeaderOneRowWide) {
  ui::RunView v = sample_view();
  v.run_name = "\xe5\xae\x9f\xe9\xa8\x93-\xf0\x9f\x9a\x80";  // 実験-🚀
  for (int w : {80, 61}) {
    Screen s(w, 24);
    draw_dashboard(s, v, {});
    SCOPED_TRACE(std::to_string(w));
    EXPECT_EQ(text_width(s.row_text(0)), w);  // the terminal draws exactly one row
    EXPECT_NE(s.row_text(0).find("RUNNING"), std::string::npos);
  }
}

TEST(TuiChart, DrawsBrailleWithTheRangeLabelled) {
  ui::Series rising;
  for (int64_t i = 0; i <= 100; ++i) rising.push_back({i, 0, 0, static_cast<double>(i)});
  Screen s(40, 10);
  draw_chart(s, 0, 0, 40, 10, {"ramp", {{&rising, Color::Cyan, ""}}, false});
  EXPECT_NE(s.row_text(0).find("ramp  100"), std::string::npos) << s.row_text(0);
  EXPECT_NE(s.row_text(1).find("100"), std::string::npos);  // max at the top
  EXPECT_NE(s.row_text(8).find("0"), std::string::npos);    // min at the bottom
  EXPECT_NE(s.row_text(9).find("step 0"), std::string::npos);
  EXPECT_GE(braille_cells(s), 32);  // a line across the plot's 32 columns
  // Rising: the top row's dots are at the right, the bottom row's at the left.
  const std::string top = s.row_text(1), bottom = s.row_text(8);
  EXPECT_GT(top.rfind("\xe2"), bottom.rfind("\xe2"));

  Screen empty(40, 10);
  ui::Series none;
  draw_chart(empty, 0, 0, 40, 10, {"loss", {{&none, Color::Cyan, ""}}, false});
  EXPECT_TRUE(contains(empty, "no data yet"));
  EXPECT_EQ(braille_cells(empty), 0);
}

TEST(TuiDashboard, LaysOutEverySectionAtCommonSizes) {
  const ui::RunView v = sample_view();
  for (auto [w, h] : {std::pair{120, 40}, std::pair{80, 24}, std::pair{60, 18}}) {
    Screen s(w, h);
    draw_dashboard(s, v, {});
    SCOPED_TRACE(std::to_string(w) + "x" + std::to_string(h));
    EXPECT_TRUE(contains(s, "demo (run 3)"));
    EXPECT_TRUE(contains(s, "RUNNING"));
    EXPECT_TRUE(contains(s, "step 50/100"));
    EXPECT_TRUE(contains(s, "loss"));
    EXPECT_TRUE(contains(s, "GPUs  no telemetry"));
    EXPECT_TRUE(contains(s, "checkpoint saved at step 50"));
    EXPECT_TRUE(contains(s, "save & quit"));
    EXPECT_GT(braille_cells(s), 20);
  }
  Screen wide(120, 40);
  draw_dashboard(wide, v, {});
  EXPECT_TRUE(contains(wide, "grad norm"));
  EXPECT_TRUE(contains(wide, "lr (loss scaling off)"));  // the scale is 1 throughout
  EXPECT_TRUE(contains(wide, "tokens/s"));
  EXPECT_TRUE(contains(wide, "val 1.9"));

  // The common 80x24 terminal still shows all four charts (2x2).
  Screen standard(80, 24);
  draw_dashboard(standard, v, {});
  EXPECT_TRUE(contains(standard, "grad norm"));
  EXPECT_TRUE(contains(standard, "tokens/s"));

  Screen tiny(40, 10);
  draw_dashboard(tiny, v, {});
  EXPECT_TRUE(contains(tiny, "too small"));
}

TEST(TuiDashboard, LossScaleChartWhenScalingIsOn) {
  ui::RunView v = sample_view();
  ui::apply_event(v, trainer::MetricsEvent{51, 0, 26, {{"loss", 1.0}, {"loss_scale", 32768}}});
  Screen s(120, 40);
  draw_dashboard(s, v, {});
  EXPECT_TRUE(contains(s, "loss scale  33k"));
  EXPECT_FALSE(contains(s, "loss scaling off"));
}

TEST(TuiDashboard, GpuTableShowsEachGpu) {
  ui::RunView v = sample_view();
  ui::apply_event(v, trainer::MetricsEvent{50, 0, 25, {{"gpu0.util", 97}, {"gpu0.mem_used_gib", 70.5}, {"gpu0.power_w", 650},
                                                      {"gpu0.temp_c", 61}, {"gpu1.util", 12}}});
  Screen s(120, 40);
  draw_dashboard(s, v, {});
  EXPECT_TRUE(contains(s, "GPU   util"));
  EXPECT_TRUE(contains(s, "70.5 GiB"));
  EXPECT_TRUE(contains(s, "650 W"));
  EXPECT_TRUE(contains(s, "61°C"));
}

TEST(TuiKeys, PauseSaveQuitAndHelp) {
  ui::RunView v = sample_view();
  DashboardState st;
  EXPECT_EQ(handle_key(st, 'p', v), Action::Pause);
  v.status = "paused";
  EXPECT_EQ(handle_key(st, 'p', v), Action::Resume);
  v.status = "running";
  EXPECT_EQ(handle_key(st, 's', v), Action::SaveNow);

  EXPECT_EQ(handle_key(st, 'q', v), Action::None);
  EXPECT_TRUE(st.confirm_quit);
  Screen s(80, 24);
  draw_dashboard(s, v, st);
  EXPECT_TRUE(contains(s, "Save a checkpoint and quit? [y/N]"));
  EXPECT_EQ(handle_key(st, 'n', v), Action::None);  // anything but y cancels
  EXPECT_FALSE(st.confirm_quit);
  EXPECT_EQ(st.message, "quit cancelled");
  handle_key(st, 'q', v);
  EXPECT_EQ(handle_key(st, 'y', v), Action::Stop);

  EXPECT_EQ(handle_key(st, '?', v), Action::None);
  EXPECT_TRUE(st.help);
  draw_dashboard(s, v, st);
  EXPECT_TRUE(contains(s, "pause / resume"));
  EXPECT_EQ(handle_key(st, 'x', v), Action::None);
  EXPECT_FALSE(st.help);

  v.status = "stopping";
  EXPECT_EQ(handle_key(st, 'p', v), Action::None);
  EXPECT_EQ(handle_key(st, 's', v), Action::None);
  EXPECT_EQ(st.message, "the run is stopping");
}

// Function, arrow and Alt keys send escape sequences whose letters are command keys (F1 = ESC O P
// would pause, F4 = ESC O S save, F2 = ESC O Q quit): none of their bytes reach handle_key.
TEST(TuiKeys, EscapeSequencesAreNotCommands) {
  const std::string esc = "\x1b";
  for (const std::string& seq : {esc + "OP", esc + "OQ", esc + "OS", esc + "[15~", esc + "[1;5P", esc + "[A",
                                esc + "p", esc + "[200~"}) {
    EXPECT_EQ(typed_keys(seq), "") << seq.substr(1);
    EXPECT_EQ(typed_keys("s" + seq + "p"), "sp") << seq.substr(1);
  }
  EXPECT_EQ(typed_keys(esc), esc);  // the Esc key closes boxes
  EXPECT_EQ(typed_keys("q" + esc), "q" + esc);
  EXPECT_EQ(typed_keys(esc + esc + "OP"), esc);
  EXPECT_EQ(typed_keys("p?s"), "p?s");
}

}  // namespace

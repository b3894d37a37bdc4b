// The desktop app's panels, run headless on an ImGui context with no backend (STYLE.md §9): a few
// frames on fake state, then what they drew and the actions they emitted.
#include <gtest/gtest.h>

#include <imgui.h>

#include <cmath>

#include "ui/gui/panels.h"

namespace {

class Headless : public ::testing::Test {
 protected:
  void SetUp() override {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(1280, 800);
    io.DeltaTime = 1.0f / 60;
    unsigned char* px = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&px, &w, &h);  // a font atlas is all NewFrame needs
    io.KeyMap[ImGuiKey_Space] = 32;
    io.KeyMap[ImGuiKey_Enter] = 13;
    io.KeyMap[ImGuiKey_Escape] = 27;
  }
  void TearDown() override { ImGui::DestroyContext(); }
  // One frame of the whole window; returns the vertices it drew.
  int frame(ui::GuiState& s) {
    ImGui::NewFrame();
    ui::draw_main(s);
    ImGui::Render();
    return ImGui::GetDrawData()->TotalVtxCount;
  }
};

void fill_history(ui::RunHistory& h, int64_t n, double lr_scale = 1.0) {
  for (int64_t i = 1; i <= n; ++i) {
    h.append(i, i * 1000, i * 0.1, "loss", 3.0 + std::sin(i * 0.01) + (i == n / 2 ? 50 : 0));
    h.append(i, i * 1000, i * 0.1, "lr", 1e-3 * lr_scale);
    if (i % 100 == 0) h.append(i, i * 1000, i * 0.1, "val_loss", 3.1);
  }
}

}  // namespace

// 100k points per series: the dashboard draws a few thousand vertices, not hundreds of thousands,
// because each series is reduced to its pixel columns.
TEST_F(Headless, DashboardDrawsReducedSeries) {
  ui::GuiState s;
  s.tab = ui::Tab::Live;
  s.live.active = true;
  s.live.view.run_name = "fake";
  s.live.view.status = "running";
  s.live.view.total_steps = 100000;
  fill_history(s.live.history, 100000);
  frame(s);
  const int vtx = frame(s);
  const ui::PlotState& loss = s.dashboard.plots.at("loss");
  EXPECT_EQ(loss.drawn_frame, ImGui::GetFrameCount());
  EXPECT_GT(loss.area_max.x - loss.area_min.x, 200);
  ASSERT_EQ(loss.cache.raw.size(), 2u);  // loss and val_loss
  const auto& cols = loss.cache.raw[0].columns;
  EXPECT_LE(cols.size(), static_cast<size_t>(loss.area_max.x - loss.area_min.x) + 1);
  double top = 0;
  for (const auto& c : cols) top = std::max(top, c.y_max);
  EXPECT_DOUBLE_EQ(top, 53.0 + std::sin(50000 * 0.01)) << "the one spike survives the reduction";
  EXPECT_LT(vtx, 150000) << "vertices drawn for 2 x 100k points";
  EXPECT_GT(vtx, 1000);
}

TEST_F(Headless, WheelOverAPlotZoomsTheSharedXRange) {
  ui::GuiState s;
  s.tab = ui::Tab::Live;
  s.live.active = true;
  s.live.view.status = "running";
  fill_history(s.live.history, 1000);
  frame(s);
  frame(s);
  const ui::PlotState& lr = s.dashboard.plots.at("learning rate");
  ImGuiIO& io = ImGui::GetIO();
  io.MousePos = ImVec2((lr.area_min.x + lr.area_max.x) / 2, (lr.area_min.y + lr.area_max.y) / 2);
  frame(s);  // hover
  io.MouseWheel = 2;
  frame(s);
  io.MouseWheel = 0;
  EXPECT_FALSE(s.dashboard.x.auto_fit);
  EXPECT_GT(s.dashboard.x.x0, 1);
  EXPECT_LT(s.dashboard.x.x1, 1000);
  EXPECT_LT(s.dashboard.x.x1 - s.dashboard.x.x0, 999 * 0.8);
}

TEST_F(Headless, SpacePausesTheLiveRun) {
  ui::GuiState s;
  s.tab = ui::Tab::Live;
  s.live.active = true;
  s.live.view.status = "running";
  fill_history(s.live.history, 100);
  ImGui::GetIO().MousePos = ImVec2(-1, -1);
  frame(s);
  frame(s);
  s.actions.clear();
  ImGui::GetIO().KeysDown[32] = true;
  frame(s);
  ImGui::GetIO().KeysDown[32] = false;
  ASSERT_EQ(s.actions.size(), 1u);
  auto* cmd = std::get_if<ui::act::SendCommand>(&s.actions[0]);
  ASSERT_TRUE(cmd);
  EXPECT_EQ(cmd->command, trainer::Command::Pause);
}

TEST_F(Headless, LauncherShowsTheValidatorsProblemsByKey) {
  ui::GuiState s;
  s.tab = ui::Tab::Launch;
  s.launcher.draft.data.train = {"text:/nowhere/*"};
  s.launcher.draft.train.lr = -1;
  s.launcher.draft.train.steps = 0;
  frame(s);
  frame(s);
  bool lr = false, steps = false;
  for (const auto& e : s.launcher.errors) {
    lr |= e.rfind("train.lr:", 0) == 0;
    steps |= e.rfind("train.steps:", 0) == 0;
  }
  EXPECT_TRUE(lr);
  EXPECT_TRUE(steps);
  EXPECT_TRUE(s.actions.empty());
}

TEST_F(Headless, RunsTableFiltersAndCompareColoursRuns) {
  ui::GuiState s;
  s.rows_loaded = true;
  for (int i = 1; i <= 3; ++i) {
    ui::RunRow r;
    r.id = i;
    r.name = i == 2 ? "hybrid-x" : "demo-" + std::to_string(i);
    r.status = "finished";
    r.config = {{"train.lr", i == 1 ? "0.003" : "0.001"}};
    s.rows.push_back(r);
    fill_history(s.loaded[i].history, 500, i);
    s.loaded[i].loaded_once = true;
  }
  s.tab = ui::Tab::Runs;
  s.runs.filter_text = "demo";
  s.runs.filter = ui::parse_filter("demo");
  frame(s);
  frame(s);
  EXPECT_EQ(s.runs.order.size(), 2u);
  EXPECT_EQ(s.rows[s.runs.order[0]].id, 3);  // newest first by default
  s.tab = ui::Tab::Compare;
  s.select_tab = true;
  s.compare.runs = {1, 3};
  frame(s);
  frame(s);
  const ui::PlotState& loss = s.compare.plots.at("loss");
  ASSERT_EQ(loss.colors.size(), 2u);
  EXPECT_EQ(loss.colors[0], ui::series_color(0));
  EXPECT_EQ(loss.colors[1], ui::series_color(1));
}

// Closing the window during a run asks first; Enter takes the default, stop with a checkpoint.
TEST_F(Headless, CloseDuringARunAsksAndDefaultsToStopWithCheckpoint) {
  ui::GuiState s;
  s.live.active = true;
  s.live.view.run_name = "fake";
  s.live.view.status = "running";
  s.close_requested = true;
  frame(s);
  frame(s);
  EXPECT_TRUE(ImGui::IsPopupOpen("Close deltadeck?", ImGuiPopupFlags_AnyPopupId));
  EXPECT_FALSE(s.quit);
  EXPECT_TRUE(s.actions.empty());
  ImGui::GetIO().KeysDown[13] = true;
  frame(s);
  ImGui::GetIO().KeysDown[13] = false;
  EXPECT_TRUE(s.quit);
  ASSERT_EQ(s.actions.size(), 1u);
  auto* cmd = std::get_if<ui::act::SendCommand>(&s.actions[0]);
  ASSERT_TRUE(cmd);
  EXPECT_EQ(cmd->command, trainer::Command::Stop);
  // Escape instead cancels the close.
  ui::GuiState t;
  t.live = s.live;
  t.close_requested = true;
  frame(t);
  frame(t);
  ImGui::GetIO().KeysDown[27] = true;
  frame(t);
  ImGui::GetIO().KeysDown[27] = false;
  EXPECT_FALSE(t.quit);
  EXPECT_FALSE(t.close_requested);
  EXPECT_TRUE(t.actions.empty());
}

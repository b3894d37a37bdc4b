// The desktop app's panels, run headless on an ImGui context with no backend (STYLE.md §9): a few
// frames on fake state, then what they drew and the actions they emitted.
#include <gtest/gtest.h>

#include <imgui.h>
#include <imgui_internal.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "ui/gui/panels.h"
#include "ui/gui/status_style.h"

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
  // One frame of the whole window; returns the text it drew, read back from the glyph quads of the
  // draw data (a glyph's first vertex carries its top-left atlas coordinates), without spaces
  // (blanks draw nothing). has() strips the spaces of what it looks for.
  std::string frame_text(ui::GuiState& s) {
    frame(s);
    std::map<std::pair<float, float>, ImWchar> glyph_at;
    for (const ImFontGlyph& g : ImGui::GetFont()->Glyphs)
      if (g.Visible) glyph_at[{g.U0, g.V0}] = static_cast<ImWchar>(g.Codepoint);
    std::string out;
    const ImDrawData* dd = ImGui::GetDrawData();
    for (int l = 0; l < dd->CmdListsCount; ++l)
      for (const ImDrawVert& v : dd->CmdLists[l]->VtxBuffer) {
        auto it = glyph_at.find({v.uv.x, v.uv.y});
        if (it != glyph_at.end() && it->second < 128) out += static_cast<char>(it->second);
      }
    return out;
  }
  // Moves the mouse over the top-level window (or popup) `window` until the item `label` is
  // hovered, then clicks it; false when it is not found.
  bool click(ui::GuiState& s, const char* window, const char* label) {
    ImGuiWindow* w = ImGui::FindWindowByName(window);
    if (!w) return false;
    const ImGuiID id = ImHashStr(label, 0, w->ID);
    ImGuiIO& io = ImGui::GetIO();
    const ImVec2 pos = w->Pos, size = w->Size;
    for (float y = pos.y + 2; y < pos.y + size.y; y += 6)
      for (float x = pos.x + 2; x < pos.x + size.x; x += 12) {
        io.MousePos = ImVec2(x, y);
        frame(s);
        if (ImGui::GetCurrentContext()->HoveredId != id) continue;
        io.MouseDown[0] = true;
        frame(s);
        io.MouseDown[0] = false;
        frame(s);
        return true;
      }
    return false;
  }
  static bool has(const std::string& text, std::string what) {
    what.erase(std::remove(what.begin(), what.end(), ' '), what.end());
    return text.find(what) != std::string::npos;
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

// Muon's learning rate has a field of its own while Muon is the optimizer, and a problem with it
// shows there, not among the keys no field shows.
TEST_F(Headless, LauncherShowsMuonsLearningRateWithMuon) {
  ui::GuiState s;
  s.tab = ui::Tab::Launch;
  auto shown = [&] {
    return std::find(s.launcher.form_keys.begin(), s.launcher.form_keys.end(), "train.muon_lr") !=
           s.launcher.form_keys.end();
  };
  frame(s);
  EXPECT_FALSE(shown());
  s.launcher.draft.train.optimizer = "muon";
  s.launcher.draft.train.muon_lr = -1;
  s.launcher.dirty_validation = true;
  frame(s);
  frame(s);
  EXPECT_TRUE(shown());
  EXPECT_TRUE(std::any_of(s.launcher.errors.begin(), s.launcher.errors.end(),
                          [](const std::string& e) { return e.rfind("train.muon_lr:", 0) == 0; }));
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

// Closing the window during a run asks first; Enter takes the default, stop with a checkpoint and
// close once the run has stopped (the app carries it out).
TEST_F(Headless, CloseDuringARunAsksAndDefaultsToStopWithCheckpoint) {
  ui::GuiState s;
  s.live.active = true;
  s.live.view.run_name = "fake";
  s.live.view.status = "running";
  s.close.requested = true;
  frame(s);
  const std::string asked = frame_text(s);
  EXPECT_TRUE(ImGui::IsPopupOpen("Close deltadeck?", ImGuiPopupFlags_AnyPopupId));
  EXPECT_TRUE(has(asked, "Stop with checkpoint and close")) << asked;
  EXPECT_FALSE(s.quit);
  EXPECT_TRUE(s.actions.empty());
  ImGui::GetIO().KeysDown[13] = true;
  frame(s);
  ImGui::GetIO().KeysDown[13] = false;
  ASSERT_EQ(s.actions.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ui::act::StopAndClose>(s.actions[0]));
  EXPECT_FALSE(s.close.requested);
  // Escape instead cancels the close.
  ui::GuiState t;
  t.live = s.live;
  t.close.requested = true;
  frame(t);
  frame(t);
  ImGui::GetIO().KeysDown[27] = true;
  frame(t);
  ImGui::GetIO().KeysDown[27] = false;
  EXPECT_FALSE(t.quit);
  EXPECT_FALSE(t.close.requested);
  EXPECT_TRUE(t.actions.empty());
}

// A run already stopping when the window is closed: the dialog says so and offers to close once it
// has stopped; an export still writing is named too.
TEST_F(Headless, CloseWhileStoppingAndExportingSaysWhatItWaitsFor) {
  ui::GuiState s;
  s.live.active = true;
  s.live.view.run_name = "fake";
  s.live.view.status = "stopping";
  s.file_tasks = 1;
  s.close.requested = true;
  frame(s);
  const std::string text = frame_text(s);
  EXPECT_TRUE(has(text, "It is stopping: finishing its step and saving a checkpoint.")) << text;
  EXPECT_TRUE(has(text, "Close when it has stopped")) << text;
  EXPECT_TRUE(has(text, "1 export or checksum task(s) still writing")) << text;
}

// Confirmed: while the run stops the window shows what it waits for, the seconds counting, and
// "Quit now"; nothing else is asked of the app until the user quits at once.
TEST_F(Headless, ClosingShowsTheStopInProgress) {
  ui::GuiState s;
  s.live.active = true;
  s.live.view.run_name = "fake";
  s.live.view.status = "stopping";
  s.live.view.step = 42;
  s.live.view.total_steps = 100;
  s.quit = true;
  s.close.closing = true;
  frame(s);
  const std::string text = frame_text(s);
  EXPECT_TRUE(ImGui::IsPopupOpen("Closing deltadeck", ImGuiPopupFlags_AnyPopupId));
  EXPECT_GE(s.close.closing_since, 0.0);
  EXPECT_TRUE(has(text, "Stopping run 'fake'... saving a checkpoint")) << text;
  EXPECT_TRUE(has(text, "Step 42 of 100.")) << text;
  EXPECT_TRUE(has(text, "Quit now")) << text;
  EXPECT_TRUE(s.actions.empty());
  ASSERT_TRUE(click(s, "Closing deltadeck", "Quit now"));
  ASSERT_EQ(s.actions.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ui::act::QuitNow>(s.actions[0]));
}

namespace {

ui::GuiState failed_gpu_run(const std::string& devices, const std::string& blocked) {
  ui::GuiState s;
  s.tab = ui::Tab::Live;
  s.live.active = true;
  s.live.view.run_id = 7;
  s.live.view.run_name = "big";
  s.live.view.devices = devices;
  s.live.view.status = "failed";
  s.live.view.step = 230;
  s.live.view.end_message = "rank 1 of 2: averaging gradients failed: NCCL error";
  s.live.view.checkpoints = {{200, "runs/big/checkpoints/step_00000200", 1000}};
  s.cuda_blocked = blocked;
  s.exe_path = "/opt/dd/deltadeck";
  s.launcher.runs_dir = "my runs";
  fill_history(s.live.history, 230);
  return s;
}

}  // namespace

// A multi-GPU failure that blocked CUDA in this process: the window stays on the failure, says
// why, and offers a new process (and the exact command) instead of a resume here.
TEST_F(Headless, FailedRunWithTheGpuBlockedOffersANewProcess) {
  ui::GuiState s = failed_gpu_run("0,1", "rank 1 failed in a multi-GPU run (NCCL error)");
  frame(s);
  const std::string text = frame_text(s);
  EXPECT_TRUE(has(text, "The run failed at step 230: rank 1 of 2: averaging gradients failed: NCCL error"))
      << text;
  EXPECT_TRUE(has(text, "This process can no longer use the GPU: rank 1 failed in a multi-GPU run (NCCL error)"))
      << text;
  EXPECT_TRUE(has(text, "Resume in a new process"));
  EXPECT_TRUE(has(text, "/opt/dd/deltadeck train --resume 7 --runs-dir 'my runs'")) << text;
  EXPECT_EQ(ui::resume_blocker(s, s.live.view.devices).find("this process can no longer use the GPU"), 0u);
  // The same failure of a CPU run: nothing is blocked, it may resume here.
  ui::GuiState c = failed_gpu_run("cpu:2", "rank 1 failed in a multi-GPU run (NCCL error)");
  frame(c);
  const std::string cpu = frame_text(c);
  EXPECT_FALSE(has(cpu, "can no longer use the GPU")) << cpu;
  EXPECT_TRUE(has(cpu, "Resume here from step 200")) << cpu;
  EXPECT_EQ(ui::resume_blocker(c, c.live.view.devices), "");
}

// The launcher refuses a GPU run once CUDA is blocked here, with the reason next to Start; a CPU
// draft may still start.
TEST_F(Headless, LauncherRefusesAGpuRunWithTheReasonNextToStart) {
  ui::GuiState s;
  s.tab = ui::Tab::Launch;
  s.launcher.draft.run.devices = "0";
  s.cuda_blocked = "rank 0 failed in a multi-GPU run (NCCL timeout)";
  frame(s);
  const std::string text = frame_text(s);
  EXPECT_TRUE(has(text, "Not here: this process can no longer use the GPU: rank 0 failed in a multi-GPU run (NCCL "
                      "timeout)"))
      << text;
  s.launcher.draft.run.devices = "cpu";
  const std::string cpu = frame_text(s);
  EXPECT_FALSE(has(cpu, "Not here:")) << cpu;
}

// A refused resume lists each mismatch (field, both values) and the checkpoints it skipped.
TEST_F(Headless, ResumeNoticeListsMismatchesAndSkippedCheckpoints) {
  ui::GuiState s;
  s.resume_notice.open = true;
  s.resume_notice.refused = true;
  s.resume_notice.run_name = "demo";
  s.resume_notice.checkpoint = "runs/demo/checkpoints/step_00000100";
  s.resume_notice.mismatches = {"model.d: the checkpoint has 64, this run has 128",
                                "world_size: the checkpoint has 2, this run has 1"};
  s.resume_notice.skipped = {"runs/demo/checkpoints/step_00000200: model.safetensors: sha256 differs"};
  frame(s);
  const std::string text = frame_text(s);
  EXPECT_TRUE(has(text, "Run 'demo' was not resumed; nothing was started.")) << text;
  EXPECT_TRUE(has(text, "model.d"));
  EXPECT_TRUE(has(text, "the checkpoint has 64, this run has 128"));
  EXPECT_TRUE(has(text, "world_size"));
  EXPECT_TRUE(has(text, "Skipped 1 damaged or unfinished checkpoint(s):")) << text;
  EXPECT_TRUE(has(text, "step_00000200: model.safetensors: sha256 differs"));
  ImGui::GetIO().KeysDown[27] = true;
  frame(s);
  ImGui::GetIO().KeysDown[27] = false;
  EXPECT_FALSE(s.resume_notice.open);
}

// preempted and diverged have colours of their own (not the neutral grey of unknown statuses) in
// the runs browser and the dashboard, and a tooltip that says what they mean.
TEST_F(Headless, NewStatusesHaveTheirOwnColours) {
  auto same = [](ImVec4 a, ImVec4 b) { return a.x == b.x && a.y == b.y && a.z == b.z; };
  const ImVec4 grey = ui::status_color("no such status");
  for (const char* st : {"preempted", "diverged", "stopped", "failed", "interrupted", "running"})
    EXPECT_FALSE(same(ui::status_color(st), grey)) << st;
  EXPECT_FALSE(same(ui::status_color("preempted"), ui::status_color("stopped")));
  EXPECT_FALSE(same(ui::status_color("diverged"), ui::status_color("failed")));
  EXPECT_NE(ui::status_help("preempted"), nullptr);
  EXPECT_NE(ui::status_help("diverged"), nullptr);
  EXPECT_TRUE(ui::status_is_failure("diverged"));
  EXPECT_FALSE(ui::status_is_failure("preempted"));
  ui::GuiState s;
  s.rows_loaded = true;
  for (int i = 1; i <= 2; ++i) {
    ui::RunRow r;
    r.id = i;
    r.name = i == 1 ? "pre" : "div";
    r.status = i == 1 ? "preempted" : "diverged";
    s.rows.push_back(r);
  }
  s.tab = ui::Tab::Runs;
  frame(s);
  frame(s);
  const std::string text = frame_text(s);
  EXPECT_TRUE(has(text, "preempted")) << text;
  EXPECT_TRUE(has(text, "diverged")) << text;
}

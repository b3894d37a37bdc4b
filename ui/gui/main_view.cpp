// The window's frame: one full-size ImGui window with a tab per view (Debian's Dear ImGui 1.86
// has no docking), a status bar, and the dialog shown when the window is closed during a run.
#include <imgui.h>

#include "ui/gui/panels.h"

namespace ui {

namespace {

const char* tab_label(Tab t) {
  switch (t) {
    case Tab::Launch: return "Launch";
    case Tab::Live: return "Live run";
    case Tab::Runs: return "Runs";
    case Tab::Compare: return "Compare";
  }
  return "?";
}

void draw_status_bar(GuiState& s) {
  ImGui::Separator();
  if (!s.db_status.empty()) {
    ImGui::TextDisabled("%s", s.db_status.c_str());
    ImGui::SameLine();
  }
  if (s.live.active) {
    const RunView& v = s.live.view;
    ImGui::TextDisabled("run '%s': %s, step %lld/%lld", v.run_name.c_str(), v.status.c_str(),
                        static_cast<long long>(v.step), static_cast<long long>(v.total_steps));
    ImGui::SameLine();
  }
  if (!s.status.empty()) {
    if (s.status_is_error) ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.4f, 1.0f), "%s", s.status.c_str());
    else ImGui::TextUnformatted(s.status.c_str());
  }
}

// Closing the window while this process trains: stop with a checkpoint (the default button), or
// keep the window open. The app closes once the run has ended.
void draw_close_dialog(GuiState& s) {
  if (s.close_requested && !ImGui::IsPopupOpen("Close deltadeck?")) ImGui::OpenPopup("Close deltadeck?");
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (!ImGui::BeginPopupModal("Close deltadeck?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
  const RunView& v = s.live.view;
  ImGui::Text("Run '%s' is %s at step %lld of %lld.", v.run_name.c_str(), v.status.c_str(),
              static_cast<long long>(v.step), static_cast<long long>(v.total_steps));
  ImGui::TextUnformatted("Stop it with a checkpoint (it can be resumed later) and close?");
  ImGui::Spacing();
  ImGui::SetItemDefaultFocus();
  if (ImGui::Button("Stop with checkpoint and close") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter))) {
    s.actions.push_back(act::SendCommand{trainer::Command::Stop});
    s.quit = true;  // the app waits for the run to end and be recorded, then exits
    s.close_requested = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::SameLine();
  if (ImGui::Button("Cancel") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
    s.close_requested = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

}  // namespace

void draw_main(GuiState& s) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  // No background: the frame is cleared to the window colour already, and a software rasteriser
  // (Mesa's llvmpipe on machines without a GPU) pays for every blended full-screen quad.
  const ImGuiWindowFlags flags = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                                 ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoBringToFrontOnFocus |
                                 ImGuiWindowFlags_NoBackground;
  ImGui::PushStyleVar(ImGuiStyleVar_WindowRounding, 0.0f);
  ImGui::Begin("deltadeck", nullptr, flags);
  ImGui::PopStyleVar();

  const float status_h = ImGui::GetFrameHeightWithSpacing() + ImGui::GetStyle().ItemSpacing.y;
  if (ImGui::BeginTabBar("views")) {
    for (Tab t : {Tab::Launch, Tab::Live, Tab::Runs, Tab::Compare}) {
      const ImGuiTabItemFlags f = (s.select_tab && s.tab == t) ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(tab_label(t), nullptr, f)) {
        if (!s.select_tab) s.tab = t;
        ImGui::BeginChild("view", ImVec2(0, -status_h), false);
        switch (t) {
          case Tab::Launch: draw_launcher(s); break;
          case Tab::Live: draw_dashboard(s); break;
          case Tab::Runs: draw_runs(s); break;
          case Tab::Compare: draw_compare(s); break;
        }
        ImGui::EndChild();
        ImGui::EndTabItem();
      }
    }
    s.select_tab = false;
    ImGui::EndTabBar();
  }
  draw_status_bar(s);
  draw_close_dialog(s);
  ImGui::End();
}

}  // namespace ui

// The window's frame: one full-size ImGui window with a tab per view (Debian's Dear ImGui 1.86
// has no docking), a status bar, the dialog shown when the window is closed during a run and the
// one shown while it waits for that run to stop, and the report of a refused resume.
#include <imgui.h>

#include <cmath>

#include "ui/gui/panels.h"
#include "ui/gui/status_style.h"

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
    ImGui::TextDisabled("run '%s':", v.run_name.c_str());
    ImGui::SameLine(0, ImGui::GetFontSize() * 0.3f);
    ImGui::TextColored(status_color(v.status), "%s", v.status.c_str());
    ImGui::SameLine(0, ImGui::GetFontSize() * 0.3f);
    ImGui::TextDisabled("step %lld/%lld", static_cast<long long>(v.step), static_cast<long long>(v.total_steps));
    ImGui::SameLine();
  }
  if (!s.launching.empty()) {
    ImGui::TextColored(status_color("starting"), "%s", s.launching.c_str());
    ImGui::SameLine();
  }
  for (const auto& c : s.children) {
    if (!c.running) continue;
    ImGui::TextDisabled("'%s' resuming in process %d", c.run_name.c_str(), c.pid);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s\nlog: %s", c.command.c_str(), c.log_path.c_str());
    ImGui::SameLine();
  }
  if (!s.status.empty()) {
    if (s.status_is_error) ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.4f, 1.0f), "%s", s.status.c_str());
    else ImGui::TextUnformatted(s.status.c_str());
  }
}

// Closing the window while this process trains (or writes an export): stop with a checkpoint and
// close once the run has ended (the default button), or keep the window open.
void draw_close_dialog(GuiState& s) {
  CloseState& c = s.close;
  if (c.requested && !ImGui::IsPopupOpen("Close deltadeck?")) ImGui::OpenPopup("Close deltadeck?");
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (!ImGui::BeginPopupModal("Close deltadeck?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
  const RunView& v = s.live.view;
  const bool live = s.live.active && !v.ended();
  const char* confirm = "Close";
  if (live) {
    ImGui::Text("Run '%s' is %s at step %lld of %lld.", v.run_name.c_str(), v.status.c_str(),
                static_cast<long long>(v.step), static_cast<long long>(v.total_steps));
    if (v.status == "stopping") {
      ImGui::TextUnformatted("It is stopping: finishing its step and saving a checkpoint.");
      confirm = "Close when it has stopped";
    } else {
      ImGui::TextUnformatted("Stop it with a checkpoint (it can be resumed later) and close?");
      confirm = "Stop with checkpoint and close";
    }
  }
  if (s.file_tasks > 0) {
    ImGui::Text("%zu export or checksum task(s) still writing; the window closes when they are done.", s.file_tasks);
    if (!live) confirm = "Close when done";
  }
  ImGui::Spacing();
  ImGui::SetItemDefaultFocus();
  if (ImGui::Button(confirm) || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter))) {
    s.actions.push_back(act::StopAndClose{});
    c.requested = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::SameLine();
  if (ImGui::Button("Cancel") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
    c.requested = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

// While the window waits for the run to stop (and exports to finish): what it is waiting for and
// for how long, redrawn as the time goes by; "Quit now" (or closing the window again) leaves at once.
void draw_closing(GuiState& s) {
  CloseState& c = s.close;
  if (!c.closing) return;
  if (c.closing_since < 0) c.closing_since = ImGui::GetTime();
  if (!ImGui::IsPopupOpen("Closing deltadeck")) ImGui::OpenPopup("Closing deltadeck");
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Always, ImVec2(0.5f, 0.5f));
  if (!ImGui::BeginPopupModal("Closing deltadeck", nullptr,
                              ImGuiWindowFlags_AlwaysAutoResize | ImGuiWindowFlags_NoMove))
    return;
  const RunView& v = s.live.view;
  const double waited = ImGui::GetTime() - c.closing_since;
  if (s.live.active && !v.ended()) {
    ImGui::TextColored(status_color("stopping"), "Stopping run '%s'... saving a checkpoint  (%.1f s)", v.run_name.c_str(),
                       waited);
    ImGui::Text("Step %lld of %lld. The window closes once the checkpoint and the metrics are committed.",
                static_cast<long long>(v.step), static_cast<long long>(v.total_steps));
  } else if (s.file_tasks > 0) {
    ImGui::Text("Finishing %zu export or checksum task(s)...  (%.1f s)", s.file_tasks, waited);
  } else {
    ImGui::TextUnformatted("Closing...");
  }
  // A bar that moves while the window waits: the frame loop is alive.
  const float phase = static_cast<float>(std::fmod(waited, 2.0) / 2.0);
  ImGui::ProgressBar(phase, ImVec2(ImGui::GetFontSize() * 30, ImGui::GetFontSize() * 0.4f), "");
  ImGui::Spacing();
  if (ImGui::Button("Quit now")) s.actions.push_back(act::QuitNow{});
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Exit at once without waiting (closing the window again does the same).\n"
                      "The last committed checkpoint and database rows are kept; the run shows as\n"
                      "'interrupted' and can be resumed from that checkpoint.");
  ImGui::EndPopup();
}

// A resume that was refused, or that passed over damaged or unfinished checkpoints.
void draw_resume_notice(GuiState& s) {
  ResumeNotice& n = s.resume_notice;
  const char* id = "Resume##notice";
  if (n.open && !ImGui::IsPopupOpen(id)) ImGui::OpenPopup(id);
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (!ImGui::BeginPopupModal(id, nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
  const ImVec4 red(1.0f, 0.45f, 0.4f, 1), amber(1.0f, 0.75f, 0.35f, 1);
  if (n.refused) ImGui::TextColored(red, "Run '%s' was not resumed; nothing was started.", n.run_name.c_str());
  else ImGui::Text("Run '%s' resumed from %s.", n.run_name.c_str(), n.checkpoint.c_str());
  if (n.refused && !n.checkpoint.empty()) ImGui::TextDisabled("checkpoint: %s", n.checkpoint.c_str());
  if (!n.error.empty()) {
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 45);
    ImGui::TextColored(red, "%s", n.error.c_str());
    ImGui::PopTextWrapPos();
  }
  if (!n.mismatches.empty()) {
    ImGui::TextUnformatted("The checkpoint does not fit the run's config:");
    if (ImGui::BeginTable("mismatches", 2, ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit)) {
      ImGui::TableSetupColumn("field");
      ImGui::TableSetupColumn("values");
      ImGui::TableHeadersRow();
      for (const auto& m : n.mismatches) {
        const size_t colon = m.find(": ");
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::TextColored(red, "%s", colon == std::string::npos ? "" : m.substr(0, colon).c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(colon == std::string::npos ? m.c_str() : m.c_str() + colon + 2);
      }
      ImGui::EndTable();
    }
  }
  if (!n.skipped.empty()) {
    ImGui::TextColored(amber, "Skipped %zu damaged or unfinished checkpoint(s):", n.skipped.size());
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 45);
    for (const auto& k : n.skipped) {
      ImGui::Bullet();
      ImGui::TextWrapped("%s", k.c_str());
    }
    ImGui::PopTextWrapPos();
  }
  ImGui::Spacing();
  if (n.gpu_blocked) {
    if (ImGui::Button("Resume in a new process")) {
      s.actions.push_back(act::ResumeInNewProcess{n.run_id});
      n.open = false;
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
  }
  if (ImGui::Button("OK") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
    n.open = false;
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
  draw_resume_notice(s);
  draw_close_dialog(s);
  draw_closing(s);
  ImGui::End();
}

}  // namespace ui

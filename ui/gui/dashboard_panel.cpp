// The live dashboard: the run this window trains, from the run host's snapshot (status, progress,
// series, events, checkpoints) plus telemetry and per-rank keys read from the database. Controls
// pause, resume, save a checkpoint now and stop, by button or shortcut (Space, Ctrl+S, Ctrl+Q).
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "ui/gui/markers.h"
#include "ui/gui/metric_plots.h"
#include "ui/gui/panels.h"
#include "ui/gui/plot_math.h"
#include "ui/gui/recovery.h"
#include "ui/gui/status_style.h"
#include "ui/log/log_line.h"

namespace ui {

namespace {

// GLFW's key codes for letters are their ASCII capitals, and the GLFW backend of Dear ImGui 1.86
// indexes io.KeysDown by GLFW key code; these panels link no GLFW, so the codes are spelled here.
constexpr int KEY_S = 'S';
constexpr int KEY_Q = 'Q';

const ImU32 CHECKPOINT_COLOR = IM_COL32(120, 200, 255, 255);
const ImU32 SKIP_COLOR = IM_COL32(255, 80, 80, 255);
const ImU32 BACKOFF_COLOR = IM_COL32(255, 170, 60, 255);

void draw_controls(GuiState& s) {
  DashboardPanel& d = s.dashboard;
  const RunView& v = s.live.view;
  const bool live = !v.ended();
  const bool paused = v.status == "paused";
  const bool stopping = v.status == "stopping";
  ImGuiIO& io = ImGui::GetIO();
  const bool keys = live && !stopping && !io.WantTextInput && !ImGui::IsPopupOpen("", ImGuiPopupFlags_AnyPopup);

  ImGui::BeginDisabled(!live || stopping);
  if (ImGui::Button(paused ? "Resume" : "Pause") ||
      (keys && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false)))
    s.actions.push_back(act::SendCommand{paused ? trainer::Command::Resume : trainer::Command::Pause});
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) ImGui::SetTooltip("Space");
  ImGui::SameLine();
  if (ImGui::Button("Save checkpoint now") || (keys && io.KeyCtrl && ImGui::IsKeyPressed(KEY_S, false)))
    s.actions.push_back(act::SendCommand{trainer::Command::SaveNow});
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) ImGui::SetTooltip("Ctrl+S");
  ImGui::SameLine();
  if (ImGui::Button("Stop") || (keys && io.KeyCtrl && ImGui::IsKeyPressed(KEY_Q, false))) d.confirm_stop = true;
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip("Ctrl+Q: stop at the next step boundary with a checkpoint");
  ImGui::EndDisabled();

  if (d.confirm_stop) {
    ImGui::OpenPopup("Stop the run?");
    d.confirm_stop = false;
  }
  if (ImGui::BeginPopupModal("Stop the run?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
    ImGui::Text("Stop '%s' at the next step boundary, saving a checkpoint?", v.run_name.c_str());
    if (ImGui::Button("Stop with checkpoint") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter))) {
      s.actions.push_back(act::SendCommand{trainer::Command::Stop});
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ImGui::Button("Keep training") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape)))
      ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
}

void draw_header(GuiState& s) {
  const RunView& v = s.live.view;
  ImGui::Text("%s", v.run_name.c_str());
  ImGui::SameLine();
  ImGui::TextColored(status_color(v.status), "[%s]", v.status.c_str());
  if (const char* help = status_help(v.status); help && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", help);
  ImGui::SameLine();
  ImGui::TextDisabled("%s, %s parameters, %s", v.model.c_str(), format_count(static_cast<double>(v.params)).c_str(),
                      v.device.empty() ? v.devices.c_str() : v.device.c_str());
  const float frac = v.total_steps > 0 ? static_cast<float>(v.step) / static_cast<float>(v.total_steps) : 0.0f;
  char overlay[96];
  std::snprintf(overlay, sizeof overlay, "step %lld / %lld", static_cast<long long>(v.step),
                static_cast<long long>(v.total_steps));
  ImGui::ProgressBar(frac, ImVec2(ImGui::GetFontSize() * 18, 0), overlay);
  ImGui::SameLine();
  ImGui::Text("%s tokens   elapsed %s   ETA %s", format_count(static_cast<double>(v.tokens)).c_str(),
              format_duration(v.elapsed_s).c_str(),
              v.eta_s >= 0 && v.status == "running" ? format_duration(v.eta_s).c_str() : "-");  // none while paused
  // A failure's message stands in the box below the header.
  if (!v.end_message.empty() && !status_is_failure(v.status)) {
    ImGui::SameLine();
    ImGui::TextDisabled("(%s)", v.end_message.c_str());
  }
  ImGui::SameLine();
  draw_controls(s);
}

void draw_toolbar(DashboardPanel& d) {
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 7);
  int axis = static_cast<int>(d.x.axis);
  if (ImGui::Combo("x axis", &axis, "step\0tokens\0wall time\0")) {
    d.x.axis = static_cast<XAxis>(axis);
    d.x.auto_fit = true;
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 9);
  float w = static_cast<float>(d.smoothing);
  if (ImGui::SliderFloat("smoothing", &w, 0.0f, 0.99f, "%.2f")) d.smoothing = w;
  ImGui::SameLine();
  ImGui::TextDisabled("(wheel: zoom x, shift+wheel: zoom y, drag: pan, double-click: fit)");
}

// Checkpoint markers, clickable ("resume from here" once the run has ended).
std::vector<PlotMarker> checkpoint_markers(const LiveRun& live, XAxis axis) {
  std::vector<PlotMarker> out;
  const MetricSeries* ref = live.history.find("loss");
  for (const auto& c : live.view.checkpoints) {
    PlotMarker m;
    m.x = x_at_step(ref, live.history.timeline(), static_cast<double>(c.step), axis);
    m.color = CHECKPOINT_COLOR;
    m.label = "checkpoint at step " + std::to_string(c.step) + " (" + format_count(static_cast<double>(c.bytes)) + "B)";
    m.id = c.step;
    m.clickable = true;
    out.push_back(m);
  }
  return out;
}

// The newest checkpoint the live run recorded; -1 when none.
int64_t newest_checkpoint(const RunView& v) {
  int64_t step = -1;
  for (const auto& c : v.checkpoints) step = std::max(step, c.step);
  return step;
}

// A run that failed (or diverged): what happened and the ways on. After a multi-GPU failure this
// process may not use the GPU again, so a GPU run is offered a new process instead of a resume here.
void draw_failure(GuiState& s) {
  const RunView& v = s.live.view;
  if (!status_is_failure(v.status)) return;
  const bool gpu_run = devices_use_gpu(v.devices, s.launcher.devices);
  const bool blocked = gpu_run && !s.cuda_blocked.empty();
  const int64_t ckpt = newest_checkpoint(v);
  // The run record moves on when another process resumes the run (the database is the truth).
  const RunRow* row = s.row(v.run_id);
  const bool moved_on = row && row->status != v.status && row->status != "failed";
  size_t children = 0;
  for (const auto& c : s.children) children += c.run_id == v.run_id;
  const ImVec4 red(1.0f, 0.45f, 0.4f, 1);
  ImGui::PushID("failure");
  ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.28f, 0.1f, 0.1f, 0.55f));
  const ImGuiStyle& style = ImGui::GetStyle();
  const float lines = 1.0f + (blocked ? 1.0f : 0.0f) + (moved_on ? 1.0f : ckpt < 0 ? 1.0f : 2.0f) + static_cast<float>(children);
  ImGui::BeginChild("failure", ImVec2(0, lines * ImGui::GetFrameHeightWithSpacing() + style.WindowPadding.y * 2), true);
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextColored(red, "The run %s at step %lld: %s", v.status.c_str(), static_cast<long long>(v.step),
                     v.end_message.empty() ? "(no message)" : v.end_message.c_str());
  if (blocked) ImGui::TextColored(red, "This process can no longer use the GPU: %s", s.cuda_blocked.c_str());
  ImGui::PopTextWrapPos();
  if (moved_on) {
    ImGui::TextColored(status_color(row->status), "It has been resumed since: now %s at step %lld (see Runs).",
                       row->status.c_str(), static_cast<long long>(row->steps));
  } else if (ckpt < 0) {
    ImGui::TextDisabled("It saved no checkpoint, so there is nothing to resume from.");
  } else {
    const bool busy = !s.launching.empty();
    bool child_running = false;
    for (const auto& c : s.children) child_running |= c.run_id == v.run_id && c.running;
    ImGui::BeginDisabled(busy || child_running);
    if (ImGui::Button("Resume in a new process")) s.actions.push_back(act::ResumeInNewProcess{v.run_id});
    ImGui::EndDisabled();
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("Runs `deltadeck train --resume` as a process of its own (it keeps training if this window\n"
                        "closes); follow it in the Runs tab.");
    ImGui::SameLine();
    ImGui::BeginDisabled(blocked || busy || child_running);
    char label[64];
    std::snprintf(label, sizeof label, "Resume here from step %lld", static_cast<long long>(ckpt));
    if (ImGui::Button(label)) s.actions.push_back(act::ResumeRun{v.run_id, -1});
    ImGui::EndDisabled();
    if (blocked && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("This process can no longer use the GPU: %s", s.cuda_blocked.c_str());
    const std::string cmd = resume_command(s.exe_path.empty() ? "deltadeck" : s.exe_path, v.run_id,
                                           s.launcher.runs_dir.empty() ? "runs" : s.launcher.runs_dir);
    ImGui::TextDisabled("or in a terminal (or after restarting the app):");
    ImGui::SameLine();
    ImGui::TextUnformatted(cmd.c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("copy")) ImGui::SetClipboardText(cmd.c_str());
  }
  for (const auto& c : s.children) {
    if (c.run_id != v.run_id) continue;
    if (c.running) ImGui::TextColored(status_color("running"), "Resuming in process %d; log: %s", c.pid, c.log_path.c_str());
    else ImGui::TextDisabled("The resume process %d %s; log: %s", c.pid, c.outcome.c_str(), c.log_path.c_str());
  }
  ImGui::EndChild();
  ImGui::PopStyleColor();
  ImGui::PopID();
}

struct PlotSpec {
  const char* title;
  std::vector<std::string> keys;
  bool log_y = false;
};

void draw_event_log(DashboardPanel& d, const RunView& v) {
  ImGui::Text("Events (%lld)", static_cast<long long>(v.events_total));
  ImGui::SameLine();
  ImGui::Checkbox("follow", &d.follow_log);
  ImGui::BeginChild("events", ImVec2(0, 0), true);
  ImGuiListClipper clip;
  clip.Begin(static_cast<int>(v.events.size()));
  while (clip.Step()) {
    for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
      const LogRecord& r = v.events[static_cast<size_t>(i)];
      ImVec4 col = ImGui::GetStyleColorVec4(ImGuiCol_Text);
      if (r.level == "error" || status_is_failure(r.status)) col = ImVec4(1.0f, 0.45f, 0.4f, 1);
      else if (r.level == "warn" || r.kind == "skipped" || r.kind == "backoff") col = ImVec4(1.0f, 0.75f, 0.35f, 1);
      else if (r.kind == "checkpoint") col = ImVec4(0.55f, 0.8f, 1.0f, 1);
      std::string text = r.text;
      if (text.empty() && r.kind == "eval")
        for (const auto& kv : r.values) text += kv.first + " " + format_value(kv.second, 5) + "  ";
      if (text.empty() && r.kind == "checkpoint") text = r.path;
      // The colour tells the kind; the text already names it ("checkpoint saved ...", "eval step ...").
      ImGui::TextColored(col, "%8s  step %-7lld  %s", format_duration(r.wall_s).c_str(),
                         static_cast<long long>(r.step), text.c_str());
    }
  }
  if (d.follow_log && ImGui::GetScrollY() < ImGui::GetScrollMaxY()) ImGui::SetScrollHereY(1.0f);
  ImGui::EndChild();
}

}  // namespace

void draw_dashboard(GuiState& s) {
  LiveRun& live = s.live;
  DashboardPanel& d = s.dashboard;
  if (!live.active) {
    ImGui::Spacing();
    ImGui::TextUnformatted("No run is training in this window.");
    ImGui::TextDisabled("Start one from the Launch tab, or open past runs in Runs and Compare.");
    return;
  }
  const RunView& v = live.view;
  draw_header(s);
  draw_failure(s);
  draw_toolbar(d);

  const RunHistory& h = live.history;
  const XAxis axis = d.x.axis;
  const double weight = d.smoothing;
  std::vector<PlotSpec> specs = {{"loss", {"loss", "val_loss", "val_loss_ema"}},
                                 {"grad norm", {"grad_norm"}},
                                 {"loss scale", {"loss_scale"}, true},
                                 {"learning rate", {"lr"}},
                                 {"tokens/s", {"tokens_per_s"}},
                                 {"MFU", {"mfu"}}};
  const char* gpu_fields[][2] = {{".util", "GPU utilization (%)"},
                                 {".mem_used_gib", "GPU memory (GiB)"},
                                 {".power_w", "GPU power (W)"},
                                 {".temp_c", "GPU temperature (°C)"}};
  for (const auto& g : gpu_fields) {
    auto keys = indexed_keys(h, "gpu", g[0]);
    if (!keys.empty()) specs.push_back({g[1], keys});
  }
  if (h.find("data_wait_ms")) specs.push_back({"data wait (ms)", {"data_wait_ms"}});

  // A multi-rank run's ranks side by side, above the plots so a straggler shows without scrolling.
  if (const RunRow* row = s.row(v.run_id); row && row->world_size > 1) {
    if (ImGui::CollapsingHeader("Ranks", ImGuiTreeNodeFlags_DefaultOpen)) draw_rank_view(h, row->world_size);
  }
  const float log_h = ImGui::GetFontSize() * 9;
  ImGui::BeginChild("plots", ImVec2(0, -log_h), false);
  const auto ckpt_markers = checkpoint_markers(live, axis);
  bool open_marker_menu = false;
  // Three rows of plots fit the view; each plot's header line and spacing come off its share.
  const float header = ImGui::GetFrameHeightWithSpacing() + ImGui::GetStyle().ItemSpacing.y;
  const float plot_h = std::max(ImGui::GetFontSize() * 9, ImGui::GetContentRegionAvail().y / 3.0f - header - 2);
  if (ImGui::BeginTable("grid", 2, ImGuiTableFlags_SizingStretchSame)) {
    for (const PlotSpec& spec : specs) {
      std::vector<PlotSeries> series;
      size_t color = 0;
      for (const auto& key : spec.keys) add_plot_series(h, live.smoothed, key, axis, weight, key, series_color(color++), series);
      auto [it, fresh] = d.plots.try_emplace(spec.title);
      if (fresh) it->second.log_y = spec.log_y;
      std::vector<PlotMarker> markers = ckpt_markers;
      if (std::string(spec.title) == "loss scale") {
        const MetricSeries* ref = h.find("loss");
        if (const MetricSeries* sk = h.find("skipped_steps")) {
          live.skipped.update(*sk, h.timeline());
          for (double st : live.skipped.up)
            markers.push_back({x_at_step(ref, h.timeline(), st, axis), SKIP_COLOR,
                               "steps skipped (non-finite gradients) by step " + format_x(st, XAxis::Step), 0, false});
        }
        if (const MetricSeries* sc = h.find("loss_scale")) {
          live.scale.update(*sc, h.timeline());
          for (double st : live.scale.down)
            markers.push_back({x_at_step(ref, h.timeline(), st, axis), BACKOFF_COLOR,
                               "loss scale backed off at step " + format_x(st, XAxis::Step), 0, false});
        }
      }
      // Metrics this run does not report (MFU on the CPU) take no space; the loss plot stays as the
      // place that says the run has not logged yet.
      if (series.empty() && spec.keys.front() != "loss") continue;
      ImGui::TableNextColumn();
      if (series.empty()) {
        ImGui::TextUnformatted(spec.title);
        ImGui::TextDisabled(v.status == "starting" ? "waiting for the first step..." : "not reported by this run");
        ImGui::Dummy(ImVec2(0, plot_h - ImGui::GetFontSize() * 2));
        continue;
      }
      const PlotResult r = draw_plot(spec.title, it->second, d.x, series, markers, plot_h);
      if (r.clicked_marker >= 0 && markers[r.clicked_marker].clickable) {
        d.marker_step = markers[r.clicked_marker].id;
        open_marker_menu = true;
      }
    }
    ImGui::EndTable();
  }
  // Opened here, outside the table, so the popup has one ID whichever plot was clicked.
  if (open_marker_menu) ImGui::OpenPopup("checkpoint-actions");
  if (ImGui::BeginPopup("checkpoint-actions")) {
    ImGui::Text("Checkpoint at step %lld", static_cast<long long>(d.marker_step));
    const std::string why_not = resume_blocker(s, v.devices);
    ImGui::BeginDisabled(!why_not.empty());
    if (ImGui::MenuItem("Resume from here")) s.actions.push_back(act::ResumeRun{v.run_id, d.marker_step});
    ImGui::EndDisabled();
    if (!why_not.empty()) {
      ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30);
      ImGui::TextDisabled("(%s)", why_not.c_str());
      ImGui::PopTextWrapPos();
    }
    ImGui::EndPopup();
  }
  if (ImGui::CollapsingHeader("Checkpoints")) {
    auto it = s.loaded.find(v.run_id);
    if (it != s.loaded.end())
      draw_checkpoints(s, v.run_id, it->second.checkpoints, &it->second.checksum, &h, resume_blocker(s, v.devices),
                       s.runs.export_dir);
  }
  ImGui::EndChild();
  draw_event_log(d, v);
}

}  // namespace ui

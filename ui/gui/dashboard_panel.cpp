// The live dashboard: the run this window trains, from the run host's snapshot (status, progress,
// series, events, checkpoints) plus telemetry and per-rank keys read from the database. Controls
// pause, resume, save a checkpoint now and stop, by button or shortcut (Space, Ctrl+S, Ctrl+Q).
#include <imgui.h>

#include <cmath>
#include <string>

#include "ui/gui/markers.h"
#include "ui/gui/metric_plots.h"
#include "ui/gui/panels.h"
#include "ui/gui/plot_math.h"
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

ImVec4 status_color(const std::string& status) {
  if (status == "running") return ImVec4(0.4f, 0.85f, 0.45f, 1);
  if (status == "paused" || status == "stopping" || status == "starting") return ImVec4(1.0f, 0.8f, 0.3f, 1);
  if (status == "failed") return ImVec4(1.0f, 0.4f, 0.4f, 1);
  return ImVec4(0.7f, 0.7f, 0.75f, 1);
}

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
              format_duration(v.elapsed_s).c_str(), v.eta_s >= 0 ? format_duration(v.eta_s).c_str() : "-");
  if (!v.end_message.empty()) {
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
      if (r.level == "error" || r.status == "failed") col = ImVec4(1.0f, 0.45f, 0.4f, 1);
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
    ImGui::BeginDisabled(!v.ended());
    if (ImGui::MenuItem("Resume from here")) s.actions.push_back(act::ResumeRun{v.run_id, d.marker_step});
    ImGui::EndDisabled();
    if (!v.ended()) ImGui::TextDisabled("(stop the run first)");
    ImGui::EndPopup();
  }
  if (const RunRow* row = s.row(v.run_id); row && row->world_size > 1) {
    if (ImGui::CollapsingHeader("Ranks", ImGuiTreeNodeFlags_DefaultOpen)) draw_rank_view(h, row->world_size);
  }
  if (ImGui::CollapsingHeader("Checkpoints")) {
    auto it = s.loaded.find(v.run_id);
    if (it != s.loaded.end())
      draw_checkpoints(s, v.run_id, it->second.checkpoints, &it->second.checksum, &h, v.ended(), s.runs.export_dir);
  }
  ImGui::EndChild();
  draw_event_log(d, v);
}

}  // namespace ui

// A run's checkpoints (step, size, validation loss at that step, checksum state) with resume,
// export and verify; and the per-rank view of multi-rank runs.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ui/gui/metric_plots.h"
#include "ui/gui/panels.h"
#include "ui/gui/plot_math.h"
#include "ui/gui/recovery.h"
#include "ui/gui/text_fit.h"
#include "ui/log/log_line.h"

namespace ui {

namespace {

void checksum_cell(ChecksumState st) {
  switch (st) {
    case ChecksumState::Unchecked: ImGui::TextDisabled("not checked"); break;
    case ChecksumState::Checking: ImGui::TextDisabled("checking..."); break;
    case ChecksumState::Ok: ImGui::TextColored(ImVec4(0.45f, 0.85f, 0.5f, 1), "ok"); break;
    case ChecksumState::Mismatch: ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "MISMATCH"); break;
    case ChecksumState::Missing: ImGui::TextColored(ImVec4(1, 0.65f, 0.3f, 1), "file missing"); break;
  }
}

}  // namespace

std::string resume_blocker(const GuiState& s, const std::string& run_devices) {
  if (s.live.active && !s.live.view.ended()) return "a run is training in this window; resume when it has ended";
  if (!s.launching.empty()) return s.launching;
  return gpu_refusal(run_devices, s.launcher.devices, s.cuda_blocked);
}

void draw_checkpoints(GuiState& s, int64_t run_id, const std::vector<storage::CheckpointRecord>& checkpoints,
                      const std::map<int64_t, ChecksumState>* checksum, const RunHistory* history,
                      const std::string& no_resume, std::string& export_dir) {
  if (checkpoints.empty()) {
    ImGui::TextDisabled("No checkpoints recorded.");
    return;
  }
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 18);
  ImGui::InputTextWithHint("##export_dir", "export to folder", &export_dir);
  ImGui::SameLine();
  ImGui::TextDisabled("(model.safetensors + config.json)");
  const ImGuiTableFlags tf = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("checkpoints", 6, tf)) return;
  ImGui::TableSetupColumn("step");
  ImGui::TableSetupColumn("size");
  ImGui::TableSetupColumn("val loss");
  ImGui::TableSetupColumn("checksum");
  ImGui::TableSetupColumn("actions");
  ImGui::TableSetupColumn("path", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  for (const auto& c : checkpoints) {
    ImGui::PushID(static_cast<int>(c.step));
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%lld", static_cast<long long>(c.step));
    ImGui::TableNextColumn();
    ImGui::Text("%sB", format_count(static_cast<double>(c.bytes)).c_str());
    ImGui::TableNextColumn();
    const double vl = history ? value_at_step(*history, "val_loss", static_cast<double>(c.step)) : NAN;
    if (std::isnan(vl)) ImGui::TextDisabled("-");
    else ImGui::Text("%.4f", vl);
    ImGui::TableNextColumn();
    ChecksumState st = ChecksumState::Unchecked;
    if (checksum) {
      auto it = checksum->find(c.step);
      if (it != checksum->end()) st = it->second;
    }
    checksum_cell(st);
    ImGui::TableNextColumn();
    ImGui::BeginDisabled(!no_resume.empty());
    if (ImGui::SmallButton("resume")) s.actions.push_back(act::ResumeRun{run_id, c.step});
    ImGui::EndDisabled();
    if (!no_resume.empty() && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("%s", no_resume.c_str());
    ImGui::SameLine();
    ImGui::BeginDisabled(export_dir.empty());
    if (ImGui::SmallButton("export")) s.actions.push_back(act::ExportCheckpoint{run_id, c.step, c.path, export_dir});
    ImGui::EndDisabled();
    ImGui::SameLine();
    ImGui::BeginDisabled(st == ChecksumState::Checking);
    if (ImGui::SmallButton("verify")) s.actions.push_back(act::VerifyCheckpoint{run_id, c.step, c.path, c.sha256});
    ImGui::EndDisabled();
    ImGui::TableNextColumn();
    // Recorded paths are absolute: where the column is too narrow, the end (run, step) stays.
    const std::string shown = fit_path_tail(c.path, ImGui::GetContentRegionAvail().x,
                                            [](const std::string& t) { return ImGui::CalcTextSize(t.c_str()).x; });
    ImGui::TextDisabled("%s", shown.c_str());
    if (shown != c.path && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", c.path.c_str());
    ImGui::PopID();
  }
  ImGui::EndTable();
}

void draw_rank_view(const RunHistory& h, int64_t world_size) {
  const auto step_keys = indexed_keys(h, "rank", ".step_time_ms");
  if (step_keys.empty()) {
    ImGui::TextDisabled("%lld ranks; per-rank timings (rank<r>.step_time_ms, rank<r>.data_wait_ms) are not in this "
                        "run's metrics.",
                        static_cast<long long>(world_size));
    return;
  }
  // The slowest rank's recent step time against the median: a straggler stands out in red.
  std::vector<double> recent;
  for (const auto& k : step_keys) recent.push_back(last_value(h, k));
  std::vector<double> sorted = recent;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const ImGuiTableFlags tf = ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("ranks", 4, tf)) return;
  ImGui::TableSetupColumn("rank");
  ImGui::TableSetupColumn("step time (ms)");
  ImGui::TableSetupColumn("data wait (ms)");
  ImGui::TableSetupColumn("vs median", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  for (size_t r = 0; r < step_keys.size(); ++r) {
    const std::string rank = step_keys[r].substr(4, step_keys[r].find('.') - 4);
    const double wait = last_value(h, "rank" + rank + ".data_wait_ms");
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(rank.c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%.1f", recent[r]);
    ImGui::TableNextColumn();
    if (std::isnan(wait)) ImGui::TextDisabled("-");
    else ImGui::Text("%.1f", wait);
    ImGui::TableNextColumn();
    const double ratio = median > 0 ? recent[r] / median : 1;
    const float frac = static_cast<float>(std::min(ratio / 2.0, 1.0));
    const bool slow = ratio > 1.15;
    if (slow) ImGui::PushStyleColor(ImGuiCol_PlotHistogram, ImVec4(0.95f, 0.35f, 0.3f, 1));
    char label[32];
    std::snprintf(label, sizeof label, "%.2fx", ratio);
    ImGui::ProgressBar(frac, ImVec2(ImGui::GetFontSize() * 12, 0), label);
    if (slow) ImGui::PopStyleColor();
  }
  ImGui::EndTable();
}

}  // namespace ui

// Compare: several runs' curves overlaid, one plot per metric, a colour per run that stays the same
// in every plot and table; aligned by step, tokens or wall time; the config keys that differ; final
// and best values. Each run's history is one continuous line even when it was resumed
// (RunHistory drops an abandoned attempt's points).
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ui/gui/config_diff.h"
#include "ui/gui/metric_plots.h"
#include "ui/gui/panels.h"
#include "ui/gui/plot_math.h"
#include "ui/gui/status_style.h"
#include "ui/log/log_line.h"

namespace ui {

namespace {

void color_swatch(ImU32 c) {
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float f = ImGui::GetFontSize();
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + f * 0.2f), ImVec2(p.x + f * 0.8f, p.y + f), c, 2.0f);
  ImGui::Dummy(ImVec2(f * 0.9f, f));
  ImGui::SameLine();
}

void draw_run_chips(GuiState& s) {
  ComparePanel& c = s.compare;
  int64_t remove = 0;
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRow* r = s.row(c.runs[i]);
    ImGui::PushID(static_cast<int>(c.runs[i]));
    color_swatch(series_color(i));
    ImGui::TextUnformatted(r ? r->name.c_str() : "(deleted)");
    ImGui::SameLine();
    if (ImGui::SmallButton("x")) remove = c.runs[i];
    ImGui::SameLine();
    ImGui::PopID();
  }
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 10);
  if (ImGui::BeginCombo("##add", "add run")) {
    for (const auto& r : s.rows) {
      if (std::find(c.runs.begin(), c.runs.end(), r.id) != c.runs.end()) continue;
      ImGui::PushID(static_cast<int>(r.id));
      if (ImGui::Selectable(r.name.c_str())) {
        c.runs.push_back(r.id);
        s.actions.push_back(act::OpenRun{r.id});
      }
      ImGui::PopID();
    }
    ImGui::EndCombo();
  }
  if (remove) c.runs.erase(std::find(c.runs.begin(), c.runs.end(), remove));
}

void draw_toolbar(GuiState& s) {
  ComparePanel& c = s.compare;
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 7);
  int axis = static_cast<int>(c.x.axis);
  if (ImGui::Combo("align by", &axis, "step\0tokens\0wall time\0")) {
    c.x.axis = static_cast<XAxis>(axis);
    c.x.auto_fit = true;
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 9);
  float w = static_cast<float>(c.smoothing);
  if (ImGui::SliderFloat("smoothing", &w, 0.0f, 0.99f, "%.2f")) c.smoothing = w;
  ImGui::SameLine();
  // Metrics any of the runs has, to add as plots.
  std::set<std::string> keys;
  for (int64_t id : c.runs) {
    auto it = s.loaded.find(id);
    if (it == s.loaded.end()) continue;
    for (const auto& kv : it->second.history.series()) keys.insert(kv.first);
  }
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 12);
  if (ImGui::BeginCombo("##metric", "add metric plot")) {
    for (const auto& k : keys) {
      if (std::find(c.metrics.begin(), c.metrics.end(), k) != c.metrics.end()) continue;
      if (ImGui::Selectable(k.c_str())) c.metrics.push_back(k);
    }
    ImGui::EndCombo();
  }
}

void draw_summary(GuiState& s) {
  ComparePanel& c = s.compare;
  const ImGuiTableFlags tf = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("summary", 9, tf)) return;
  for (const char* h : {"run", "status", "steps", "tokens", "duration", "final loss", "best loss", "final val", "best val"})
    ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  auto num = [](double v) {
    if (std::isnan(v)) ImGui::TextDisabled("-");
    else ImGui::Text("%.4f", v);
  };
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRow* r = s.row(c.runs[i]);
    auto it = s.loaded.find(c.runs[i]);
    if (!r || it == s.loaded.end()) continue;
    const RunHistory& h = it->second.history;
    ImGui::PushID(static_cast<int>(r->id));
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    color_swatch(series_color(i));
    ImGui::TextUnformatted(r->name.c_str());
    ImGui::TableNextColumn();
    ImGui::TextColored(status_color(r->status), "%s", r->status.c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%lld", static_cast<long long>(r->steps));
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(format_count(static_cast<double>(r->tokens)).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(format_duration(r->duration_s).c_str());
    ImGui::TableNextColumn();
    num(last_value(h, "loss"));
    ImGui::TableNextColumn();
    num(min_value(h, "loss"));
    ImGui::TableNextColumn();
    num(last_value(h, "val_loss"));
    ImGui::TableNextColumn();
    num(min_value(h, "val_loss"));
    ImGui::PopID();
  }
  ImGui::EndTable();
}

void draw_config_diff(GuiState& s) {
  ComparePanel& c = s.compare;
  std::vector<FlatConfig> configs;
  std::vector<const RunRow*> rows;
  for (int64_t id : c.runs)
    if (const RunRow* r = s.row(id)) {
      configs.push_back(r->config);
      rows.push_back(r);
    }
  const auto diff = config_diff(configs);
  if (rows.size() < 2) {
    ImGui::TextDisabled("Pick two or more runs to see how their configs differ.");
    return;
  }
  if (diff.empty()) {
    ImGui::TextDisabled("The configs are identical (apart from the names).");
    return;
  }
  const ImGuiTableFlags tf = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("diff", static_cast<int>(rows.size()) + 1, tf)) return;
  ImGui::TableSetupColumn("key");
  for (const RunRow* r : rows) ImGui::TableSetupColumn(r->name.c_str());
  ImGui::TableHeadersRow();
  for (const auto& d : diff) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(d.key.c_str());
    for (size_t i = 0; i < d.values.size(); ++i) {
      ImGui::TableNextColumn();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(series_color(i)), "%s", d.values[i].c_str());
    }
  }
  ImGui::EndTable();
}

}  // namespace

void draw_compare(GuiState& s) {
  ComparePanel& c = s.compare;
  draw_run_chips(s);
  if (c.runs.empty()) {
    ImGui::TextDisabled("Select runs in the Runs tab (ctrl+click) and press Compare, or add them here.");
    return;
  }
  draw_toolbar(s);
  ImGui::BeginChild("compare", ImVec2(0, 0), false);
  const float plot_h = std::max(ImGui::GetFontSize() * 11, ImGui::GetContentRegionAvail().y * 0.42f);
  int64_t remove_metric = -1;
  if (ImGui::BeginTable("grid", 2, ImGuiTableFlags_SizingStretchSame)) {
    for (size_t m = 0; m < c.metrics.size(); ++m) {
      const std::string& key = c.metrics[m];
      std::vector<PlotSeries> series;
      for (size_t i = 0; i < c.runs.size(); ++i) {
        auto it = s.loaded.find(c.runs[i]);
        if (it == s.loaded.end()) continue;
        const RunRow* r = s.row(c.runs[i]);
        add_plot_series(it->second.history, it->second.smoothed, key, c.x.axis, c.smoothing,
                        r ? r->name : std::to_string(c.runs[i]), series_color(i), series);
      }
      if (series.empty()) continue;
      ImGui::TableNextColumn();
      ImGui::PushID(key.c_str());
      draw_plot(key.c_str(), c.plots[key], c.x, series, {}, plot_h);
      if (ImGui::BeginPopupContextItem("plot-menu")) {
        if (ImGui::MenuItem("Remove this plot")) remove_metric = static_cast<int64_t>(m);
        ImGui::EndPopup();
      }
      ImGui::PopID();
    }
    ImGui::EndTable();
  }
  if (remove_metric >= 0) c.metrics.erase(c.metrics.begin() + remove_metric);
  if (ImGui::CollapsingHeader("Summary", ImGuiTreeNodeFlags_DefaultOpen)) draw_summary(s);
  if (ImGui::CollapsingHeader("Config differences", ImGuiTreeNodeFlags_DefaultOpen)) draw_config_diff(s);
  ImGui::EndChild();
}

}  // namespace ui

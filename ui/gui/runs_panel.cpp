// The runs browser: every run of the database in a sortable, filterable table (plus any config keys
// the user adds as columns), and the focused run's details: rename, tags, note, delete, CSV export,
// checkpoints, config, events. Runs a crash left behind show as 'interrupted'.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>

#include "trainer/config.h"
#include "ui/gui/metric_plots.h"
#include "ui/gui/panels.h"
#include "ui/gui/recovery.h"
#include "ui/gui/status_style.h"
#include "ui/log/log_line.h"

namespace ui {

namespace {

constexpr ImGuiID CONFIG_COLUMN_ID = 1000;  // user ids of config columns start here

struct ColumnDef {
  const char* name;
  RunColumn column;
  ImGuiTableColumnFlags flags;
};
const ColumnDef COLUMNS[] = {
    {"id", RunColumn::Id, ImGuiTableColumnFlags_DefaultSort | ImGuiTableColumnFlags_PreferSortDescending},
    {"name", RunColumn::Name, 0},
    {"status", RunColumn::Status, 0},
    {"model", RunColumn::Model, 0},
    {"params", RunColumn::Params, ImGuiTableColumnFlags_PreferSortDescending},
    {"steps", RunColumn::Steps, ImGuiTableColumnFlags_PreferSortDescending},
    {"tokens", RunColumn::Tokens, ImGuiTableColumnFlags_PreferSortDescending},
    {"best val", RunColumn::BestVal, 0},
    {"duration", RunColumn::Duration, 0},
    {"started", RunColumn::Started, ImGuiTableColumnFlags_PreferSortDescending},
    {"tags", RunColumn::Tags, 0},
};
constexpr int N_COLUMNS = sizeof(COLUMNS) / sizeof(COLUMNS[0]);

// The run's run.devices as recorded ("auto" for runs recorded without it).
std::string run_devices(const RunRow& r) {
  auto it = r.config.find("run.devices");
  return it == r.config.end() ? "auto" : it->second;
}

void read_sort_specs(RunsPanel& p) {
  ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs();
  if (!specs || !specs->SpecsDirty) return;
  p.sort.clear();
  for (int i = 0; i < specs->SpecsCount; ++i) {
    const ImGuiTableColumnSortSpecs& c = specs->Specs[i];
    SortKey k;
    k.ascending = c.SortDirection == ImGuiSortDirection_Ascending;
    if (c.ColumnUserID >= CONFIG_COLUMN_ID) {
      const size_t idx = c.ColumnUserID - CONFIG_COLUMN_ID;
      if (idx >= p.config_columns.size()) continue;
      k.column = RunColumn::Config;
      k.config_key = p.config_columns[idx];
    } else {
      k.column = COLUMNS[c.ColumnUserID].column;
    }
    p.sort.push_back(k);
  }
  specs->SpecsDirty = false;
  p.order_dirty = true;
}

void cell_text(const RunRow& r, RunColumn c) {
  switch (c) {
    case RunColumn::Id: ImGui::Text("%lld", static_cast<long long>(r.id)); break;
    case RunColumn::Name: break;  // drawn as the row's selectable
    case RunColumn::Status:
      ImGui::TextColored(status_color(r.status), "%s", r.status.c_str());
      if (ImGui::IsItemHovered()) {
        const char* help = status_help(r.status);
        if (help && !r.message.empty()) ImGui::SetTooltip("%s\n\n%s", help, r.message.c_str());
        else if (help) ImGui::SetTooltip("%s", help);
        else if (!r.message.empty()) ImGui::SetTooltip("%s", r.message.c_str());
      }
      break;
    case RunColumn::Model: ImGui::TextUnformatted(r.model.c_str()); break;
    case RunColumn::Params: ImGui::TextUnformatted(format_count(static_cast<double>(r.params)).c_str()); break;
    case RunColumn::Steps: ImGui::Text("%lld", static_cast<long long>(r.steps)); break;
    case RunColumn::Tokens: ImGui::TextUnformatted(format_count(static_cast<double>(r.tokens)).c_str()); break;
    case RunColumn::BestVal:
      if (std::isnan(r.best_val_loss)) ImGui::TextDisabled("-");
      else ImGui::Text("%.4f", r.best_val_loss);
      break;
    case RunColumn::Duration: ImGui::TextUnformatted(format_duration(r.duration_s).c_str()); break;
    case RunColumn::Started: {
      // "2026-11-23T09:30:00Z" -> "2026-11-23 09:30"
      std::string t = r.started_at.substr(0, 16);
      if (t.size() > 10) t[10] = ' ';
      ImGui::TextUnformatted(t.c_str());
      break;
    }
    case RunColumn::Tags: {
      std::string tags;
      for (const auto& t : r.tags) tags += (tags.empty() ? "" : ", ") + t;
      ImGui::TextUnformatted(tags.c_str());
      break;
    }
    case RunColumn::Config: break;
  }
}

void draw_filter_row(GuiState& s) {
  RunsPanel& p = s.runs;
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 24);
  if (ImGui::InputTextWithHint("##filter", "filter: demo status:finished params>1M train.lr<1e-3 -tag:bad",
                               &p.filter_text)) {
    p.filter = parse_filter(p.filter_text);
    p.order_dirty = true;
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Words match name, model, status, tags and notes.\n"
                      "field:text contains, field=text equals, field>N / <N / >=N / <=N compare numbers\n"
                      "(params, steps, tokens, val, duration, id, world, or any config key like train.lr).\n"
                      "-term negates. N may end in k, M or G.");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 12);
  const bool add = ImGui::InputTextWithHint("##col", "config key as column", &p.new_column,
                                            ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  if ((ImGui::Button("Add column") || add) && !p.new_column.empty()) {
    if (std::find(p.config_columns.begin(), p.config_columns.end(), p.new_column) == p.config_columns.end())
      p.config_columns.push_back(p.new_column);
    p.new_column.clear();
  }
  ImGui::SameLine();
  if (ImGui::Button("Refresh")) s.actions.push_back(act::RefreshRuns{});
  ImGui::SameLine();
  ImGui::BeginDisabled(p.selected.size() < 1);
  char label[48];
  std::snprintf(label, sizeof label, "Compare selected (%zu)", p.selected.size());
  if (ImGui::Button(label)) {
    s.compare.runs.assign(p.selected.begin(), p.selected.end());
    for (int64_t id : s.compare.runs) s.actions.push_back(act::OpenRun{id});
    s.tab = Tab::Compare;
    s.select_tab = true;
  }
  ImGui::EndDisabled();
  for (const auto& e : p.filter.errors) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", e.c_str());
  }
}

void draw_table(GuiState& s, float height) {
  RunsPanel& p = s.runs;
  const int ncols = N_COLUMNS + static_cast<int>(p.config_columns.size());
  const ImGuiTableFlags tf = ImGuiTableFlags_Sortable | ImGuiTableFlags_SortMulti | ImGuiTableFlags_RowBg |
                             ImGuiTableFlags_Resizable | ImGuiTableFlags_Hideable | ImGuiTableFlags_ScrollY |
                             ImGuiTableFlags_ScrollX | ImGuiTableFlags_BordersOuter | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("runs", ncols, tf, ImVec2(0, height))) return;
  ImGui::TableSetupScrollFreeze(2, 1);
  // Fixed columns fit the rows of their first frames: status starts as wide as its longest value,
  // so a run that becomes "interrupted" while the view is open is not cut to "interrupte".
  const float status_width = ImGui::CalcTextSize("interrupted").x;
  for (int i = 0; i < N_COLUMNS; ++i) {
    ImGui::TableSetupColumn(COLUMNS[i].name, COLUMNS[i].flags, COLUMNS[i].column == RunColumn::Status ? status_width : 0,
                            static_cast<ImGuiID>(i));
  }
  for (size_t i = 0; i < p.config_columns.size(); ++i)
    ImGui::TableSetupColumn(p.config_columns[i].c_str(), 0, 0, CONFIG_COLUMN_ID + static_cast<ImGuiID>(i));
  ImGui::TableHeadersRow();
  read_sort_specs(p);
  if (p.order_dirty || p.order_rows_version != s.rows_version) {
    p.order = filter_and_sort(s.rows, p.filter, p.sort);
    p.order_rows_version = s.rows_version;
    p.order_dirty = false;
  }
  ImGuiListClipper clip;
  clip.Begin(static_cast<int>(p.order.size()));
  while (clip.Step()) {
    for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
      const RunRow& r = s.rows[p.order[static_cast<size_t>(i)]];
      ImGui::PushID(static_cast<int>(r.id));
      ImGui::TableNextRow();
      for (int c = 0; c < ncols; ++c) {
        if (!ImGui::TableSetColumnIndex(c)) continue;
        if (c >= N_COLUMNS) {
          auto it = r.config.find(p.config_columns[static_cast<size_t>(c - N_COLUMNS)]);
          if (it == r.config.end()) ImGui::TextDisabled("-");
          else ImGui::TextUnformatted(it->second.c_str());
        } else if (COLUMNS[c].column == RunColumn::Name) {
          const bool sel = p.selected.count(r.id) > 0;
          if (ImGui::Selectable(r.name.c_str(), sel || p.focused == r.id,
                                ImGuiSelectableFlags_SpanAllColumns | ImGuiSelectableFlags_AllowItemOverlap)) {
            if (ImGui::GetIO().KeyCtrl) {
              if (sel) p.selected.erase(r.id);
              else p.selected.insert(r.id);
            } else {
              p.selected = {r.id};
            }
            if (p.focused != r.id) {
              p.focused = r.id;
              s.actions.push_back(act::OpenRun{r.id});
            }
          }
        } else {
          cell_text(r, COLUMNS[c].column);
        }
      }
      ImGui::PopID();
    }
  }
  ImGui::EndTable();
}

void draw_details(GuiState& s) {
  RunsPanel& p = s.runs;
  const RunRow* r = s.row(p.focused);
  if (!r) {
    ImGui::TextDisabled("Click a run to see its details; ctrl+click to select several for Compare.");
    return;
  }
  const bool running = r->status == "running";
  const bool live_here = s.live.active && s.live.view.run_id == r->id && !s.live.view.ended();
  ImGui::PushID(static_cast<int>(r->id));
  ImGui::Text("Run %lld: %s", static_cast<long long>(r->id), r->name.c_str());
  ImGui::SameLine();
  ImGui::TextColored(status_color(r->status), "[%s]", r->status.c_str());
  if (const char* help = status_help(r->status); help && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", help);
  if (!r->message.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("%s", r->message.c_str());
  }
  ImGui::TextDisabled("%s, %s parameters, %lld rank(s), started %s%s%s", r->model.c_str(),
                      format_count(static_cast<double>(r->params)).c_str(), static_cast<long long>(r->world_size),
                      r->started_at.c_str(), r->ended_at.empty() ? "" : ", ended ", r->ended_at.c_str());

  // Rename
  if (p.note_for != r->id) {
    p.rename_buf = r->name;
    p.note_buf = r->notes;
    p.note_for = r->id;
  }
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
  ImGui::InputText("##rename", &p.rename_buf);
  ImGui::SameLine();
  ImGui::BeginDisabled(running || p.rename_buf.empty() || p.rename_buf == r->name);
  if (ImGui::Button("Rename")) s.actions.push_back(act::RenameRun{r->id, p.rename_buf});
  ImGui::EndDisabled();
  // Tags
  ImGui::SameLine();
  ImGui::TextUnformatted("  tags:");
  for (const auto& t : r->tags) {
    ImGui::SameLine();
    ImGui::PushID(t.c_str());
    if (ImGui::SmallButton((t + "  x").c_str())) s.actions.push_back(act::RemoveTag{r->id, t});
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Remove tag '%s'", t.c_str());
    ImGui::PopID();
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 8);
  const bool enter = ImGui::InputTextWithHint("##tag", "new tag", &p.tag_buf, ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  if ((ImGui::SmallButton("add tag") || enter) && !p.tag_buf.empty()) {
    s.actions.push_back(act::AddTag{r->id, p.tag_buf});
    p.tag_buf.clear();
  }
  // Note
  ImGui::InputTextMultiline("##note", &p.note_buf, ImVec2(ImGui::GetFontSize() * 30, ImGui::GetTextLineHeight() * 2.6f));
  ImGui::SameLine();
  ImGui::BeginGroup();
  ImGui::BeginDisabled(p.note_buf == r->notes);
  if (ImGui::Button("Save note")) s.actions.push_back(act::SetNote{r->id, p.note_buf});
  ImGui::EndDisabled();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
  ImGui::InputTextWithHint("##csv", "metrics.csv", &p.csv_path);
  ImGui::SameLine();
  ImGui::BeginDisabled(p.csv_path.empty());
  if (ImGui::Button("Export CSV")) s.actions.push_back(act::ExportCsv{r->id, p.csv_path});
  ImGui::EndDisabled();
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginDisabled(running);
  if (ImGui::Button("Delete...")) p.confirm_delete = r->id;
  ImGui::EndDisabled();
  if (running && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip("A running run cannot be renamed or deleted.");

  auto it = s.loaded.find(r->id);
  const LoadedRun* lr = it == s.loaded.end() ? nullptr : &it->second;
  if (ImGui::CollapsingHeader("Checkpoints", ImGuiTreeNodeFlags_DefaultOpen)) {
    if (lr) {
      const std::string no_resume = live_here ? "this run is training in this window" : resume_blocker(s, run_devices(*r));
      // A run of another process (or one the GPU block keeps out of this one) can be resumed by a
      // new deltadeck process of its own.
      bool child_running = false;
      for (const auto& c : s.children) child_running |= c.run_id == r->id && c.running;
      const bool resumable = r->status == "failed" || r->status == "stopped" || r->status == "preempted" ||
                             r->status == "interrupted" || r->status == "diverged";
      if (resumable && !live_here && !lr->checkpoints.empty()) {
        ImGui::BeginDisabled(child_running);
        if (ImGui::SmallButton("resume newest in a new process")) s.actions.push_back(act::ResumeInNewProcess{r->id});
        ImGui::EndDisabled();
        if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
          ImGui::SetTooltip("%s", resume_command(s.exe_path.empty() ? "deltadeck" : s.exe_path, r->id,
                                                 s.launcher.runs_dir.empty() ? "runs" : s.launcher.runs_dir)
                                      .c_str());
      }
      draw_checkpoints(s, r->id, lr->checkpoints, &lr->checksum, &lr->history, no_resume, p.export_dir);
    } else {
      ImGui::TextDisabled("loading...");
    }
  }
  if (r->world_size > 1 && lr && ImGui::CollapsingHeader("Ranks", ImGuiTreeNodeFlags_DefaultOpen))
    draw_rank_view(lr->history, r->world_size);
  if (ImGui::CollapsingHeader("Events") && lr) {
    ImGui::BeginChild("events", ImVec2(0, ImGui::GetFontSize() * 10), true);
    ImGuiListClipper clip;
    clip.Begin(static_cast<int>(lr->events.size()));
    while (clip.Step())
      for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
        const auto& e = lr->events[static_cast<size_t>(i)];
        const ImVec4 col = e.level == "error" ? ImVec4(1, 0.45f, 0.4f, 1)
                           : e.level == "warn" ? ImVec4(1, 0.75f, 0.35f, 1)
                                               : ImGui::GetStyleColorVec4(ImGuiCol_Text);
        ImGui::TextColored(col, "%s  step %-7lld %s", e.created_at.c_str(), static_cast<long long>(e.step), e.text.c_str());
      }
    ImGui::EndChild();
  }
  if (ImGui::CollapsingHeader("Config") && lr) ImGui::TextUnformatted(lr->config_toml.c_str());
  ImGui::PopID();
}

void draw_delete_dialog(GuiState& s) {
  RunsPanel& p = s.runs;
  if (p.confirm_delete != 0 && !ImGui::IsPopupOpen("Delete run?")) ImGui::OpenPopup("Delete run?");
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (!ImGui::BeginPopupModal("Delete run?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
  const RunRow* r = s.row(p.confirm_delete);
  if (!r) {
    p.confirm_delete = 0;
    ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
    return;
  }
  ImGui::Text("Delete run '%s' (id %lld)?", r->name.c_str(), static_cast<long long>(r->id));
  ImGui::TextUnformatted("Its metrics, events and checkpoint files are removed. This cannot be undone.");
  if (ImGui::Button("Delete run and checkpoints")) {
    s.actions.push_back(act::DeleteRun{r->id});
    p.confirm_delete = 0;
    ImGui::CloseCurrentPopup();
  }
  ImGui::SameLine();
  ImGui::SetItemDefaultFocus();
  if (ImGui::Button("Cancel") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
    p.confirm_delete = 0;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

}  // namespace

void draw_runs(GuiState& s) {
  draw_filter_row(s);
  if (!s.rows_loaded) {
    ImGui::TextDisabled("%s", s.db_status.empty() ? "reading the run database..." : s.db_status.c_str());
    return;
  }
  const float avail = ImGui::GetContentRegionAvail().y;
  draw_table(s, std::max(ImGui::GetFontSize() * 8, avail * 0.45f));
  ImGui::Separator();
  ImGui::BeginChild("details", ImVec2(0, 0), false);
  draw_details(s);
  ImGui::EndChild();
  draw_delete_dialog(s);
}

}  // namespace ui

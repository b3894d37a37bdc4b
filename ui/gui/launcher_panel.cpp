// The launcher: pick a preset file or open a TOML config, edit the common fields of the draft,
// see every problem next to its field (the command line's validator, trainer::validate), save,
// start. Keys the form does not show keep the values of the loaded file.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "model/model_config.h"
#include "trainer/config.h"
#include "ui/gui/panels.h"
#include "ui/gui/recovery.h"
#include "ui/log/log_line.h"

namespace ui {

namespace {

const ImVec4 ERROR_COLOR(1.0f, 0.42f, 0.38f, 1.0f);

// The key a problem line names: "train.lr: must be > 0" -> "train.lr"; "data.train[1]: ..." ->
// "data.train" (a list key's element belongs to the list's field).
std::string error_key(const std::string& e) {
  std::string key = e.substr(0, e.find(':'));
  const auto bracket = key.find('[');
  if (bracket != std::string::npos) key.resize(bracket);
  const auto space = key.find(' ');
  if (space != std::string::npos) key.resize(space);
  return key;
}

// Every problem of the draft: the validator's, then those found resolving it for this machine.
std::vector<std::string> all_errors(const LauncherPanel& p) {
  std::vector<std::string> all = p.errors;
  all.insert(all.end(), p.start_errors.begin(), p.start_errors.end());
  return all;
}

// The problems of one key under its field; true when there were any.
bool field_errors(const LauncherPanel& p, const char* key) {
  bool any = false;
  for (const auto& e : all_errors(p))
    if (error_key(e) == key) {
      const size_t colon = e.find(':');
      const size_t from = colon == std::string::npos ? 0 : e.find_first_not_of(' ', colon + 1);
      ImGui::PushStyleColor(ImGuiCol_Text, ERROR_COLOR);
      ImGui::TextWrapped("%s", e.c_str() + (from == std::string::npos ? 0 : from));
      ImGui::PopStyleColor();
      any = true;
    }
  return any;
}

// Problems whose key no field shows (cross-field rules, keys outside the form).
std::vector<std::string> other_errors(const LauncherPanel& p, const std::vector<const char*>& shown) {
  std::vector<std::string> out;
  for (const auto& e : all_errors(p)) {
    const std::string key = error_key(e);
    if (std::find_if(shown.begin(), shown.end(), [&](const char* k) { return key == k; }) == shown.end())
      out.push_back(e);
  }
  return out;
}

// One labelled row of the form: label in the first column, widget in the second, errors under it.
struct Form {
  LauncherPanel& p;
  std::vector<const char*> keys;
  bool changed = false;

  void label(const char* key, const char* help) {
    keys.push_back(key);
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    ImGui::AlignTextToFramePadding();
    ImGui::TextUnformatted(key);
    if (help && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", help);
    ImGui::TableSetColumnIndex(1);
    ImGui::SetNextItemWidth(-1);
    ImGui::PushID(key);
  }
  void done(bool edited) {
    ImGui::PopID();
    changed |= edited;
    field_errors(p, keys.back());
  }
  void int64(const char* key, int64_t& v, const char* help = nullptr) {
    label(key, help);
    done(ImGui::InputScalar("##v", ImGuiDataType_S64, &v));
  }
  void real(const char* key, double& v, const char* help = nullptr) {
    label(key, help);
    done(ImGui::InputDouble("##v", &v, 0, 0, "%.6g"));
  }
  void text(const char* key, std::string& v, const char* help = nullptr) {
    label(key, help);
    done(ImGui::InputText("##v", &v));
  }
  void choice(const char* key, std::string& v, const std::vector<std::string>& options, const char* help = nullptr) {
    label(key, help);
    bool edited = false;
    if (ImGui::BeginCombo("##v", v.c_str())) {
      for (const auto& o : options)
        if (ImGui::Selectable(o.c_str(), o == v)) {
          edited = o != v;
          v = o;
        }
      ImGui::EndCombo();
    }
    done(edited);
  }
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    out.push_back(line.substr(b, line.find_last_not_of(" \t\r") - b + 1));
  }
  return out;
}

void draw_source_row(GuiState& s) {
  LauncherPanel& p = s.launcher;
  ImGui::Text("Config: %s", p.source_name.c_str());
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
  if (ImGui::BeginCombo("##preset", "Presets")) {
    for (const auto& path : p.presets)
      if (ImGui::Selectable(path.c_str())) s.actions.push_back(act::LoadConfigFile{path});
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 22);
  ImGui::InputTextWithHint("##open", "path/to/config.toml", &p.open_path);
  ImGui::SameLine();
  if (ImGui::Button("Open") && !p.open_path.empty()) s.actions.push_back(act::LoadConfigFile{p.open_path});
  for (const auto& e : p.parse_errors) ImGui::TextColored(ERROR_COLOR, "%s", e.c_str());
}

void draw_devices(GuiState& s) {
  LauncherPanel& p = s.launcher;
  ImGui::TextUnformatted("Devices on this machine (click to use):");
  for (size_t i = 0; i < p.devices.size(); ++i) {
    ImGui::PushID(static_cast<int>(i));
    const std::string& d = p.devices[i];
    // "cuda:0 (...)" -> "0", "cpu" -> "cpu"
    std::string value = d.rfind("cuda:", 0) == 0 ? d.substr(5, d.find(' ') - 5) : d.substr(0, d.find(' '));
    if (ImGui::Selectable(d.c_str(), p.draft.run.devices == value)) {
      p.draft.run.devices = value;
      p.dirty_validation = true;
    }
    ImGui::PopID();
  }
  if (p.devices.empty()) ImGui::TextDisabled("(none found)");
}

}  // namespace

void draw_launcher(GuiState& s) {
  LauncherPanel& p = s.launcher;
  trainer::RunConfig& c = p.draft;
  draw_source_row(s);
  ImGui::Separator();

  const float form_w = std::min(ImGui::GetContentRegionAvail().x * 0.62f, ImGui::GetFontSize() * 44);
  ImGui::BeginChild("form", ImVec2(form_w, 0), false);
  Form f{p, {}, false};
  const ImGuiTableFlags tf = ImGuiTableFlags_SizingStretchProp | ImGuiTableFlags_RowBg;
  if (ImGui::BeginTable("fields", 2, tf)) {
    ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed, ImGui::GetFontSize() * 11);
    ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthStretch);
    f.text("name", c.name, "Run name; a suffix is added if taken");

    std::string family = model::family_name(c.model.family);
    std::string preset = c.model.preset;
    f.choice("model.family", family, {"gpt", "hybrid"}, "gpt, or the Gated DeltaNet + MLA hybrid");
    f.choice("model.preset", preset, model::preset_names(), "Size preset (MODEL.md §8)");
    if (family != model::family_name(c.model.family) || preset != c.model.preset) {
      // A new family or preset brings that preset's sizes; the vocabulary stays as configured.
      const auto fam = model::family_from_name(family);
      if (auto m = model::make_preset(preset, fam ? *fam : c.model.family)) {
        const int64_t vocab = c.model.vocab_size;
        const int64_t seq = c.model.max_seq_len;
        c.model = *m;
        c.model.vocab_size = vocab;
        c.model.max_seq_len = seq;
      }
    }
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(1);
    // Wrapped in the cell: one line was cut at the column's edge, losing the sizes after it.
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s parameters%s, d=%lld, L=%lld, pattern %s",
                       format_count(static_cast<double>(model::count_params(c.model))).c_str(),
                       c.model.vocab_size == 0 ? " without the embedding (vocabulary from the tokenizer)" : "",
                       static_cast<long long>(c.model.d), static_cast<long long>(c.model.n_layers), c.model.pattern.c_str());
    ImGui::PopStyleColor();

    f.label("data.train", "Training sources, one per line: text:GLOB | jsonl:GLOB | llmc:GLOB | u16:GLOB");
    const bool src = ImGui::InputTextMultiline("##v", &p.train_sources, ImVec2(-1, ImGui::GetTextLineHeight() * 3.4f));
    if (src) c.data.train = split_lines(p.train_sources);
    f.done(src);
    f.text("data.tokenizer", c.data.tokenizer, "byte | sentencepiece:PATH.model");
    f.real("data.val", c.data.val_fraction, "Share of documents held out for validation");
    f.int64("train.steps", c.train.steps);
    f.int64("train.batch_size", c.train.batch_size, "Sequences per micro-batch per rank");
    f.int64("train.seq_len", c.train.seq_len);
    f.int64("train.grad_accum", c.train.grad_accum);
    f.real("train.lr", c.train.lr, "Peak learning rate");
    f.choice("train.schedule", c.train.schedule, {"cosine", "wsd", "constant"});
    f.int64("train.warmup_steps", c.train.warmup_steps);
    f.choice("train.optimizer", c.train.optimizer, {"adamw", "muon"});
    if (c.train.optimizer == "muon")
      f.real("train.muon_lr", c.train.muon_lr, "Muon's peak learning rate for the hidden matrices (train.lr: the rest)");
    f.choice("train.precision", c.train.precision, {"auto", "fp32", "bf16", "fp16", "fp8"});
    f.text("run.devices", c.run.devices, "auto | cpu | cpu:N | all | 0,1,...");
    f.int64("run.log_interval", c.run.log_interval);
    f.int64("run.eval_interval", c.run.eval_interval, "0: only at the end");
    f.int64("run.save_interval", c.run.save_interval, "0: only at the end");
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    ImGui::TextUnformatted("run.runs_dir");
    ImGui::TableSetColumnIndex(1);
    ImGui::TextDisabled("%s (the database this window shows)", p.runs_dir.c_str());
    ImGui::EndTable();
  }
  p.form_keys.assign(f.keys.begin(), f.keys.end());
  if (f.changed) p.dirty_validation = true;
  if (p.dirty_validation) {
    c.run.runs_dir = p.runs_dir;
    p.errors = trainer::validate(c);
    p.start_errors.clear();
    p.dirty_validation = false;
  }
  ImGui::EndChild();

  ImGui::SameLine();
  ImGui::BeginChild("side", ImVec2(0, 0), false);
  draw_devices(s);
  ImGui::Separator();
  const auto others = other_errors(p, f.keys);
  const size_t problems = p.errors.size() + p.start_errors.size();
  if (problems == 0) {
    ImGui::TextColored(ImVec4(0.45f, 0.85f, 0.5f, 1.0f), "The config is valid.");
  } else {
    ImGui::TextColored(ERROR_COLOR, "%zu %s; the run cannot start.", problems, problems == 1 ? "problem" : "problems");
  }
  for (const auto& e : others) ImGui::TextColored(ERROR_COLOR, "%s", e.c_str());
  ImGui::Spacing();
  const bool running = s.live.active && !s.live.view.ended();
  // After a multi-GPU failure this process refuses the GPU; the reason stands next to Start.
  const std::string refusal = gpu_refusal(c.run.devices, p.devices, s.cuda_blocked);
  ImGui::BeginDisabled(problems > 0 || running || !s.launching.empty() || !refusal.empty());
  if (ImGui::Button("Start run", ImVec2(ImGui::GetFontSize() * 10, 0))) s.actions.push_back(act::StartRun{});
  ImGui::EndDisabled();
  if (!refusal.empty()) {
    ImGui::SameLine();
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextColored(ERROR_COLOR, "Not here: %s", refusal.c_str());
    ImGui::PopTextWrapPos();
  }
  if (running) ImGui::TextDisabled("A run is training in this window (see Live run).");
  else if (!s.launching.empty()) ImGui::TextDisabled("%s", s.launching.c_str());
  ImGui::Spacing();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 16);
  ImGui::InputTextWithHint("##save", "save as path.toml", &p.save_path);
  ImGui::SameLine();
  ImGui::BeginDisabled(p.save_path.empty());
  if (ImGui::Button("Save config")) s.actions.push_back(act::SaveConfig{p.save_path});
  ImGui::EndDisabled();
  if (!p.message.empty()) ImGui::TextWrapped("%s", p.message.c_str());
  ImGui::Separator();
  if (ImGui::CollapsingHeader("Resolved config (TOML)")) {
    const std::string toml = trainer::to_toml(c);
    ImGui::TextUnformatted(toml.c_str());
  }
  ImGui::EndChild();
}

}  // namespace ui

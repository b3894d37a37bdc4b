#include "ui/gui/config_diff.h"

#include <nlohmann/json.hpp>

#include <set>

namespace ui {

const char* const MISSING = "—";

namespace {
void flatten(const nlohmann::json& j, const std::string& prefix, FlatConfig& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  out[prefix] = j.is_string() ? j.get<std::string>() : j.dump();
}
}  // namespace

FlatConfig flatten_config_json(const std::string& json) {
  FlatConfig out;
  if (json.empty()) return out;
  const auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return out;
  flatten(j, "", out);
  return out;
}

std::vector<DiffRow> config_diff(const std::vector<FlatConfig>& configs) {
  std::set<std::string> keys;
  for (const auto& c : configs)
    for (const auto& kv : c) keys.insert(kv.first);
  std::vector<DiffRow> rows;
  for (const auto& k : keys) {
    if (k == "name") continue;
    DiffRow row{k, {}};
    bool differs = false;
    for (const auto& c : configs) {
      auto it = c.find(k);
      row.values.push_back(it == c.end() ? MISSING : it->second);
      if (row.values.back() != row.values.front()) differs = true;
    }
    if (differs) rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace ui

// Configs as flat key → value tables ("train.lr" → "0.003"), from the JSON the run records store,
// and the diff of several runs' configs: only the keys whose values are not all the same.
// Pure functions, tested without GL.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ui {

// Dotted key → display value: strings without quotes, numbers and booleans as JSON writes them,
// arrays as compact JSON. Invalid or empty JSON gives an empty table.
using FlatConfig = std::map<std::string, std::string>;
FlatConfig flatten_config_json(const std::string& json);

struct DiffRow {
  std::string key;
  std::vector<std::string> values;  // one per config, in the order given; MISSING where absent
};
// Shown for a key one config does not have (an older run before the key existed).
extern const char* const MISSING;

// Keys whose values differ between the configs (or are missing in some), sorted by key. The run
// name is left out: every run has its own, and the diff table's columns are already headed by it.
std::vector<DiffRow> config_diff(const std::vector<FlatConfig>& configs);

}  // namespace ui

// `deltadeck runs compare RUN RUN...`: the runs side by side — a metrics summary, then the config
// keys whose values differ (the name excepted: every run has its own).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include "app/runs_command.h"
#include "app/runs_common.h"
#include "ui/log/log_line.h"

namespace app {

namespace {

using Flat = std::map<std::string, std::string>;

// "train.lr" -> "0.003": nested objects by dotted key, strings unquoted, the rest as compact JSON.
void flatten(const nlohmann::json& j, const std::string& prefix, Flat& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
  } else if (j.is_string()) {
    out[prefix] = j.get<std::string>();
  } else {
    out[prefix] = j.dump();
  }
}

// Values wider than a column are cut: from their start, or where `from` says (the place a row's
// values start to differ), with "..." where text was left out.
std::string cell(const std::string& v, size_t width, size_t from = 0) {
  if (v.size() <= width) return v;
  const size_t keep = width - 3;  // beside one "..."
  if (from == 0) return v.substr(0, keep) + "...";
  if (from + keep >= v.size()) return "..." + v.substr(v.size() - keep);  // the end fits
  return "..." + v.substr(from, keep - 3) + "...";
}

// Where a row's cells should start so that values sharing a long start still look different: a
// few characters before the first difference, or 0 when it falls inside the first cut.
size_t difference_start(const std::vector<std::string>& values, size_t width) {
  size_t common = values.empty() ? 0 : values[0].size();
  for (const auto& v : values) {
    size_t i = 0;
    while (i < common && i < v.size() && v[i] == values[0][i]) ++i;
    common = i;
  }
  return common + 3 < width ? 0 : common - std::min<size_t>(common, 4);
}

void print_row(const std::string& label, const std::vector<std::string>& values, size_t label_w, size_t col_w,
               size_t from = 0) {
  std::printf("  %-*s", static_cast<int>(label_w), label.c_str());
  for (const auto& v : values) std::printf("  %-*s", static_cast<int>(col_w), cell(v, col_w, from).c_str());
  std::printf("\n");
}

}  // namespace

int runs_compare(const RunsArgs& a) {
  if (a.runs.size() < 2) {
    std::cerr << "deltadeck: runs compare: name at least two runs\n";
    return 2;
  }
  auto store = runs::open_store(a.runs_dir, /*read_only=*/true);
  if (!store) return 1;
  auto list = runs::find_all(*store, a.runs);
  if (!list) return 1;

  std::vector<runs::Summary> sums;
  std::vector<Flat> configs;
  size_t col_w = 10;
  for (const auto& r : *list) {
    sums.push_back(runs::summarize(*store, r.id));
    Flat f;
    const auto j = nlohmann::json::parse(store->run_config_json(r.id), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) flatten(j, "", f);
    configs.push_back(std::move(f));
    col_w = std::max(col_w, r.name.size() + 3 + std::to_string(r.id).size() + 3);
  }
  col_w = std::min<size_t>(col_w, 28);
  auto row = [&](const std::string& label, auto value_of) {
    std::vector<std::string> values;
    for (size_t i = 0; i < list->size(); ++i) values.push_back(value_of((*list)[i], sums[i], configs[i]));
    print_row(label, values, 16, col_w);
  };
  using R = const storage::RunSummary&;
  using S = const runs::Summary&;
  using C = const Flat&;
  auto total_steps = [](C c) {
    auto it = c.find("train.steps");
    return it == c.end() ? std::string("?") : it->second;
  };

  std::cout << "runs:\n";
  row("", [](R r, S, C) { return r.name + " (" + std::to_string(r.id) + ")"; });
  row("status", [](R r, S, C) { return r.status; });
  row("model", [](R r, S, C) { return r.model; });
  row("params", [](R r, S, C) { return ui::format_count(static_cast<double>(r.params)); });
  row("steps", [&](R, S s, C c) { return std::to_string(s.last_step) + "/" + total_steps(c); });
  row("tokens", [](R, S s, C) { return ui::format_count(static_cast<double>(s.tokens)); });
  row("wall time", [](R, S s, C) { return ui::format_duration(s.wall_s); });
  row("final loss", [](R, S s, C) { return s.has_loss ? runs::fmt("%.4f", s.final_loss) : "-"; });
  row("best loss", [](R, S s, C) { return s.has_loss ? runs::fmt("%.4f", s.best_loss) : "-"; });
  row("final val_loss", [](R, S s, C) { return s.has_val ? runs::fmt("%.4f", s.final_val) : "-"; });
  row("best val_loss", [](R, S s, C) {
    return s.has_val ? runs::fmt("%.4f", s.best_val) + " @" + std::to_string(s.best_val_step) : "-";
  });
  row("tokens/s", [](R, S s, C) { return s.median_tokens_per_s >= 0 ? ui::format_count(s.median_tokens_per_s) : "-"; });
  row("mfu", [](R, S s, C) { return s.median_mfu >= 0 ? runs::fmt("%.1f%%", 100 * s.median_mfu) : "-"; });
  row("peak memory", [](R, S s, C) { return s.peak_mem_gib >= 0 ? runs::fmt("%.1f GiB", s.peak_mem_gib) : "-"; });
  bool any_tags = false;
  for (const auto& r : *list) any_tags |= !r.tags.empty();
  if (any_tags) {
    row("tags", [](R r, S, C) {
      std::string t;
      for (const auto& x : r.tags) t += (t.empty() ? "" : ",") + x;
      return t.empty() ? "-" : t;
    });
  }

  // Config keys whose values are not the same in every run (a key an older run lacks counts).
  std::map<std::string, bool> keys;
  for (const auto& c : configs)
    for (const auto& [k, v] : c) keys[k] = true;
  std::vector<std::string> differing;
  for (const auto& [k, unused] : keys) {
    if (k == "name") continue;
    const auto first = configs[0].find(k);
    for (const auto& c : configs) {
      const auto it = c.find(k);
      const bool same = (it == c.end()) == (first == configs[0].end()) && (it == c.end() || it->second == first->second);
      if (!same) {
        differing.push_back(k);
        break;
      }
    }
  }
  if (differing.empty()) {
    std::cout << "config: the same in every run (the name aside)\n";
    return 0;
  }
  size_t key_w = 16;
  for (const auto& k : differing) key_w = std::max(key_w, k.size());
  std::cout << "config differences (" << differing.size() << (differing.size() == 1 ? " key" : " keys") << "):\n";
  for (const auto& k : differing) {
    std::vector<std::string> values;
    for (const auto& c : configs) {
      const auto it = c.find(k);
      values.push_back(it == c.end() ? "(absent)" : it->second);
    }
    print_row(k, values, key_w, col_w, difference_start(values, col_w));
  }
  return 0;
}

}  // namespace app

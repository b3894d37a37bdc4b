// `deltadeck runs export RUN --format csv|json [--out FILE]`.
//   csv:  every metric row, `step,tokens,wall_s,key,value`, by key then step; values with 17
//         significant digits so they read back bit for bit (the desktop app's CSV export is the same).
//   json: one document: "run" (the record, tags, note), "config" (the resolved config), "metrics"
//         (per key, columns "step", "tokens", "wall_s", "value"), "checkpoints", "events".
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "app/runs_command.h"
#include "app/runs_common.h"

namespace app {

namespace {

using Json = nlohmann::ordered_json;

Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

int64_t write_csv(const storage::RunStore& store, int64_t run_id, std::ostream& out) {
  out << "step,tokens,wall_s,key,value\n";
  int64_t rows = 0;
  char buf[128];
  for (const std::string& key : store.metric_keys(run_id)) {
    for (const storage::MetricPoint& p : store.metrics(run_id, key)) {
      // Keys are metric names (letters, digits, '.', '_'): no quoting needed.
      std::snprintf(buf, sizeof buf, "%lld,%lld,%.17g,", static_cast<long long>(p.step),
                    static_cast<long long>(p.tokens), p.wall_s);
      out << buf << key;
      std::snprintf(buf, sizeof buf, ",%.17g\n", p.value);
      out << buf;
      ++rows;
    }
  }
  return rows;
}

int64_t write_json(const storage::RunStore& store, const storage::RunSummary& r, std::ostream& out) {
  Json doc;
  doc["run"] = {{"id", r.id},           {"name", r.name},         {"status", r.status},     {"message", r.message},
                {"model", r.model},     {"params", r.params},     {"world_size", r.world_size},
                {"host", r.host},       {"revision", r.revision}, {"started_at", r.started_at},
                {"ended_at", r.ended_at}, {"last_step", r.last_step}, {"tags", r.tags}, {"note", r.note}};
  doc["config"] = Json::parse(store.run_config_json(r.id), nullptr, /*allow_exceptions=*/false);
  if (doc["config"].is_discarded()) doc["config"] = nullptr;
  Json metrics = Json::object();
  int64_t rows = 0;
  for (const std::string& key : store.metric_keys(r.id)) {
    Json steps = Json::array(), tokens = Json::array(), wall = Json::array(), values = Json::array();
    for (const storage::MetricPoint& p : store.metrics(r.id, key)) {
      steps.push_back(p.step);
      tokens.push_back(p.tokens);
      wall.push_back(number(p.wall_s));
      values.push_back(number(p.value));
      ++rows;
    }
    metrics[key] = {{"step", steps}, {"tokens", tokens}, {"wall_s", wall}, {"value", values}};
  }
  doc["metrics"] = std::move(metrics);
  Json cks = Json::array();
  for (const auto& c : store.checkpoints(r.id)) {
    cks.push_back({{"step", c.step}, {"path", c.path}, {"bytes", c.bytes}, {"sha256", c.sha256},
                   {"created_at", c.created_at}});
  }
  doc["checkpoints"] = std::move(cks);
  Json events = Json::array();
  for (const auto& e : store.events(r.id)) {
    events.push_back({{"step", e.step}, {"level", e.level}, {"text", e.text}, {"created_at", e.created_at}});
  }
  doc["events"] = std::move(events);
  out << doc.dump(1, ' ', false, Json::error_handler_t::replace) << "\n";
  return rows;
}

}  // namespace

int runs_export(const RunsArgs& a) {
  if (a.format != "csv" && a.format != "json") {
    std::cerr << "deltadeck: runs export --format: must be csv or json (got \"" << a.format << "\")\n";
    return 2;
  }
  auto store = runs::open_store(a.runs_dir, /*read_only=*/true);
  if (!store) return 1;
  auto r = runs::find(*store, a.run);
  if (!r) return 1;
  std::ofstream file;
  if (a.out != "-") {
    file.open(a.out, std::ios::binary | std::ios::trunc);
    if (!file) {
      std::cerr << "deltadeck: runs export --out: cannot write " << a.out << "\n";
      return 1;
    }
  }
  std::ostream& out = a.out == "-" ? std::cout : file;
  const int64_t rows = a.format == "csv" ? write_csv(*store, r->id, out) : write_json(*store, *r, out);
  out.flush();
  if (!out) {
    std::cerr << "deltadeck: runs export: writing " << (a.out == "-" ? "stdout" : a.out) << " failed\n";
    return 1;
  }
  if (a.out != "-") {
    std::cerr << "exported run '" << r->name << "' (" << rows << " metric rows) as " << a.format << " to " << a.out << "\n";
  }
  return 0;
}

}  // namespace app

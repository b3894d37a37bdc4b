// `deltadeck runs export RUN --format csv|json [--out FILE]`.
//   csv:  every metric row, `step,tokens,wall_s,key,value`, by key then step; values with 17
//         significant digits so they read back bit for bit (the desktop app's CSV export is the same).
//   json: the run's record (app/run_record.h): "run" (the record, tags, note), "config" (the
//         resolved config) and "config_toml", "metrics" (per key, columns "step", "tokens",
//         "wall_s", "value"), "checkpoints", "events"; `runs import` reads it back.
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "app/runs_command.h"
#include "app/run_record.h"
#include "app/runs_common.h"
#include "storage/file_util.h"

namespace app {

namespace {

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
  const auto doc = run_record_json(store, r);
  out << doc.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  int64_t rows = 0;
  for (const auto& m : doc["metrics"]) rows += static_cast<int64_t>(m["step"].size());
  return rows;
}

// Whether two paths name the same file (device and inode); false when either does not exist.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa{}, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

int runs_export(const RunsArgs& a) {
  if (a.format != "csv" && a.format != "json") {
    std::cerr << "deltadeck: runs export --format: must be csv or json (got \"" << a.format << "\")\n";
    return 2;
  }
  if (a.out.empty()) {
    std::cerr << "deltadeck: runs export --out: give a file, or - for stdout\n";
    return 2;
  }
  const bool to_file = a.out != "-";
  // The database and its WAL files are never an export's target, --force or not; another existing
  // file only with --force.
  const std::string db = a.runs_dir + "/deltadeck.db";
  if (to_file && (same_file(a.out, db) || same_file(a.out, db + "-wal") || same_file(a.out, db + "-shm"))) {
    std::cerr << "deltadeck: runs export --out: " << a.out << " is the run database; export to another file\n";
    return 2;
  }
  if (to_file && !a.force && storage::files::exists(a.out)) {
    std::cerr << "deltadeck: runs export --out: " << a.out << " exists; pass --force to replace it\n";
    return 2;
  }
  auto store = runs::open_store(a.runs_dir, /*read_only=*/true);
  if (!store) return 1;
  auto r = runs::find(*store, a.run);
  if (!r) return 1;
  // A file is written under a temporary name and renamed over --out once whole, so a failed export
  // leaves what was there.
  const std::string tmp = a.out + ".tmp";
  std::ofstream file;
  if (to_file) {
    file.open(tmp, std::ios::binary | std::ios::trunc);
    if (!file) {
      std::cerr << "deltadeck: runs export --out: cannot write " << tmp << " (" << std::strerror(errno) << ")\n";
      return 1;
    }
  }
  std::ostream& out = to_file ? file : std::cout;
  const int64_t rows = a.format == "csv" ? write_csv(*store, r->id, out) : write_json(*store, *r, out);
  out.flush();
  if (to_file) file.close();
  if (!out || (to_file && !file)) {
    std::cerr << "deltadeck: runs export: writing " << (to_file ? tmp : "stdout") << " failed\n";
    if (to_file) std::remove(tmp.c_str());
    return 1;
  }
  if (to_file && std::rename(tmp.c_str(), a.out.c_str()) != 0) {
    std::cerr << "deltadeck: runs export --out: cannot rename " << tmp << " to " << a.out << " ("
              << std::strerror(errno) << ")\n";
    std::remove(tmp.c_str());
    return 1;
  }
  if (a.out != "-") {
    std::cerr << "exported run '" << r->name << "' (" << rows << " metric rows) as " << a.format << " to " << a.out << "\n";
  }
  return 0;
}

}  // namespace app

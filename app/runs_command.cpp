// `deltadeck runs ...`. Opens the database read-only, so it never blocks or migrates a database a
// training process is writing.
#include "app/runs_command.h"

#include <cstdio>
#include <iostream>
#include <map>

#include "storage/file_util.h"
#include "storage/run_store.h"
#include "ui/log/log_line.h"

namespace app {

namespace {

std::unique_ptr<storage::RunStore> open_store(const std::string& runs_dir) {
  const std::string path = runs_dir + "/deltadeck.db";
  if (!storage::files::exists(path)) {
    std::cerr << "deltadeck: no run database at " << path << " (start a run with `deltadeck train`, or pass --runs-dir)\n";
    return nullptr;
  }
  try {
    return storage::RunStore::open(path, /*read_only=*/true);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return nullptr;
  }
}

std::string fixed(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

}  // namespace

int runs_list(const std::string& runs_dir) {
  auto store = open_store(runs_dir);
  if (!store) return 1;
  auto runs = store->list_runs();
  if (runs.empty()) {
    std::cout << "no runs yet in " << store->path() << "\n";
    return 0;
  }
  std::printf("%-5s %-20s %-12s %-12s %10s %8s %12s  %s\n", "id", "name", "status", "model", "params", "step",
              "val_loss", "started");
  for (const auto& r : runs) {
    auto val = store->metrics(r.id, "val_loss");
    const std::string last_val = val.empty() ? "-" : fixed(val.back().value, 4);
    std::printf("%-5lld %-20s %-12s %-12s %10s %8lld %12s  %s\n", static_cast<long long>(r.id), r.name.c_str(),
                r.status.c_str(), r.model.c_str(), ui::format_count(static_cast<double>(r.params)).c_str(),
                static_cast<long long>(r.last_step), last_val.c_str(), r.started_at.c_str());
  }
  return 0;
}

int runs_show(const std::string& runs_dir, const std::string& run) {
  auto store = open_store(runs_dir);
  if (!store) return 1;
  storage::RunSummary r;
  try {
    r = store->find_run(run);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  std::cout << "run " << r.id << " '" << r.name << "'\n"
            << "  status     " << r.status << (r.message.empty() ? "" : " (" + r.message + ")") << "\n"
            << "  model      " << r.model << ", " << r.params << " parameters\n"
            << "  host       " << r.host << " (pid " << r.pid << "), world size " << r.world_size << "\n"
            << "  revision   " << r.revision << "\n"
            << "  started    " << r.started_at << "\n"
            << "  ended      " << (r.ended_at.empty() ? "-" : r.ended_at) << "\n";
  std::cout << "metrics (last / min over the run):\n";
  for (const auto& key : store->metric_keys(r.id)) {
    auto pts = store->metrics(r.id, key);
    if (pts.empty()) continue;
    double mn = pts.front().value;
    for (const auto& p : pts) mn = std::min(mn, p.value);
    std::printf("  %-14s %12.6g at step %-8lld min %12.6g  (%zu points)\n", key.c_str(), pts.back().value,
                static_cast<long long>(pts.back().step), mn, pts.size());
  }
  auto ckpts = store->checkpoints(r.id);
  std::cout << "checkpoints:" << (ckpts.empty() ? " none" : "") << "\n";
  for (const auto& c : ckpts)
    std::cout << "  step " << c.step << "  " << c.path << "  " << c.bytes << " bytes  sha256 " << c.sha256.substr(0, 16)
              << "...\n";
  auto events = store->events(r.id);
  std::cout << "events:" << (events.empty() ? " none" : "") << "\n";
  for (const auto& e : events)
    std::cout << "  [" << e.created_at << "] step " << e.step << " " << e.level << ": " << e.text << "\n";
  std::cout << "config:\n" << store->run_config_toml(r.id);
  return 0;
}

}  // namespace app

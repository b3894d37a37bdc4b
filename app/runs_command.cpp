// `deltadeck runs list|show|tag|note|rename|delete|import`, and the helpers every runs subcommand shares.
#include "app/runs_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>

#include "app/run_owner.h"
#include "app/run_record.h"
#include "app/runs_common.h"
#include "storage/file_util.h"
#include "trainer/config.h"
#include "ui/log/log_line.h"

namespace app {

namespace runs {

std::unique_ptr<storage::RunStore> open_store(const std::string& runs_dir, bool read_only) {
  const std::string path = runs_dir + "/deltadeck.db";
  if (!storage::files::exists(path)) {
    std::cerr << "deltadeck: no run database at " << path << " (start a run with `deltadeck train`, or pass --runs-dir)\n";
    return nullptr;
  }
  try {
    return read_only ? storage::RunStore::open_for_display(path) : storage::RunStore::open(path);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return nullptr;
  }
}

std::optional<storage::RunSummary> find(const storage::RunStore& store, const std::string& run) {
  try {
    return store.find_run(run);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return std::nullopt;
  }
}

std::optional<std::vector<storage::RunSummary>> find_all(const storage::RunStore& store,
                                                         const std::vector<std::string>& names) {
  std::vector<storage::RunSummary> out;
  for (const std::string& n : names) {
    auto r = find(store, n);
    if (!r) return std::nullopt;
    for (const auto& seen : out) {
      if (seen.id == r->id) {
        std::cerr << "deltadeck: run '" << r->name << "' (id " << r->id << ") is named twice\n";
        return std::nullopt;
      }
    }
    out.push_back(*r);
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

namespace {

// The point with the lowest value, NaN points (a skipped step's loss) passed over; a NaN point
// when every value is NaN. `points` is not empty.
storage::MetricPoint lowest(const std::vector<storage::MetricPoint>& points) {
  const storage::MetricPoint* best = &points.front();
  for (const auto& p : points) {
    if (std::isnan(best->value) || p.value < best->value) best = &p;
  }
  return *best;
}

}  // namespace

Summary summarize(const storage::RunStore& store, int64_t run_id) {
  Summary s;
  auto loss = store.metrics(run_id, "loss");
  if (!loss.empty()) {
    s.has_loss = true;
    s.last_step = loss.back().step;
    s.tokens = loss.back().tokens;
    s.wall_s = loss.back().wall_s;
    s.final_loss = loss.back().value;
    s.best_loss = lowest(loss).value;
  }
  auto val = store.metrics(run_id, "val_loss");
  if (!val.empty()) {
    s.has_val = true;
    s.final_val = val.back().value;
    const storage::MetricPoint best = lowest(val);
    s.best_val = best.value;
    s.best_val_step = best.step;
  }
  auto median = [&](const char* key) {
    auto pts = store.metrics(run_id, key);
    if (pts.empty()) return -1.0;
    std::vector<double> v;
    for (const auto& p : pts) v.push_back(p.value);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  s.median_tokens_per_s = median("tokens_per_s");
  s.median_mfu = median("mfu");
  for (const auto& p : store.metrics(run_id, "mem_peak_gib")) s.peak_mem_gib = std::max(s.peak_mem_gib, p.value);
  return s;
}

}  // namespace runs

namespace {

// The folder of run r (its checkpoints, record and owner file), from its recorded config; "" when
// that config does not parse.
std::string run_folder_of(const storage::RunStore& store, const storage::RunSummary& r) {
  trainer::ConfigResult parsed = trainer::parse_config(store.run_config_toml(r.id), "run config", {});
  if (!parsed.ok()) return "";
  trainer::RunConfig cfg = parsed.config;
  cfg.run.runs_dir = storage::files::parent_dir(store.path());
  if (cfg.run.runs_dir.empty()) cfg.run.runs_dir = ".";
  return trainer::run_folder(cfg, r.name);
}

// After an edit, the record in the run's folder (app/run_record.h) says the same as the database.
// A warning, never a failure: the edit itself is done.
void refresh_record(const storage::RunStore& store, int64_t run_id) {
  try {
    const auto r = store.run(run_id);
    if (!r || !store.imported_from(run_id).empty()) return;  // an imported run's record is its database's
    const std::string folder = run_folder_of(store, *r);
    if (folder.empty()) return;
    const std::string why = refresh_run_record(store, *r, folder);
    if (!why.empty()) std::cerr << "warning: run '" << r->name << "': its record was not rewritten: " << why << "\n";
  } catch (const std::exception& e) {
    std::cerr << "warning: the run's record was not rewritten: " << e.what() << "\n";
  }
}


std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string ask(const std::string& question) {
  std::cerr << question << std::flush;
  std::string answer;
  if (!std::getline(std::cin, answer)) return "";
  return answer;
}

}  // namespace

int runs_list(const RunsArgs& a) {
  auto store = runs::open_store(a.runs_dir, /*read_only=*/true);
  if (!store) return 1;
  const std::vector<std::string> statuses = {"running", "finished", "stopped", "failed", "interrupted", "preempted", "diverged"};
  if (!a.status.empty() && std::find(statuses.begin(), statuses.end(), a.status) == statuses.end()) {
    std::cerr << "deltadeck: runs list --status: must be one of " << join(statuses) << " (got \"" << a.status << "\")\n";
    return 2;
  }
  const std::vector<storage::RunSummary> list = store->list_runs({a.status, a.tag});
  if (list.empty()) {
    std::cout << "no runs" << (a.status.empty() ? "" : " with status " + a.status)
              << (a.tag.empty() ? "" : " tagged " + a.tag) << " in " << store->path() << "\n";
    return 0;
  }
  int name_w = 4;
  for (const auto& r : list) name_w = std::max(name_w, std::min(40, static_cast<int>(r.name.size())));
  std::printf("%-5s %-*s %-12s %-12s %8s %8s %9s  %-20s  %s\n", "id", name_w, "name", "status", "model", "params", "step",
              "val_loss", "started", "tags");
  for (const auto& r : list) {
    auto val = store->metrics(r.id, "val_loss");
    const std::string last_val = val.empty() ? "-" : runs::fmt("%.4f", val.back().value);
    std::printf("%-5lld %-*s %-12s %-12s %8s %8lld %9s  %-20s  %s\n", static_cast<long long>(r.id), name_w, r.name.c_str(),
                r.status.c_str(), r.model.c_str(), ui::format_count(static_cast<double>(r.params)).c_str(),
                static_cast<long long>(r.last_step), last_val.c_str(), r.started_at.c_str(), join(r.tags, ",").c_str());
  }
  return 0;
}

int runs_show(const RunsArgs& a) {
  auto store = runs::open_store(a.runs_dir, /*read_only=*/true);
  if (!store) return 1;
  auto found = runs::find(*store, a.run);
  if (!found) return 1;
  const storage::RunSummary& r = *found;
  std::cout << "run " << r.id << " '" << r.name << "'\n"
            << "  status     " << r.status << (r.message.empty() ? "" : " (" + r.message + ")") << "\n"
            << "  model      " << r.model << ", " << r.params << " parameters\n"
            << "  host       " << r.host << " (pid " << r.pid << "), world size " << r.world_size << "\n"
            << "  revision   " << r.revision << "\n"
            << "  started    " << r.started_at << "\n"
            << "  ended      " << (r.ended_at.empty() ? "-" : r.ended_at) << "\n";
  if (!r.tags.empty()) std::cout << "  tags       " << join(r.tags) << "\n";
  if (!r.note.empty()) std::cout << "  note       " << r.note << "\n";
  const runs::Summary s = runs::summarize(*store, r.id);
  std::cout << "summary:\n";
  if (s.has_loss) {
    std::cout << "  progress   step " << s.last_step << ", " << ui::format_count(static_cast<double>(s.tokens))
              << " tokens, " << ui::format_duration(s.wall_s) << "\n"
              << "  loss       final " << runs::fmt("%.4f", s.final_loss) << ", best " << runs::fmt("%.4f", s.best_loss)
              << "\n";
  } else {
    std::cout << "  no training steps logged\n";
  }
  if (s.has_val) {
    std::cout << "  val_loss   final " << runs::fmt("%.4f", s.final_val) << ", best " << runs::fmt("%.4f", s.best_val)
              << " at step " << s.best_val_step << "\n";
  }
  if (s.median_tokens_per_s >= 0) std::cout << "  tokens/s   " << ui::format_count(s.median_tokens_per_s) << " (median)\n";
  if (s.median_mfu >= 0) std::cout << "  mfu        " << runs::fmt("%.1f", 100 * s.median_mfu) << "% (median)\n";
  if (s.peak_mem_gib >= 0) std::cout << "  memory     " << runs::fmt("%.1f", s.peak_mem_gib) << " GiB (peak)\n";
  std::cout << "metrics (last / min over the run):\n";
  for (const auto& key : store->metric_keys(r.id)) {
    auto pts = store->metrics(r.id, key);
    if (pts.empty()) continue;
    const double mn = runs::lowest(pts).value;
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

int runs_tag(const RunsArgs& a) {
  auto store = runs::open_store(a.runs_dir, /*read_only=*/false);
  if (!store) return 1;
  auto r = runs::find(*store, a.run);
  if (!r) return 1;
  for (const std::string& tag : a.tags) {
    try {
      const bool changed = a.remove ? store->remove_tag(r->id, tag) : store->add_tag(r->id, tag);
      if (!changed) std::cerr << "note: run '" << r->name << "' " << (a.remove ? "had no tag " : "already has tag ") << tag << "\n";
    } catch (const std::exception& e) {
      std::cerr << "deltadeck: " << e.what() << "\n";
      return 2;
    }
  }
  const auto tags = store->tags(r->id);
  std::cout << "run '" << r->name << "' (id " << r->id << ") tags: " << (tags.empty() ? "none" : join(tags)) << "\n";
  refresh_record(*store, r->id);
  return 0;
}

int runs_note(const RunsArgs& a) {
  auto store = runs::open_store(a.runs_dir, /*read_only=*/false);
  if (!store) return 1;
  auto r = runs::find(*store, a.run);
  if (!r) return 1;
  store->set_note(r->id, a.text);
  if (a.text.empty()) std::cout << "run '" << r->name << "' (id " << r->id << "): note cleared\n";
  else std::cout << "run '" << r->name << "' (id " << r->id << ") note: " << a.text << "\n";
  refresh_record(*store, r->id);
  return 0;
}

int runs_rename(const RunsArgs& a) {
  auto store = runs::open_store(a.runs_dir, /*read_only=*/false);
  if (!store) return 1;
  auto r = runs::find(*store, a.run);
  if (!r) return 1;
  try {
    store->rename_run(r->id, a.text);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: cannot rename run '" << r->name << "': " << e.what() << "\n";
    return 2;
  }
  std::cout << "renamed run " << r->id << " '" << r->name << "' to '" << a.text << "'\n";
  refresh_record(*store, r->id);
  return 0;
}

int runs_delete(const RunsArgs& a) {
  auto store = runs::open_store(a.runs_dir, /*read_only=*/false);
  if (!store) return 1;
  auto list = runs::find_all(*store, a.runs);
  if (!list) return 1;
  for (const auto& r : *list) {
    if (r.status == "running") {
      std::cerr << "deltadeck: run '" << r.name << "' is running (pid " << r.pid << " on " << r.host
                << "); stop it before deleting it\n";
      return 1;
    }
    // Its folder may be another database's run's now (a job of the chain elsewhere resumed it).
    if (!store->imported_from(r.id).empty()) continue;  // deleting an imported run leaves its files
    const std::string folder = run_folder_of(*store, r);
    if (const std::string busy = folder.empty() ? "" : run_folder_busy(folder, /*wait=*/false, nullptr);
        !busy.empty()) {
      std::cerr << "deltadeck: run '" << r.name << "' " << busy << "; stop it before deleting it\n";
      return 1;
    }
  }
  int rc = 0;
  for (const auto& r : *list) {
    if (!a.yes) {
      const auto cks = store->checkpoints(r.id);
      int64_t bytes = 0;
      for (const auto& c : cks) bytes += c.bytes;
      const std::string answer =
          ask("delete run " + std::to_string(r.id) + " '" + r.name + "' (" + r.status + ", step " +
              std::to_string(r.last_step) + ", " + std::to_string(cks.size()) +
              (cks.size() == 1 ? " checkpoint, " : " checkpoints, ") +
              ui::format_count(static_cast<double>(bytes)) + "B)? [y/N] ");
      if (answer != "y" && answer != "Y" && answer != "yes") {
        std::cerr << "run '" << r.name << "' not deleted" << (std::cin ? "" : " (no answer; pass --yes to delete without asking)")
                  << "\n";
        rc = 2;
        continue;
      }
    }
    try {
      const storage::DeletedRun d = store->delete_run(r.id);
      std::cout << "deleted run " << r.id << " '" << d.name << "' (" << d.removed.size() << " paths removed)\n";
      for (const auto& k : d.kept) std::cerr << "  kept " << k << "\n";
    } catch (const std::exception& e) {
      std::cerr << "deltadeck: cannot delete run '" << r.name << "': " << e.what() << "\n";
      rc = 1;
    }
  }
  return rc;
}

int runs_import(const RunsArgs& a) {
  std::unique_ptr<storage::RunStore> store;
  const std::string db = a.runs_dir + "/deltadeck.db";
  try {
    store = storage::RunStore::open(db);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  int rc = 0;
  for (const std::string& path : a.paths) {
    std::string file = path;
    try {
      storage::ImportedRun run = read_run_record(path, &file);
      const int64_t id = store->import_run(run);
      std::cout << "imported run '" << run.record.name << "' (id " << id << ", " << run.record.status << ") from "
                << file << ": " << run.metrics.size() << " metric rows, " << run.checkpoints.size()
                << (run.checkpoints.size() == 1 ? " checkpoint, " : " checkpoints, ") << run.events.size()
                << (run.events.size() == 1 ? " event\n" : " events\n");
    } catch (const std::exception& e) {
      std::cerr << "deltadeck: runs import " << path << ": " << e.what() << "\n";
      rc = 1;
    }
  }
  return rc;
}

}  // namespace app

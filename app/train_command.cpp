// `deltadeck train`: the config and the run record (new or resumed) are prepared here; an
// app::RunHost then runs the engine and forwards its events to the database, and a front end shows
// them: the terminal dashboard when stdout and stdin are a terminal, plain text or JSON lines
// otherwise (or as --log-format asks). Nodes other than 0 of a multi-node run log to a file only.
#include "app/train_command.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <optional>
#include <variant>

#include <nlohmann/json.hpp>

#include "app/build_info.h"
#include "app/dry_run.h"
#include "app/front_ends.h"
#include "app/node_log.h"
#include "app/run_host.h"
#include "app/run_owner.h"
#include "app/run_record.h"
#include "app/signals.h"
#include "storage/file_util.h"
#include "storage/run_name.h"
#include "storage/run_store.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/device.h"
#include "trainer/rendezvous.h"
#include "trainer/resume_check.h"
#include "trainer/session.h"
#include "ui/tui/terminal.h"

namespace app {

namespace {

void print_errors(const std::string& where, const std::vector<std::string>& errors) {
  std::cerr << "deltadeck: " << where << " has " << errors.size() << (errors.size() == 1 ? " problem" : " problems")
            << "; nothing was started:\n";
  for (const auto& e : errors) std::cerr << "  " << e << "\n";
}

// The config of a new run: --config (or the demo config), --set, --runs-dir, validated and
// resolved. Prints the problems and returns 2 when there are any, else 0.
int load_new_config(const TrainArgs& args, trainer::RunConfig& cfg) {
  trainer::ConfigResult parsed =
      args.config_path.empty()
          ? trainer::parse_config(DEMO_CONFIG_TOML, "<embedded demo config>", args.overrides)
          : trainer::load_config(args.config_path, args.overrides);
  const std::string where = args.config_path.empty() ? "the demo config" : args.config_path;
  if (!parsed.ok()) {
    print_errors(where, parsed.errors);
    return 2;
  }
  cfg = parsed.config;
  if (!args.runs_dir.empty()) cfg.run.runs_dir = args.runs_dir;
  auto unresolved = trainer::resolve_config(cfg);
  if (!unresolved.empty()) {
    print_errors(where, unresolved);
    return 2;
  }
  return 0;
}

// A new run from --config (or the demo config) and --set. Returns the exit code on failure.
int prepare_new_run(const TrainArgs& args, int nnodes, PreparedRun& out) {
  trainer::RunConfig cfg;
  if (int rc = load_new_config(args, cfg); rc != 0) return rc;
  const int64_t world = static_cast<int64_t>(trainer::rank_devices(cfg.run.devices).size()) * nnodes;
  out = record_new_run(std::move(cfg), world, REVISION);
  return 0;
}

// Where a resume looks for the record (storage::RUN_RECORD_FILE) of a run its database does not
// know: under the run.checkpoint_dir this command's --set gives, then under the runs folder.
std::vector<std::string> record_bases(const TrainArgs& args, const std::string& runs_dir) {
  std::vector<std::string> bases;
  // That key's --set alone, on the defaults: the others are checked against the run's own config later.
  std::vector<std::string> dir_set;
  for (const std::string& o : args.overrides) {
    const auto key_end = o.find('=');
    std::string key = o.substr(0, key_end);
    key.erase(std::remove_if(key.begin(), key.end(), [](unsigned char c) { return std::isspace(c); }), key.end());
    if (key_end != std::string::npos && key == "run.checkpoint_dir") dir_set.push_back(o);
  }
  const trainer::ConfigResult parsed = trainer::parse_config("[data]\ntrain = [\"text:-\"]\n", "--set", dir_set);
  if (!dir_set.empty() && parsed.ok() && !parsed.config.run.checkpoint_dir.empty())
    bases.push_back(storage::files::absolute_path(parsed.config.run.checkpoint_dir));
  bases.push_back(runs_dir);
  return bases;
}

// The record file of run `which` under `bases` (<base>/<which>/run_record.json), or for "latest"
// the record written last (a run's record is rewritten at each of its checkpoints); "" when none.
// *written_s (optional) gets the chosen record's modification time, seconds since the epoch.
std::string find_run_record(const std::vector<std::string>& bases, const std::string& which,
                            std::time_t* written_s = nullptr) {
  std::string best;
  int64_t best_ns = -1;
  for (const std::string& base : bases) {
    if (which != "latest") {
      if (!storage::run_name_problem(which).empty()) return "";
      const std::string f = base + "/" + which + "/" + storage::RUN_RECORD_FILE;
      if (storage::files::exists(f)) return f;
      continue;
    }
    for (const std::string& entry : storage::files::list_dir(base)) {
      const std::string f = base + "/" + entry + "/" + storage::RUN_RECORD_FILE;
      struct stat st {};
      if (::stat(f.c_str(), &st) != 0) continue;
      const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      if (ns > best_ns) {
        best_ns = ns;
        best = f;
        if (written_s != nullptr) *written_s = st.st_mtim.tv_sec;
      }
    }
  }
  return best;
}

// How much later than a database's newest run was last active a record must have been written for
// "--resume latest" to take the record's run instead: the hosts' clocks are taken to agree within a
// minute (as the run owner file's stamps are, docs/reliability.md).
constexpr std::time_t LATEST_RECORD_MARGIN_S = 60;

// The last sign of life a database holds of a run, UTC ISO 8601 (whichever of its start, heartbeat
// and end is latest; the strings compare as the times do).
std::string last_active(const storage::RunSummary& run) {
  return std::max({run.started_at, run.heartbeat_at, run.ended_at});
}

// --resume RUN|latest, read-only: the run, its recorded config (plus --set) and its newest usable
// checkpoint (damaged ones and unfinished saves are skipped, and listed in `skipped`); node 0 of a
// multi-node run sends the result to the others. A run still alive (on this host, or stamping its
// heartbeat elsewhere) is refused. A checkpoint whose model shape, vocabulary, dtype or world size
// differs from the run's is refused here, before the engine allocates anything, naming the field
// and both values. A run the database does not know (or no database at all) is taken from its
// record (storage::RUN_RECORD_FILE) under run.checkpoint_dir (as --set gives it) or the runs folder,
// and so is a record further along than the database's copy of the run (another job, on another
// node, went on with it): out.adopt holds it, and commit_resume brings it in. Returns 2 after
// printing the problem; throws, naming where it looked, for a run neither knows.
int resolve_resume(const TrainArgs& args, int nnodes, PreparedRun& out, storage::RunSummary& run,
                   std::vector<std::string>* skipped = nullptr) {
  const bool read_only = args.dry_run;
  if (!args.config_path.empty()) {
    std::cerr << "deltadeck: --resume continues with the run's recorded config; change keys with --set, not "
                 "--config\n";
    return 2;
  }
  const std::string runs_dir = args.runs_dir.empty() ? "runs" : args.runs_dir;
  out.db_path = runs_dir + "/deltadeck.db";
  const auto bases = record_bases(args, runs_dir);
  // Thrown, as the database's own "no such run" is: node 0 of a multi-node run sends it to the others.
  auto no_record = [&](const std::string& why) -> int {
    std::string where;
    for (size_t i = 0; i < bases.size(); ++i) where += (i ? " or " : "") + bases[i];
    throw std::runtime_error("--resume " + args.resume + ": " + why + "; and no run record (" +
                             storage::RUN_RECORD_FILE + ") of " + (args.resume == "latest" ? "any run" : "it") +
                             " is in " + where +
                             " (pass --runs-dir, or --set run.checkpoint_dir=... where its checkpoints are)");
  };
  auto adopt_from = [&](const std::string& file) {
    out.adopt = read_run_record(file);
    out.replaces_run = 0;
    run = out.adopt->record;
    run.id = 0;
  };
  const bool have_db = storage::files::exists(out.db_path);
  // A dry run only reads; open_for_display still migrates an older file this user may write.
  if (have_db) out.store = read_only ? storage::RunStore::open_for_display(out.db_path) : storage::RunStore::open(out.db_path);
  if (args.resume == "latest") {
    auto runs = have_db ? out.store->list_runs() : std::vector<storage::RunSummary>{};
    if (runs.empty()) {
      const std::string record = find_run_record(bases, "latest");
      if (record.empty()) return no_record(have_db ? out.db_path + " records no runs" : "no run database at " + out.db_path);
      adopt_from(record);
    } else {
      run = *std::max_element(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
      // A node-local database of a cluster job may hold runs of its own, older than the one the
      // chain's jobs train: that run's record, under run.checkpoint_dir, written after this
      // database's newest run was last active, names the latest run.
      std::time_t written = 0;
      const std::string record = find_run_record(bases, "latest", &written);
      if (!record.empty() && storage::utc_iso8601(written - LATEST_RECORD_MARGIN_S) > last_active(run)) {
        storage::ImportedRun there;
        try {
          there = read_run_record(record);
        } catch (const std::exception& e) {
          std::cerr << "warning: --resume latest: " << e.what() << " (this database's newest run is taken)\n";
        }
        if (!there.record.name.empty() && !same_run(there.record, run)) {
          std::cerr << "deltadeck: --resume latest: " << record << " (run '" << there.record.name << "', written "
                    << storage::utc_iso8601(written) << ") is newer than " << out.db_path << "'s newest run '"
                    << run.name << "' (last active " << last_active(run) << "): run '" << there.record.name
                    << "' is resumed\n";
          std::optional<storage::RunSummary> known;
          try {
            known = out.store->find_run(there.record.name);
          } catch (const std::exception&) {
          }
          if (!known) {
            adopt_from(record);
          } else if (same_run(*known, there.record)) {
            run = *known;  // this database's copy; the record, further along, replaces it below
          } else {
            std::cerr << "deltadeck: --resume latest: " << out.db_path << " holds another run named '"
                      << known->name << "' (started " << known->started_at << ", the record's "
                      << there.record.started_at << "); pass --resume with the run to take, or another "
                      << "--runs-dir; nothing was started\n";
            return 2;
          }
        }
      }
    }
  } else {
    std::string unknown;
    try {
      if (!have_db) throw std::runtime_error("no run database at " + out.db_path);
      run = out.store->find_run(args.resume);
    } catch (const std::exception& e) {
      unknown = e.what();
    }
    if (!unknown.empty()) {
      const std::string record = find_run_record(bases, args.resume);
      if (record.empty()) return no_record(unknown);
      adopt_from(record);
      if (run.name != args.resume) {
        std::cerr << "deltadeck: --resume " << args.resume << ": " << record << " is the record of run '" << run.name
                  << "', not of '" << args.resume << "'; nothing was started\n";
        return 2;
      }
    }
  }
  // Its process alive here, or another machine's or container's with a recent heartbeat: two
  // processes would then train and record the same run.
  if (const std::string busy = storage::still_running(run); !out.adopt && !busy.empty()) {
    std::cerr << "deltadeck: --resume: run '" << run.name << "' " << busy << "\n";
    return 2;
  }
  // The run's config (plus --set) into cfg; false after printing its problems.
  trainer::RunConfig cfg;
  auto load_config = [&](const std::string& toml, const std::string& where) {
    trainer::ConfigResult parsed = trainer::parse_config(toml, where, args.overrides);
    if (!parsed.ok()) {
      print_errors(where, parsed.errors);
      return false;
    }
    cfg = parsed.config;
    cfg.run.runs_dir = runs_dir;
    auto unresolved = trainer::resolve_config(cfg);
    if (!unresolved.empty()) {
      print_errors(where, unresolved);
      return false;
    }
    return true;
  };
  auto record_where = [&] { return "run '" + run.name + "' config (its record " + out.adopt->imported_from + ")"; };
  if (out.adopt) {
    if (!load_config(out.adopt->config_toml, record_where())) return 2;
  } else {
    if (!load_config(out.store->run_config_toml(run.id), "run '" + run.name + "' (id " + std::to_string(run.id) + ") config"))
      return 2;
    // The record beside the checkpoints further along than this database's copy: another database
    // (a job of the chain on other nodes) recorded what came after; its record replaces this copy.
    const std::string record = trainer::run_folder(cfg, run.name) + "/" + storage::RUN_RECORD_FILE;
    if (storage::files::exists(record)) {
      try {
        storage::ImportedRun there = read_run_record(record);
        if (same_run(there.record, run) && there.record.last_step > run.last_step) {
          std::cerr << "deltadeck: --resume: " << record << " is further along than " << out.db_path << " (step "
                    << there.record.last_step << " against " << run.last_step << "): the run is taken from it\n";
          const int64_t old_id = run.id;
          out.adopt = std::move(there);
          out.replaces_run = old_id;
          run = out.adopt->record;
          run.id = 0;
          if (!load_config(out.adopt->config_toml, record_where())) return 2;
        }
      } catch (const std::exception& e) {
        std::cerr << "warning: --resume: " << e.what() << " (the database's copy of the run is used)\n";
      }
    }
  }
  out.run_id = run.id;
  out.run_dir = trainer::run_folder(cfg, run.name);
  // A process of another database (a job of the chain elsewhere) may be training the run now; its
  // owner file beside the checkpoints says so. A recent stamp from another machine is waited on
  // (a dry run only reports it): a job killed there leaves one behind.
  const bool has_owner_file = read_run_owner(out.run_dir).has_value();
  bool waited = false;
  const std::string busy_folder = run_folder_busy(
      out.run_dir, /*wait=*/!read_only, [](const std::string& what) { std::cerr << "deltadeck: --resume: " << what << "\n"; },
      &waited);
  if (!busy_folder.empty()) {
    std::cerr << "deltadeck: --resume: run '" << run.name << "' " << busy_folder << "; nothing was started\n";
    return 2;
  }
  if (waited) {
    // That process may have saved and recorded once more before it ended: the run is looked up
    // again, its record and checkpoints as they are now.
    std::cerr << "deltadeck: --resume: the run folder is free; looking the run up again\n";
    out = PreparedRun{};
    run = storage::RunSummary{};
    if (skipped) skipped->clear();
    return resolve_resume(args, nnodes, out, run, skipped);
  }
  // A record that says running, with no owner file to tell whether its process lives (one written
  // by an older deltadeck).
  if (out.adopt && !has_owner_file && out.adopt->record.message == "imported while its record said running") {
    std::cerr << "warning: --resume: the record of run '" << run.name << "' says it was running when last written ("
              << out.adopt->record.heartbeat_at << "); if that process is still going, stop this one\n";
  }
  try {
    const trainer::CheckpointChoice choice = trainer::choose_checkpoint(out.run_dir);
    for (const std::string& s : choice.skipped) std::cerr << "warning: --resume: skipped " << s << "\n";
    if (skipped) *skipped = choice.skipped;
    if (choice.dir.empty()) {
      std::cerr << "deltadeck: --resume " << args.resume << ": run '" << run.name << "': " << out.run_dir
                << " holds no usable checkpoint\n";
      return 2;
    }
    out.resume_from = choice.dir;
    // A train.steps below what the checkpoint already trained (a typo for a larger number) would
    // "finish" the run at once and record that step count as its config.
    const int64_t from_step = std::stoll(out.resume_from.substr(out.resume_from.rfind("step_") + 5));
    if (cfg.train.steps < from_step) {
      std::cerr << "deltadeck: --resume " << args.resume << ": train.steps = " << cfg.train.steps
                << " is below the step " << from_step << " that " << out.resume_from
                << " already trained; raise it (--set train.steps=N) to go on. Nothing was started\n";
      return 2;
    }
    const int64_t world = static_cast<int64_t>(trainer::rank_devices(cfg.run.devices).size()) * nnodes;
    const auto mismatches =
        trainer::resume_mismatches(trainer::read_compat(out.resume_from), trainer::resume_fingerprint(cfg, world));
    if (!mismatches.empty()) {
      std::cerr << "deltadeck: --resume " << args.resume << ": " << out.resume_from
                << " cannot be resumed with this config; nothing was started:\n";
      for (const auto& m : mismatches) std::cerr << "  " << m << "\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: --resume " << args.resume << ": run '" << run.name << "': " << e.what() << "\n";
    return 2;
  }
  out.cfg = std::move(cfg);
  return 0;
}

// The writes of a resume on node 0, after resolve_resume chose the checkpoint (`skipped`: what the
// choice passed over): the checkpoint renamed back, later ones set aside, the run reopened.
int commit_resume(const TrainArgs& args, PreparedRun& out, storage::RunSummary run,
                  const std::vector<std::string>& skipped) {
  const int64_t step = std::stoll(out.resume_from.substr(out.resume_from.rfind("step_") + 5));
  if (out.adopt) {
    // The run from its record (resolve_resume): into this database first, replacing an older copy.
    try {
      if (!out.store) out.store = storage::RunStore::open(out.db_path);
      run.id = out.store->import_run(*out.adopt, out.replaces_run);
    } catch (const std::exception& e) {
      std::cerr << "deltadeck: --resume " << args.resume << ": " << e.what() << "; nothing was started\n";
      return 2;
    }
    out.run_id = run.id;
    std::cerr << "deltadeck: --resume: took run '" << run.name << "' from its record " << out.adopt->imported_from
              << " (" << out.adopt->metrics.size() << " metric rows, " << out.adopt->checkpoints.size()
              << " checkpoints) into " << out.db_path << "\n";
    out.adopt.reset();
  }
  // Checkpoints after the chosen one are those the choice skipped as damaged: left in place they
  // would count as the newest when pruning, which would then delete the resumed run's fresh saves.
  std::vector<std::string> set_aside;
  try {
    // A checkpoint a crash left moved aside mid-save gets its name back before the run saves again.
    const std::string chosen = out.resume_from;
    out.resume_from = trainer::restore_moved_aside(chosen);
    if (out.resume_from != chosen)
      std::cerr << "deltadeck: --resume: renamed " << chosen << " back to " << out.resume_from
                << " (a save of the same step was cut short)\n";
    for (const auto& [s, to] : trainer::set_aside_checkpoints_after(out.run_dir + "/checkpoints", step)) {
      out.store->remove_checkpoint(run.id, s);
      set_aside.push_back(to);
    }
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: --resume " << args.resume << ": " << e.what() << "; nothing was started\n";
    return 2;
  }
  out.store->reopen_run(run.id);
  if (const std::string changed = record_resumed_config(out, step); !changed.empty())
    std::cerr << "deltadeck: --resume: " << changed << "\n";
  for (const std::string& s : skipped) out.store->add_event({run.id, step, "warn", "resume skipped " + s, ""});
  for (const std::string& to : set_aside) {
    std::cerr << "deltadeck: --resume: set aside " << to << " (after the resumed step " << step << ")\n";
    out.store->add_event({run.id, step, "info", "resume from step " + std::to_string(step) + " set aside " + to, ""});
  }
  const int64_t superseded = out.store->supersede_metrics_after(run.id, step);
  out.store->add_event({run.id, step, "info",
                        "resumed from " + out.resume_from + " (" + std::to_string(superseded) +
                            " metric rows after step " + std::to_string(step) +
                            " marked superseded; the resumed run writes them again)",
                        ""});
  return 0;
}

// --resume on node 0: resolve, then reopen the same run record; metric rows after the checkpoint's
// step are recomputed, so the interrupted attempt's rows are marked superseded (kept, never read
// as current): exactly one current row per (run, step, metric).
int prepare_resume(const TrainArgs& args, int nnodes, PreparedRun& out) {
  storage::RunSummary run;
  std::vector<std::string> skipped;
  if (int rc = resolve_resume(args, nnodes, out, run, &skipped); rc != 0) return rc;
  return commit_resume(args, out, run, skipped);
}

// ---- Several nodes. Every node runs the same command: a new run on all of them, or --resume of the
// same run with the same --set on all, checked first through the nodes' store. On --resume node 0
// resolves the run from its database and sends the result to the other nodes, so they need neither
// the database nor a shared runs folder, only the checkpoint itself (run.checkpoint_dir: a folder
// every node sees at one path). Every node then says whether it can go on; node 0 records or
// reopens the run only if all can, and tells them whether that went through.

// Long enough for the nodes' launches to be minutes apart (as the default run.collective_timeout_s).
constexpr std::chrono::milliseconds kNodesTimeout{600000};
// How long node 0, ending at a refusal, waits for the other nodes to have read why: they read it at
// once, and node 0's store must outlive their reads. A node launched later finds node 0 gone.
constexpr std::chrono::milliseconds kReadPatience{30000};

// Node 0 before it ends at a refusal: waits until every other node said it read `key`.
void wait_until_read(trainer::Rendezvous& rendezvous, const trainer::ClusterSpec& node, const std::string& key) {
  try {
    for (int n = 1; n < node.nnodes; ++n) rendezvous.value_of(key + "_read", n, kReadPatience);
  } catch (const std::exception&) {
    // A node that never came finds node 0 gone and says so itself.
  }
}

// Every node's answer under `key` ("ok" or why not): "" when all are "ok", else the first problem,
// naming its node. Where one is not, node 0 ends only after every node has read that.
std::string nodes_not_ok(trainer::Rendezvous& rendezvous, const trainer::ClusterSpec& node, const std::string& key,
                         const std::string& mine) {
  const auto all = rendezvous.exchange(key, node.node_rank, node.nnodes, mine, kNodesTimeout);
  for (int n = 0; n < node.nnodes; ++n) {
    if (all[n] == "ok") continue;
    if (node.node_rank == 0) wait_until_read(rendezvous, node, key);
    else rendezvous.publish(key + "_read", node.node_rank, "");
    return "node " + std::to_string(n) + ": " + all[n];
  }
  return "";
}

// What this node was asked to do, for the check that every node was asked the same.
std::string launch_of(const TrainArgs& args) {
  if (args.resume.empty()) return "a new run";
  std::string out = "--resume " + args.resume;
  for (const std::string& o : args.overrides) out += " --set " + o;
  if (!args.config_path.empty()) out += " --config " + args.config_path;
  return out;
}

// Meets the other nodes and checks that they run the same command (node 0's answer against each).
// Returns the exit code on a mismatch, after saying which node runs what.
int meet_nodes(const TrainArgs& args, const trainer::ClusterSpec& node,
               std::shared_ptr<trainer::Rendezvous>& rendezvous) {
  rendezvous = trainer::node_rendezvous(node, kNodesTimeout);
  const std::string mine = launch_of(args);
  const auto all = rendezvous->exchange("launch", node.node_rank, node.nnodes, mine, kNodesTimeout);
  std::string problem;
  for (int n = 0; n < node.nnodes && problem.empty(); ++n)
    if (all[n] != all[0]) problem = "node 0 runs " + all[0] + " and node " + std::to_string(n) + " runs " + all[n];
  if (problem.empty()) return 0;
  if (node.node_rank == 0) wait_until_read(*rendezvous, node, "launch");
  else rendezvous->publish("launch_read", node.node_rank, "");
  std::cerr << "deltadeck: every node must run the same train command: " << problem << "; nothing was started\n";
  return 2;
}

// Node 0, once its own preparation (recording or reopening the run) went through or not: tells the
// other nodes, which wait for it before they start (wait_for_node0). Returns rc.
int tell_prepared(trainer::Rendezvous& rendezvous, const trainer::ClusterSpec& node, const std::string& verdict,
                  int rc) {
  rendezvous.publish("prepared", 0, verdict);
  if (verdict != "ok") wait_until_read(rendezvous, node, "prepared");
  return rc;
}

// A node other than 0: waits for node 0's verdict (tell_prepared). Returns the exit code on failure.
int wait_for_node0(const TrainArgs& args, const trainer::ClusterSpec& node, trainer::Rendezvous& rendezvous) {
  const std::string verdict = rendezvous.value_of("prepared", 0, kNodesTimeout);
  if (verdict == "ok") return 0;
  rendezvous.publish("prepared_read", node.node_rank, "");
  std::cerr << "deltadeck: " << (args.resume.empty() ? "" : "--resume " + args.resume + ": ") << "node 0 " << verdict
            << "; nothing was started\n";
  return 2;
}

// Node 0: resolves the run, sends {"name", "from" (the checkpoint, under the name commit_resume gives
// a moved-aside save back), "now" (its path now), "config" (TOML)} or {"error"}, and once every
// node is ready commits the resume as prepare_resume does, then tells them whether that went through.
int prepare_resume_across_nodes(const TrainArgs& args, const trainer::ClusterSpec& node, PreparedRun& out,
                                trainer::Rendezvous& rendezvous) {
  storage::RunSummary run;
  std::vector<std::string> skipped;
  int rc = 1;
  std::string why = "could not resume the run (see node 0's output)";
  try {
    rc = resolve_resume(args, node.nnodes, out, run, &skipped);
  } catch (const std::exception& e) {
    why = e.what();
    std::cerr << "deltadeck: " << why << "\n";
  }
  nlohmann::json plan;
  if (rc == 0) {
    plan["name"] = run.name;
    plan["from"] = storage::files::absolute_path(trainer::restored_name(out.resume_from));
    plan["now"] = storage::files::absolute_path(out.resume_from);
    plan["config"] = trainer::to_toml(out.cfg);
  } else {
    plan["error"] = why;
  }
  rendezvous.publish("resume_plan", 0, plan.dump());
  if (rc != 0) {
    wait_until_read(rendezvous, node, "resume_plan");
    return rc;
  }
  if (const std::string problem = nodes_not_ok(rendezvous, node, "resume_ready", "ok"); !problem.empty()) {
    std::cerr << "deltadeck: --resume " << args.resume << ": " << problem << "; nothing was started\n";
    return 2;
  }
  int committed = 1;
  try {
    committed = commit_resume(args, out, run, skipped);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: --resume " << args.resume << ": " << e.what() << "\n";
  }
  if (committed != 0)
    return tell_prepared(rendezvous, node, "could not reopen the run (see node 0's output)", committed);
  out.resume_from = plan["from"].get<std::string>();  // as the other nodes name it at the session's check
  return tell_prepared(rendezvous, node, "ok", 0);
}

// A new run's config, loaded and checked on this node (load_new_config), then every node's answer:
// returns the exit code where this node or another cannot start it, after saying which.
int load_new_config_on_every_node(const TrainArgs& args, const trainer::ClusterSpec& node,
                                  trainer::Rendezvous& rendezvous, trainer::RunConfig& cfg) {
  const int rc = load_new_config(args, cfg);
  const std::string problem =
      nodes_not_ok(rendezvous, node, "new_ready", rc == 0 ? "ok" : "cannot start the run's config (see its output)");
  if (problem.empty()) return 0;
  std::cerr << "deltadeck: " << problem << "; nothing was started\n";
  return rc != 0 ? rc : 2;
}

// Node 0 of a new run: every node loads and checks the config, and node 0 records the run only if
// all can start (a bad config, or data a node cannot read, stops every node at once).
int prepare_new_run_across_nodes(const TrainArgs& args, const trainer::ClusterSpec& node, PreparedRun& out,
                                 trainer::Rendezvous& rendezvous) {
  trainer::RunConfig cfg;
  if (int rc = load_new_config_on_every_node(args, node, rendezvous, cfg); rc != 0) return rc;
  try {
    const int64_t world = static_cast<int64_t>(trainer::rank_devices(cfg.run.devices).size()) * node.nnodes;
    out = record_new_run(std::move(cfg), world, REVISION);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return tell_prepared(rendezvous, node, std::string("could not record the run: ") + e.what(), 1);
  }
  return tell_prepared(rendezvous, node, "ok", 0);
}

// A node other than 0: node 0's resolved run (its config as recorded, with the --set every node was
// given; this node's --runs-dir only places its log) and the checkpoint to resume from. Returns the
// exit code on failure, after telling node 0.
int receive_resume_plan(const TrainArgs& args, const trainer::ClusterSpec& node, trainer::RunConfig& cfg,
                        std::string& resume_from, trainer::Rendezvous& rendezvous) {
  const std::string text = rendezvous.value_of("resume_plan", 0, kNodesTimeout);
  rendezvous.publish("resume_plan_read", node.node_rank, "");
  std::string why;
  std::string name, there_now;
  try {
    const auto plan = nlohmann::json::parse(text);
    if (plan.contains("error")) {
      std::cerr << "deltadeck: --resume " << args.resume << ": node 0 " << plan["error"].get<std::string>()
                << "; nothing was started\n";
      return 2;
    }
    name = plan.at("name").get<std::string>();
    resume_from = plan.at("from").get<std::string>();
    there_now = plan.at("now").get<std::string>();
    trainer::ConfigResult parsed =
        trainer::parse_config(plan.at("config").get<std::string>(), "node 0's config of run '" + name + "'", {});
    if (!parsed.ok()) {
      why = "cannot read node 0's config of run '" + name + "': " + parsed.errors.front();
    } else {
      cfg = parsed.config;
      cfg.name = name;
      cfg.run.runs_dir = args.runs_dir.empty() ? "runs" : args.runs_dir;
      const auto unresolved = trainer::resolve_config(cfg);
      if (!unresolved.empty())
        why = "cannot resolve the config of run '" + name + "' here: " + unresolved.front();
      else if (!storage::files::is_dir(there_now))
        why = "cannot read the checkpoint node 0 resumes from, " + there_now +
              ": every node must see it at that path (set run.checkpoint_dir to a folder the nodes share)";
    }
  } catch (const nlohmann::json::exception& e) {
    why = std::string("cannot read node 0's resume plan: ") + e.what();
  }
  if (const std::string problem = nodes_not_ok(rendezvous, node, "resume_ready", why.empty() ? "ok" : why);
      !problem.empty()) {
    std::cerr << "deltadeck: --resume " << args.resume << ": " << problem << "; nothing was started\n";
    return 2;
  }
  return 0;
}

// The exit code of a run that ended: 0 finished, stopped or preempted; 1 failed; 3 diverged
// (train.max_nonfinite_steps skipped steps in a row). README "Exit codes" lists them all.
int exit_code(trainer::RunStatus s) {
  switch (s) {
    case trainer::RunStatus::Failed: return 1;
    case trainer::RunStatus::Diverged: return 3;
    default: return 0;
  }
}

}  // namespace

// Nodes other than 0 of a multi-node run: the same validation and engine, no database. Only node 0
// prints (a batch job's output file would interleave every node otherwise): these lines go to
// <runs_dir>/<run name>.node<K>.log next to node 0's database, named after the run as node 0
// recorded it (it sends the name at the rendezvous; a new run's name may have been taken, and two
// runs of one config must not share a log). A failure is also said on stderr.
int run_worker_node(const TrainArgs& args, const trainer::ClusterSpec& cluster) {
  trainer::RunConfig cfg;
  std::string resume_from;
  std::shared_ptr<trainer::Rendezvous> rendezvous;
  try {
    if (int rc = meet_nodes(args, cluster, rendezvous); rc != 0) return rc;
    if (args.resume.empty()) {
      if (int rc = load_new_config_on_every_node(args, cluster, *rendezvous, cfg); rc != 0) return rc;
    } else {
      // The run and checkpoint node 0 resolved (a moved-aside save under the name node 0 gives it
      // back before the nodes start).
      if (int rc = receive_resume_plan(args, cluster, cfg, resume_from, *rendezvous); rc != 0) return rc;
    }
    // Node 0 records (or reopens) the run only now, and may still fail to.
    if (int rc = wait_for_node0(args, cluster, *rendezvous); rc != 0) return rc;
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  storage::files::make_dirs(cfg.run.runs_dir);
  NodeLog log(cfg.run.runs_dir, cluster.node_rank);
  auto say = [&](const std::string& line) { log.write(line); };
  say("deltadeck " + std::string(VERSION) + " (" + REVISION + "): node " + std::to_string(cluster.node_rank) + " of " +
      std::to_string(cluster.nnodes) + " (" + cluster.source + "), rendezvous " + cluster.master_addr + ":" +
      std::to_string(cluster.master_port) + "; node 0 records the run");
  trainer::SessionOptions so;
  so.run_dir = trainer::run_folder(cfg, cfg.name);
  so.resume_from = resume_from;
  so.run_name = cfg.name;
  so.cluster = cluster;
  so.rendezvous = rendezvous;
  trainer::Session session(cfg, so);
  install_stop_signals();
  session.start();
  trainer::EndedEvent ended{trainer::RunStatus::Failed, 0, "the engine ended without a final event"};
  bool stop_sent = false;
  while (true) {
    // A signal to this node alone (a launcher stopping one node) reaches node 0 through the engine.
    if (!stop_sent && stop_signals_received() > 0) {
      say("stop requested: node 0 will stop every rank at the next step boundary");
      session.send(stop_command());
      stop_sent = true;
    }
    auto ev = session.events().pop_for(std::chrono::milliseconds(100));
    if (!ev) {
      if (session.events().closed()) break;
      continue;
    }
    if (auto* n = std::get_if<trainer::RunNamedEvent>(&*ev)) log.open(n->name);
    if (auto* l = std::get_if<trainer::LogEvent>(&*ev)) say(l->level + ": " + l->text);
    if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) ended = *e;
  }
  session.join();
  log.open(cfg.name);  // the nodes never met: the config's name
  const std::string last = std::string("node ") + std::to_string(cluster.node_rank) + " " +
                           trainer::status_name(ended.status) + " at step " + std::to_string(ended.step) + ": " +
                           ended.message;
  say(last);
  if (ended.status == trainer::RunStatus::Failed || ended.status == trainer::RunStatus::Diverged)
    std::cerr << "deltadeck: " << last << " (log: " << log.path() << ")\n";
  return exit_code(ended.status);
}

// --dry-run: the same config (or resumed run) the train command would start, validated and
// resolved, then reported; nothing is created. Every node may run it.
int dry_run_train(const TrainArgs& args, const trainer::ClusterSpec& cluster) {
  DryRunInfo info;
  info.nnodes = cluster.nnodes;
  trainer::RunConfig cfg;
  try {
    if (args.resume.empty()) {
      if (int rc = load_new_config(args, cfg); rc != 0) return rc;
      info.where = args.config_path.empty() ? "the demo config" : args.config_path;
    } else {
      PreparedRun prep;
      storage::RunSummary run;
      if (int rc = resolve_resume(args, cluster.nnodes, prep, run); rc != 0) return rc;
      cfg = std::move(prep.cfg);
      cfg.name = run.name;
      info.where = prep.adopt ? "run '" + run.name + "' (from its record " + prep.adopt->imported_from +
                                    ", which a resume brings into " + prep.db_path + ")"
                              : "run '" + run.name + "' (id " + std::to_string(run.id) + ")";
      info.resume_from = prep.resume_from;
    }
    return dry_run(cfg, info);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
}

int run_train(const TrainArgs& args) {
  if (args.log_format != "auto" && args.log_format != "text" && args.log_format != "json") {
    std::cerr << "deltadeck: --log-format: must be auto, text or json (got \"" << args.log_format << "\")\n";
    return 2;
  }
  trainer::ClusterSpec cluster;
  try {
    cluster = trainer::resolve_cluster([](const char* k) { return std::getenv(k); }, args.cluster);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 2;
  }
  if (args.dry_run) return dry_run_train(args, cluster);
  if (cluster.node_rank > 0) return run_worker_node(args, cluster);
  PreparedRun prep;
  std::shared_ptr<trainer::Rendezvous> rendezvous;  // the nodes' store, met here with several nodes
  try {
    int rc = 0;
    if (cluster.nnodes > 1) {
      rc = meet_nodes(args, cluster, rendezvous);
      if (rc == 0)
        rc = args.resume.empty() ? prepare_new_run_across_nodes(args, cluster, prep, *rendezvous)
                                 : prepare_resume_across_nodes(args, cluster, prep, *rendezvous);
    } else {
      rc = args.resume.empty() ? prepare_new_run(args, 1, prep) : prepare_resume(args, 1, prep);
    }
    if (rc != 0) return rc;
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  const bool dashboard = args.log_format == "auto" && ui::tui::Terminal::usable();
  const LogFormat format = args.log_format == "json" ? LogFormat::Json : LogFormat::Text;
  RunHostOptions opts;
  opts.cluster = cluster;
  opts.rendezvous = rendezvous;
  // Kept with the dashboard too (a bounded queue): should the terminal refuse it, the plain log
  // that takes over prints every record from the start.
  opts.keep_records = true;
  // The engine sees the first SIGINT/SIGTERM/SIGHUP at its next step boundary (the front end's 100 ms poll
  // also sends the command, for the view's status).
  opts.poll_stop = []() -> std::optional<trainer::Command> {
    if (stop_signals_received() == 0) return std::nullopt;
    return stop_command();
  };
  RunHost host(std::move(prep), opts);
  const std::string name = host.run().store->run(host.run().run_id)->name;

  // The header stays on the normal screen (and in the scrollback) under the dashboard too.
  print_run_header(host, format, std::string("deltadeck ") + VERSION + " (" + REVISION + ")");
  if (cluster.nnodes > 1 && format == LogFormat::Text)
    std::cout << "node 0 of " << cluster.nnodes << " (" << cluster.source << "), "
              << (cluster.agent_store ? "joining torchrun's rendezvous store at " : "serving the rendezvous at ")
              << cluster.master_addr << ":" << cluster.master_port << "\n" << std::flush;
  install_stop_signals();
  host.start();
  trainer::EndedEvent ended;
  if (!dashboard || !run_dashboard(host, ended)) ended = run_plain_log(host, format);
  for (const std::string& w : host.warnings()) std::cerr << "warning: " << w << "\n";
  if (format == LogFormat::Text)
    std::cout << "run '" << name << "' " << trainer::status_name(ended.status) << " at step " << ended.step << ": "
              << ended.message << "\n";
  return exit_code(ended.status);
}

}  // namespace app

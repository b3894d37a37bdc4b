// `deltadeck train`. The main thread forwards the worker's events: metrics to the storage writer
// thread (never waited on by the worker), checkpoints and log events straight to the run store,
// and one plain line per logged step to stdout.
#include "app/train_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <variant>

#include "app/build_info.h"
#include "app/signals.h"
#include "storage/file_util.h"
#include "storage/metrics_writer.h"
#include "storage/run_store.h"
#include "trainer/config.h"
#include "trainer/session.h"
#include "ui/log/log_line.h"

namespace app {

namespace {

void print_errors(const std::string& where, const std::vector<std::string>& errors) {
  std::cerr << "deltadeck: " << where << " has " << errors.size() << (errors.size() == 1 ? " problem" : " problems")
            << "; nothing was started:\n";
  for (const auto& e : errors) std::cerr << "  " << e << "\n";
}

// The resolved config as the `| key | value |` table printed when a run starts.
void print_config_table(const std::string& toml_text) {
  std::cout << "| key | value |\n|---|---|\n";
  std::string section;
  size_t pos = 0;
  while (pos < toml_text.size()) {
    size_t nl = toml_text.find('\n', pos);
    std::string line = toml_text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? toml_text.size() : nl + 1;
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1) + ".";
      continue;
    }
    const auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    std::cout << "| " << section << line.substr(0, eq) << " | " << line.substr(eq + 3) << " |\n";
  }
  std::cout << std::flush;
}

}  // namespace

int run_train(const TrainArgs& args) {
  trainer::ConfigResult parsed =
      args.config_path.empty()
          ? trainer::parse_config(DEMO_CONFIG_TOML, "<embedded demo config>", args.overrides)
          : trainer::load_config(args.config_path, args.overrides);
  const std::string where = args.config_path.empty() ? "the demo config" : args.config_path;
  if (!parsed.ok()) {
    print_errors(where, parsed.errors);
    return 2;
  }
  trainer::RunConfig cfg = parsed.config;
  if (!args.runs_dir.empty()) cfg.run.runs_dir = args.runs_dir;
  auto unresolved = trainer::resolve_config(cfg);
  if (!unresolved.empty()) {
    print_errors(where, unresolved);
    return 2;
  }

  const std::string db_path = cfg.run.runs_dir + "/deltadeck.db";
  std::unique_ptr<storage::RunStore> store;
  try {
    store = storage::RunStore::open(db_path);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  storage::NewRun nr;
  nr.name = cfg.name;
  nr.model = std::string(model::family_name(cfg.model.family)) + "/" + cfg.model.preset;
  nr.config_toml = trainer::to_toml(cfg);
  nr.config_json = trainer::to_json(cfg);
  nr.params = model::count_params(cfg.model);
  nr.world_size = 1;
  nr.revision = REVISION;
  const int64_t run_id = store->create_run(nr);
  const storage::RunSummary rec = *store->run(run_id);
  const std::string run_dir = cfg.run.runs_dir + "/" + rec.name;
  storage::files::make_dirs(run_dir);

  std::cout << "deltadeck " << VERSION << " (" << REVISION << "): run '" << rec.name << "' (id " << run_id << "), "
            << nr.model << ", " << ui::format_count(static_cast<double>(nr.params)) << " parameters\n"
            << "database " << db_path << ", checkpoints " << run_dir << "/checkpoints\n";
  print_config_table(nr.config_toml);

  storage::MetricsWriter writer(db_path);
  trainer::Session session(cfg, trainer::SessionOptions{run_dir, ""});
  install_stop_signals();
  session.start();

  int signals_seen = 0;
  trainer::EndedEvent ended{trainer::RunStatus::Failed, 0, "the engine ended without a final event"};
  bool got_end = false;
  while (true) {
    if (stop_signals_received() > signals_seen) {
      signals_seen = stop_signals_received();
      if (signals_seen == 1) {
        std::cout << "stop requested: saving a checkpoint and stopping at the next step boundary\n" << std::flush;
        session.send(trainer::Command::Stop);
      }
    }
    auto ev = session.events().pop_for(std::chrono::milliseconds(100));
    if (!ev) {
      if (session.events().closed()) break;
      continue;
    }
    if (auto* m = std::get_if<trainer::MetricsEvent>(&*ev)) {
      std::vector<storage::MetricRow> rows;
      for (const auto& [k, v] : m->values) rows.push_back({run_id, {m->step, m->tokens, m->wall_s, k, v}});
      writer.push(rows);
      std::cout << ui::format_metrics_line(*m, cfg.train.steps) << "\n" << std::flush;
    } else if (auto* c = std::get_if<trainer::CheckpointEvent>(&*ev)) {
      store->add_checkpoint({run_id, c->step, c->path, c->bytes, c->sha256, ""});
      // Checkpoints pruned by the worker disappear from disk; drop their records too.
      for (const auto& rec_c : store->checkpoints(run_id))
        if (!storage::files::exists(rec_c.path)) store->remove_checkpoint(run_id, rec_c.step);
      store->add_event({run_id, c->step, "info", "checkpoint saved: " + c->path, ""});
      std::cout << "checkpoint step " << c->step << " | " << c->path << " | "
                << ui::format_count(static_cast<double>(c->bytes)) << "B\n" << std::flush;
    } else if (auto* l = std::get_if<trainer::LogEvent>(&*ev)) {
      store->add_event({run_id, l->step, l->level, l->text, ""});
      (l->level == "error" ? std::cerr : std::cout) << l->level << ": " << l->text << "\n" << std::flush;
    } else if (auto* s = std::get_if<trainer::StartedEvent>(&*ev)) {
      std::cout << "started on " << s->device << ": " << s->params << " parameters, vocab " << s->vocab_size << "\n"
                << std::flush;
    } else if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) {
      ended = *e;
      got_end = true;
    }
  }
  session.join();
  writer.flush();
  if (!got_end) ended.message = "the engine ended without a final event";
  const std::string status = trainer::status_name(ended.status);
  store->finish_run(run_id, status, ended.message);
  if (!writer.last_error().empty()) std::cerr << "warning: metrics writer: " << writer.last_error() << "\n";
  std::cout << "run '" << rec.name << "' " << status << " at step " << ended.step << ": " << ended.message << "\n";
  return ended.status == trainer::RunStatus::Failed ? 1 : 0;
}

}  // namespace app

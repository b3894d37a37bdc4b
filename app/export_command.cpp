#include "app/export_command.h"

#include <iostream>

#include "storage/file_util.h"
#include "storage/run_store.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/export.h"
#include "ui/log/log_line.h"

namespace app {

int run_export(const ExportArgs& args) {
  const std::string db_path = args.runs_dir + "/deltadeck.db";
  if (!storage::files::exists(db_path)) {
    std::cerr << "deltadeck: export: no run database at " << db_path << " (pass --runs-dir)\n";
    return 2;
  }
  auto store = storage::RunStore::open_for_display(db_path);  // migrates an older file it may write
  const storage::RunSummary run = store->find_run(args.run);
  // The run's folder as its recorded config places it (run.checkpoint_dir), else beside the database.
  std::string run_dir = args.runs_dir + "/" + run.name;
  const trainer::ConfigResult recorded = trainer::parse_config(store->run_config_toml(run.id), "run config", {});
  if (recorded.ok() && !recorded.config.run.checkpoint_dir.empty())
    run_dir = trainer::run_folder(recorded.config, run.name);
  const auto all = trainer::list_checkpoints(run_dir + "/checkpoints");
  if (all.empty()) {
    std::cerr << "deltadeck: export: run '" << run.name << "' has no complete checkpoint under " << run_dir
              << "/checkpoints\n";
    return 2;
  }
  std::string dir = all.back().second;
  if (args.step >= 0) {
    dir.clear();
    std::string steps;
    for (const auto& [step, path] : all) {
      if (step == args.step) dir = path;
      steps += (steps.empty() ? "" : ", ") + std::to_string(step);
    }
    if (dir.empty()) {
      std::cerr << "deltadeck: export: --step " << args.step << ": run '" << run.name
                << "' has checkpoints at steps " << steps << "\n";
      return 2;
    }
  }
  trainer::ExportResult r;
  try {
    r = trainer::export_checkpoint(dir, args.out, args.ema, args.force);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: export: " << e.what() << "\n";
    return 1;
  }
  std::cout << "exported run '" << run.name << "' step " << r.step << (r.ema ? " (EMA weights)" : "") << ": "
            << r.tensors << " tensors, " << ui::format_count(static_cast<double>(r.bytes)) << "B\n"
            << "  " << r.weights_path << "\n  " << r.config_path << "\n";
  if (!r.tokenizer_path.empty()) std::cout << "  " << r.tokenizer_path << "\n";
  if (!r.warning.empty()) std::cerr << "deltadeck: export: warning: " << r.warning << "\n";
  return 0;
}

}  // namespace app

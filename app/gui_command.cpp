#include "app/gui_command.h"

#include <cstdlib>

#include "trainer/cluster.h"

namespace app {

CLI::App* add_gui_command(CLI::App& cli, GuiArgs& args) {
  auto* cmd = cli.add_subcommand("gui", "Open the desktop app (also `deltadeck` with no arguments, given a display)");
  cmd->add_option("--runs-dir", args.options.runs_dir, "Folder of the run database and checkpoints")
      ->capture_default_str();
  cmd->add_option("-c,--config", args.options.config_path, "TOML config for the launcher (default: the demo config)")
      ->check(CLI::ExistingFile);
  cmd->add_option("-s,--set", args.options.overrides, "Override a key of that config: section.key=value (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--gui-test-script", args.test_script,
                  "Drive the app from a script of commands (app/gui_script.h), for tests under Xvfb")
      ->check(CLI::ExistingFile);
  cmd->add_option("--screenshot", args.screenshot, "Save a PNG of the window when the script ends (or at once), then quit");
  cmd->add_flag("--gui-bench", args.bench,
                "Benchmark: frame time with a 1M-point run in the dashboard, and the idle app's CPU use");
  cmd->add_option("--size", args.width, "Window width in screen units")->capture_default_str();
  return cmd;
}

bool gui_takes_train(const TrainArgs& train) {
  if (train.no_gui || !display_available()) return false;
  // A multi-node run (flags or a launcher's environment) trains headless: the app runs one node.
  try {
    const trainer::ClusterSpec c = trainer::resolve_cluster([](const char* k) { return std::getenv(k); }, train.cluster);
    return c.nnodes == 1;
  } catch (const std::exception&) {
    return false;  // the train command reports the malformed cluster spec
  }
}

int run_gui_train(const TrainArgs& train) {
  GuiArgs args;
  args.options.config_path = train.config_path;
  args.options.overrides = train.overrides;
  if (!train.runs_dir.empty()) args.options.runs_dir = train.runs_dir;
  args.options.resume = train.resume;
  args.options.start = train.resume.empty();
  return run_gui(args);
}

}  // namespace app

// deltadeck's entry point: the command line (CLI11). Only this file chooses the exit code.
#include <CLI/CLI.hpp>

#include <iostream>

#include "app/build_info.h"
#include "app/runs_command.h"
#include "app/train_command.h"

int main(int argc, char** argv) {
  CLI::App cli{"deltadeck: train decoder language models (Gated DeltaNet + MLA hybrid, GPT) and watch them train"};
  cli.require_subcommand(0, 1);
  cli.set_version_flag("--version", std::string("deltadeck ") + app::VERSION + " (" + app::REVISION + ")");

  app::TrainArgs train;
  auto* train_cmd = cli.add_subcommand("train", "Start a training run (headless in this build)");
  train_cmd->add_option("-c,--config", train.config_path, "TOML run config (default: the embedded demo config)")
      ->check(CLI::ExistingFile);
  train_cmd->add_option("-s,--set", train.overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  train_cmd->add_option("--runs-dir", train.runs_dir, "Folder of the run database and checkpoints (default: run.runs_dir, \"runs\")");
  train_cmd->add_flag("--no-gui", train.no_gui, "Run headless with plain log lines (the only mode of this build)");

  std::string runs_dir = "runs";
  auto* runs_cmd = cli.add_subcommand("runs", "List and inspect recorded runs");
  runs_cmd->require_subcommand(1);
  runs_cmd->add_option("--runs-dir", runs_dir, "Folder of the run database")->capture_default_str();
  auto* list_cmd = runs_cmd->add_subcommand("list", "List every run with its status and latest validation loss");
  list_cmd->fallthrough();
  std::string show_run;
  auto* show_cmd = runs_cmd->add_subcommand("show", "Show one run: status, metrics summary, checkpoints, events, config");
  show_cmd->fallthrough();
  show_cmd->add_option("run", show_run, "Run id, name or unique name prefix")->required();

  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*train_cmd) return app::run_train(train);
    if (*list_cmd) return app::runs_list(runs_dir);
    if (*show_cmd) return app::runs_show(runs_dir, show_run);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  std::cout << cli.help();
  std::cout << "\nThe desktop app arrives in a later version; start a headless run with:\n"
               "  deltadeck train --no-gui\n";
  return 0;
}

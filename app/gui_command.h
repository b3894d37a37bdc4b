// The command line's doors into the desktop app: the `gui` subcommand, `deltadeck train` with a
// display (the app opens on that config and starts it), and `deltadeck` with no arguments.
// main.cpp calls these; without DELTADECK_GUI they are not compiled and main says how to run headless.
#pragma once

#include <CLI/CLI.hpp>

#include "app/gui_app.h"
#include "app/train_command.h"

namespace app {

// Adds `deltadeck gui [--runs-dir D] [--config F] [--set k=v] [--gui-test-script S] [--screenshot P]
// [--gui-bench]` to cli, filling args.
CLI::App* add_gui_command(CLI::App& cli, GuiArgs& args);

// `deltadeck train` without --no-gui: true when the desktop app should take it (a display is
// available); then run_gui_train runs it and returns the exit code.
bool gui_takes_train(const TrainArgs& train);
int run_gui_train(const TrainArgs& train);

}  // namespace app

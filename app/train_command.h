// `deltadeck train`: config -> validation -> run record (new, or reopened by --resume) -> session ->
// events to the database and the terminal, until the run ends.
#pragma once

#include <string>
#include <vector>

#include "trainer/cluster.h"

namespace app {

struct TrainArgs {
  std::string config_path;            // empty: the embedded demo config
  std::vector<std::string> overrides; // --set section.key=value
  std::string runs_dir;               // --runs-dir; empty: run.runs_dir of the config ("runs" with --resume)
  std::string resume;                 // --resume RUN|latest: continue that run from its newest checkpoint
  bool no_gui = false;
  bool dry_run = false;               // --dry-run: validate and report the planned run, start nothing
  std::string log_format = "auto";    // --log-format auto | text | json (auto: the dashboard on a terminal)
  trainer::ClusterOverrides cluster;  // --nnodes --node-rank --master-addr --master-port
};

// Returns the process exit code: 0 finished or stopped, 1 failed, 2 invalid config or arguments.
int run_train(const TrainArgs& args);

}  // namespace app

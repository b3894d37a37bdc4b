#include "app/node_log.h"

#include <iostream>
#include <utility>

namespace app {

NodeLog::NodeLog(std::string runs_dir, int node_rank) : runs_dir_(std::move(runs_dir)), node_rank_(node_rank) {}

void NodeLog::write(const std::string& line) {
  if (to_stderr_) std::cerr << line << "\n";
  else if (file_.is_open()) file_ << line << "\n" << std::flush;
  else held_.push_back(line);
}

void NodeLog::open(const std::string& run_name) {
  if (!path_.empty()) return;
  path_ = runs_dir_ + "/" + run_name + ".node" + std::to_string(node_rank_) + ".log";
  file_.open(path_, std::ios::app);
  if (!file_) {
    std::cerr << "deltadeck: node " << node_rank_ << ": cannot write its log " << path_ << "; its lines follow here\n";
    path_ = "stderr";
    to_stderr_ = true;
  }
  for (const std::string& line : held_) write(line);
  held_.clear();
}

}  // namespace app

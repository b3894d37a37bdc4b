// The log of a node other than 0 of a multi-node run: <runs_dir>/<run name>.node<K>.log. The run's
// name is known only once node 0 sends it at the rendezvous, so lines said before are held until
// then. Where the file cannot be written, the lines go to stderr instead (the training goes on).
#pragma once

#include <fstream>
#include <string>
#include <vector>

namespace app {

class NodeLog {
 public:
  NodeLog(std::string runs_dir, int node_rank);
  // Appends a line: to the file once open, else held.
  void write(const std::string& line);
  // Opens <runs_dir>/<run_name>.node<K>.log and writes the held lines to it; later calls do nothing.
  void open(const std::string& run_name);
  // The file's path once open ("stderr" if it could not be written; "" before).
  const std::string& path() const { return path_; }

 private:
  std::string runs_dir_;
  int node_rank_;
  std::string path_;
  std::ofstream file_;
  bool to_stderr_ = false;
  std::vector<std::string> held_;
};

}  // namespace app

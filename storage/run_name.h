// The rule for run names, shared by the config validation (trainer/config.cpp, which links no
// SQLite) and the run store's rename. A run's name is the name of its folder under runs_dir.
#pragma once

#include <string>

namespace storage {

// Why `name` cannot name a run ("" when it can): it must be exactly one path component, or the
// run's checkpoints would land outside runs_dir ("../x") or in runs_dir itself (".."), and short
// enough for a folder name once the store adds "-N" to make it unique.
inline std::string run_name_problem(const std::string& name) {
  if (name.empty()) return "must not be empty";
  if (name == "." || name == "..") return "must not be '.' or '..'";
  if (name.find('/') != std::string::npos) return "must not contain '/'";
  if (name.find('\0') != std::string::npos) return "must not contain a NUL character";
  if (name.size() > 200) return "must be at most 200 characters";
  return "";
}

}  // namespace storage

// A unique temporary directory, removed with everything in it when the object goes away.
#pragma once

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "storage/file_util.h"

namespace testing_support {

class TempDir {
 public:
  TempDir() {
    path_ = storage::files::make_temp_dir("deltadeck-test-");
  }
  ~TempDir() {
    storage::files::remove_tree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Writes text to a file under the directory and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = file(name);
    storage::files::make_dirs(storage::files::parent_dir(p));
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::string path_;
};

}  // namespace testing_support

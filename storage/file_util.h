// Small POSIX file helpers. Code that links LibTorch must not call std::filesystem: the PyTorch
// wheel's libtorch.so exports its own copy of those symbols, the dynamic linker binds our calls to
// it, and some of them crash (remove_all jumps through a null pointer). These helpers use only
// the C library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace storage::files {

bool exists(const std::string& path);
bool is_dir(const std::string& path);
// Size in bytes; -1 when the file cannot be stat'ed.
int64_t file_size(const std::string& path);
// mkdir -p. Throws std::runtime_error naming the directory and errno text.
void make_dirs(const std::string& path);
// rm -rf (does not follow symlinks). Missing paths are fine. Returns false if something could
// not be removed.
bool remove_tree(const std::string& path);
// Names in a directory (no "." / ".."), unsorted; empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& path);
// "a/b/c" -> "a/b"; "c" -> "".
std::string parent_dir(const std::string& path);
// The path from the filesystem's root: relative ones joined to the working directory, "." and
// empty segments dropped ("runs/./x" -> "/cwd/runs/x"). ".." is kept, as a symlinked folder's ".."
// is not its textual parent. Unchanged when the working directory cannot be read.
std::string absolute_path(const std::string& path);
// fsync of a file or directory. Throws std::runtime_error naming the path.
void fsync_path(const std::string& path);
// A new, unique directory under $TMPDIR (or /tmp) whose name starts with prefix.
std::string make_temp_dir(const std::string& prefix);

}  // namespace storage::files

#include "storage/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace storage::files {

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

void make_dirs(const std::string& path) {
  if (path.empty() || is_dir(path)) return;
  const std::string parent = parent_dir(path);
  if (!parent.empty() && parent != path) make_dirs(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw std::runtime_error(path + ": cannot create directory (" + std::strerror(errno) + ")");
}

namespace {
int remove_entry(const char* p, const struct stat*, int, struct FTW*) { return ::remove(p) == 0 ? 0 : -1; }
}  // namespace

bool remove_tree(const std::string& path) {
  if (!exists(path)) return true;
  // Depth first, without following symlinks.
  return ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  return out;
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string absolute_path(const std::string& path) {
  std::string joined = path;
  if (path.empty() || path[0] != '/') {
    std::vector<char> buf(4096);
    while (::getcwd(buf.data(), buf.size()) == nullptr) {
      if (errno != ERANGE || buf.size() > (1u << 20)) return path;
      buf.resize(buf.size() * 2);
    }
    joined = std::string(buf.data()) + "/" + path;
  }
  std::string out;
  size_t i = 0;
  while (i < joined.size()) {
    size_t j = joined.find('/', i);
    if (j == std::string::npos) j = joined.size();
    const std::string seg = joined.substr(i, j - i);
    if (!seg.empty() && seg != ".") out += "/" + seg;
    i = j + 1;
  }
  return out.empty() ? "/" : out;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open for fsync (" + std::strerror(errno) + ")");
  if (::fsync(fd) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error(path + ": fsync failed (" + e + ")");
  }
  ::close(fd);
}

std::string make_temp_dir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error(tmpl + ": mkdtemp failed (" + std::strerror(errno) + ")");
  return tmpl;
}

}  // namespace storage::files

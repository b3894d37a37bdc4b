// FileIo's POSIX operations and the DELTADECK_IO_FAULT double (the spec is in file_io.h). Errors
// name the path, the byte offset for writes, and strerror's text, so a full disk reads as
// "<path>: write failed at byte offset 1048576: No space left on device".
#include "storage/file_io.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

namespace storage {

namespace {

std::string reason(int err) { return std::strerror(err); }

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string parent_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : p.substr(0, slash);
}

int remove_entry(const char* p, const struct stat*, int, struct FTW*) { return ::remove(p) == 0 ? 0 : -1; }

}  // namespace

const char* io_op_name(IoOp op) {
  switch (op) {
    case IoOp::MakeDir: return "mkdir";
    case IoOp::Create: return "create";
    case IoOp::Write: return "write";
    case IoOp::Fsync: return "fsync";
    case IoOp::Rename: return "rename";
    case IoOp::FsyncDir: return "fsync-dir";
    case IoOp::Remove: return "remove";
  }
  return "?";
}

FileIo::Verdict FileIo::before(IoOp, const std::string&, uint64_t, uint64_t) { return {}; }

void FileIo::after(IoOp, const std::string&) {}

void FileIo::make_dirs(const std::string& path) {
  if (path.empty() || is_dir(path)) return;
  const std::string parent = parent_of(path);
  if (!parent.empty() && parent != path) make_dirs(parent);
  const Verdict v = before(IoOp::MakeDir, path, 0, 0);
  if (v.error) throw IoError(path + ": cannot create directory (" + reason(v.error) + ")", v.error);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    const int e = errno;
    throw IoError(path + ": cannot create directory (" + reason(e) + ")", e);
  }
  after(IoOp::MakeDir, path);
}

int FileIo::create(const std::string& path) {
  const Verdict v = before(IoOp::Create, path, 0, 0);
  if (v.error) throw IoError(path + ": cannot create (" + reason(v.error) + ")", v.error);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    throw IoError(path + ": cannot create (" + reason(e) + ")", e);
  }
  after(IoOp::Create, path);
  return fd;
}

void FileIo::write(int fd, const std::string& path, const void* data, size_t n, uint64_t offset) {
  const Verdict v = before(IoOp::Write, path, offset, n);
  size_t todo = v.error ? static_cast<size_t>(std::min<uint64_t>(n, v.allow)) : n;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t at = offset;
  while (todo > 0) {
    // Linux caps one write() at ~2 GiB, and a signal may cut one short; loop either way.
    const ssize_t w = ::write(fd, p, todo);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      throw IoError(path + ": write failed at byte offset " + std::to_string(at) + " (" + reason(e) + ")", e);
    }
    p += w;
    at += static_cast<uint64_t>(w);
    todo -= static_cast<size_t>(w);
  }
  if (v.error) {
    throw IoError(path + ": write failed at byte offset " + std::to_string(at) + " (" + reason(v.error) + ")",
                  v.error);
  }
  after(IoOp::Write, path);
}

void FileIo::fsync(int fd, const std::string& path) {
  const Verdict v = before(IoOp::Fsync, path, 0, 0);
  if (v.error) throw IoError(path + ": fsync failed (" + reason(v.error) + ")", v.error);
  if (::fsync(fd) != 0) {
    const int e = errno;
    throw IoError(path + ": fsync failed (" + reason(e) + ")", e);
  }
  after(IoOp::Fsync, path);
}

void FileIo::close(int fd, const std::string& path) {
  if (::close(fd) != 0 && errno != EINTR) {
    const int e = errno;
    throw IoError(path + ": close failed (" + reason(e) + ")", e);
  }
}

void FileIo::rename(const std::string& from, const std::string& to) {
  const Verdict v = before(IoOp::Rename, to, 0, 0);
  if (v.error) throw IoError(from + ": cannot rename to " + to + " (" + reason(v.error) + ")", v.error);
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int e = errno;
    throw IoError(from + ": cannot rename to " + to + " (" + reason(e) + ")", e);
  }
  after(IoOp::Rename, to);
}

void FileIo::fsync_dir(const std::string& dir) {
  const Verdict v = before(IoOp::FsyncDir, dir, 0, 0);
  if (v.error) throw IoError(dir + ": directory fsync failed (" + reason(v.error) + ")", v.error);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw IoError(dir + ": cannot open directory to fsync (" + reason(e) + ")", e);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    throw IoError(dir + ": directory fsync failed (" + reason(e) + ")", e);
  }
  ::close(fd);
  after(IoOp::FsyncDir, dir);
}

void FileIo::remove_tree(const std::string& path) {
  if (!exists(path)) return;
  const Verdict v = before(IoOp::Remove, path, 0, 0);
  if (v.error) throw IoError(path + ": cannot remove (" + reason(v.error) + ")", v.error);
  // Depth first, without following symlinks.
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    const int e = errno;
    throw IoError(path + ": cannot remove (" + reason(e) + ")", e);
  }
  after(IoOp::Remove, path);
}

FileIo& posix_io() {
  static FileIo io;
  return io;
}

void write_text_file(FileIo& io, const std::string& path, const std::string& text) {
  const int fd = io.create(path);
  try {
    io.write(fd, path, text.data(), text.size(), 0);
    io.fsync(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  io.close(fd, path);
}

namespace {

// The DELTADECK_IO_FAULT double. Counters run over the whole process until the spec changes.
class EnvFaultIo : public FileIo {
 public:
  void configure(const std::string& spec) {
    *this = EnvFaultIo();
    if (spec == "trace") {
      trace_ = true;
      return;
    }
    const auto at = spec.find('@');
    if (at == std::string::npos)
      throw std::invalid_argument("DELTADECK_IO_FAULT: expected action@op=K or action@byte=B, got \"" + spec + "\"");
    action_ = spec.substr(0, at);
    if (action_ != "kill" && action_ != "sigterm" && action_ != "sigint" && action_ != "enospc")
      throw std::invalid_argument("DELTADECK_IO_FAULT: unknown action \"" + action_ +
                                  "\" (kill, sigterm, sigint, enospc)");
    std::stringstream rest(spec.substr(at + 1));
    for (std::string kv; std::getline(rest, kv, ',');) {
      if (kv.rfind("op=", 0) == 0) {
        at_op_ = std::stoll(kv.substr(3));
      } else if (kv.rfind("byte=", 0) == 0) {
        at_byte_ = std::stoll(kv.substr(5));
      } else if (kv == "persist") {
        persist_ = true;
      } else {
        throw std::invalid_argument("DELTADECK_IO_FAULT: unknown field \"" + kv + "\" (op=, byte=, persist)");
      }
    }
    if ((at_op_ < 1) == (at_byte_ < 0))
      throw std::invalid_argument("DELTADECK_IO_FAULT: \"" + spec + "\" needs exactly one of op=K (K >= 1) or byte=B");
    if (at_byte_ >= 0 && action_ != "enospc")
      throw std::invalid_argument("DELTADECK_IO_FAULT: byte= goes with enospc only");
  }

 protected:
  Verdict before(IoOp op, const std::string& path, uint64_t offset, uint64_t bytes) override {
    const int64_t k = ++ops_;
    if (trace_) {
      std::fprintf(stderr, "io op %lld: %s %s", static_cast<long long>(k), io_op_name(op), path.c_str());
      if (op == IoOp::Write) std::fprintf(stderr, " %llu bytes at %llu", static_cast<unsigned long long>(bytes),
                                          static_cast<unsigned long long>(offset));
      std::fprintf(stderr, "\n");
    }
    Verdict v;
    const bool allocates = op == IoOp::Create || op == IoOp::MakeDir || op == IoOp::Write;
    if (action_ == "enospc" && allocates) {
      if (fired_ && persist_) {
        v.error = ENOSPC;
        v.allow = 0;
      } else if (!fired_ && at_op_ >= 1 && k >= at_op_) {
        fired_ = true;
        v.error = ENOSPC;
        v.allow = bytes / 2;
      } else if (!fired_ && at_byte_ >= 0 && op == IoOp::Write && written_ + bytes > static_cast<uint64_t>(at_byte_)) {
        fired_ = true;
        v.error = ENOSPC;
        v.allow = static_cast<uint64_t>(at_byte_) - written_;
      }
    }
    if (op == IoOp::Write) written_ += v.error ? std::min<uint64_t>(bytes, v.allow) : bytes;
    return v;
  }

  void after(IoOp, const std::string&) override {
    if (ops_ != at_op_) return;
    // Stderr first, so the test log says where the process died.
    if (action_ == "kill") {
      std::fprintf(stderr, "DELTADECK_IO_FAULT: SIGKILL after io op %lld\n", static_cast<long long>(ops_));
      ::kill(::getpid(), SIGKILL);
    } else if (action_ == "sigterm" || action_ == "sigint") {
      std::fprintf(stderr, "DELTADECK_IO_FAULT: %s after io op %lld\n", action_.c_str(), static_cast<long long>(ops_));
      ::raise(action_ == "sigterm" ? SIGTERM : SIGINT);
    }
  }

 private:
  std::string action_;
  int64_t at_op_ = -1, at_byte_ = -1;
  bool persist_ = false, trace_ = false, fired_ = false;
  int64_t ops_ = 0;
  uint64_t written_ = 0;
};

}  // namespace

FileIo& checkpoint_io() {
  static std::mutex mu;
  static std::string seen;
  static EnvFaultIo fault;
  const char* env = std::getenv("DELTADECK_IO_FAULT");
  const std::string now = env ? env : "";
  std::lock_guard<std::mutex> lk(mu);
  if (now != seen) {
    if (!now.empty()) fault.configure(now);
    seen = now;
  }
  if (now.empty()) return posix_io();
  return fault;
}

}  // namespace storage

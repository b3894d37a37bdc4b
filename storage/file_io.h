// FileIo: the file-system operations of a checkpoint save behind one small interface, so tests can
// watch their order (data fsynced before the manifest, the manifest renamed, the directory fsynced,
// and only then older checkpoints deleted), fail one of them (ENOSPC at any byte) or end the
// process right after one (the crash sweep). The POSIX path is the base class itself: one virtual
// call per operation, a few dozen per save, nothing per byte.
//
// Outside tests the checkpoint writer uses checkpoint_io(), which is plain POSIX unless the
// environment variable DELTADECK_IO_FAULT arms a fault (in the style of DELTADECK_FAULT):
//
//   DELTADECK_IO_FAULT="<action>@op=K[,persist]" | "<action>@byte=B[,persist]" | "trace"
//     kill      the process gets SIGKILL right after the K-th observed operation completes
//     sigterm   SIGTERM (sigint: SIGINT) is raised after the K-th operation; the save goes on
//     enospc    the first space-allocating operation (create, mkdir, write) at or after op K, or the
//               write that crosses byte B of all bytes written, fails with ENOSPC (a write first
//               writes the bytes before B, as a filling disk does); once, or on every later
//               allocating operation with `persist` (the disk stays full)
//     trace     every operation is printed to stderr as "io op K: <op> <path> [<bytes> bytes]"
//   Operations are counted from 1 over the whole process (every save), in the order they happen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace storage {

// The observed operations. close() is not one: it makes nothing durable (fsync does).
enum class IoOp { MakeDir, Create, Write, Fsync, Rename, FsyncDir, Remove };
const char* io_op_name(IoOp op);

// A failed operation: the text names the path and the C library's reason; err() is the errno.
class IoError : public std::runtime_error {
 public:
  IoError(const std::string& what, int err) : std::runtime_error(what), err_(err) {}
  int err() const { return err_; }

 private:
  int err_;
};

class FileIo {
 public:
  virtual ~FileIo() = default;

  // mkdir -p: one MakeDir per directory created. Throws IoError naming the directory.
  void make_dirs(const std::string& path);
  // Creates (or truncates) a file for writing; returns its descriptor. Throws IoError.
  int create(const std::string& path);
  // Writes all n bytes at the file's current position (`offset` is that position, for the
  // observer). Throws IoError naming the path and the offset where it failed.
  void write(int fd, const std::string& path, const void* data, size_t n, uint64_t offset);
  void fsync(int fd, const std::string& path);
  // Closes the descriptor; a deferred write error (NFS) throws IoError. Not observed.
  void close(int fd, const std::string& path);
  // rename(2): atomic replacement of `to` when it is a file or an empty directory.
  void rename(const std::string& from, const std::string& to);
  // fsync of a directory: makes the creations, renames and deletions inside it durable.
  void fsync_dir(const std::string& dir);
  // rm -rf without following symlinks; a missing path is fine and not observed. Throws IoError
  // naming what could not be removed.
  void remove_tree(const std::string& path);

 protected:
  // What the observer decides for one operation: error != 0 fails it with that errno; a write
  // first writes `allow` of its bytes (the rest fails), as a disk filling mid-write does.
  struct Verdict {
    int error = 0;
    uint64_t allow = UINT64_MAX;
  };
  // Called before every observed operation (bytes: a write's length, else 0). Default: proceed.
  virtual Verdict before(IoOp op, const std::string& path, uint64_t offset, uint64_t bytes);
  // Called after every observed operation that succeeded. Default: nothing.
  virtual void after(IoOp op, const std::string& path);
};

// Plain POSIX, never observed. Any thread.
FileIo& posix_io();

// A small file through io: created, written (text: any bytes), fsynced, closed. Throws IoError.
void write_text_file(FileIo& io, const std::string& path, const std::string& text);

// The checkpoint writer's I/O for this process: posix_io(), or the fault armed by
// DELTADECK_IO_FAULT (see the top of this file; the variable is read again at every call, so a test
// may arm it between saves). Throws std::invalid_argument on a malformed spec. Any thread; saves
// are not expected to run concurrently while a fault is armed.
FileIo& checkpoint_io();

}  // namespace storage

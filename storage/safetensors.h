// The safetensors checkpoint format: an 8-byte little-endian header length N, N bytes of JSON
// (name -> {dtype, shape, data_offsets}, plus an optional "__metadata__" string map), then the data
// buffer. Offsets are relative to the buffer, tensors are contiguous in the order written and the
// header is space-padded so the buffer starts 8-byte aligned. The reader rejects anything that
// does not tile the buffer exactly (gaps included): a checkpoint with a hole is a truncated or
// spliced file, and silently loading it would resume training from garbage.
// No torch here: the trainer hands raw pointers, so storage/ and the UI stay torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace storage {

struct TensorView {
  std::string name;
  std::string dtype;           // safetensors spelling: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;  // [] for a scalar
  const void* data;            // nbytes bytes, row-major; may be null when nbytes == 0
  size_t nbytes;               // must equal numel(shape) * dtype_size(dtype)
};

// Writes tensors (in the given order) and metadata to path, replacing any file there, and fsyncs
// the file before returning. The containing directory is not fsynced (see fsync_dir).
// Any thread. Throws std::runtime_error naming the path (and errno text, or the bad tensor) on
// failure; a partly written file is removed. Returns the number of bytes written.
int64_t write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                          const std::map<std::string, std::string>& metadata);

class FileIo;
// The same through `io` (the checkpoint writer's observable I/O, storage/file_io.h): the bytes go
// out in writes of at most 4 MiB, small pieces gathered, and *sha256 (when given) receives the file's
// digest, computed while writing so the file is not read back. On failure the partial file is
// removed (best effort) and the IoError naming the path and byte offset is rethrown.
int64_t write_safetensors(FileIo& io, const std::string& path, const std::vector<TensorView>& tensors,
                          const std::map<std::string, std::string>& metadata, std::string* sha256);

// Makes a rename or create inside dir durable. Any thread. Throws std::runtime_error naming dir.
void fsync_dir(const std::string& dir);

struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  size_t offset;  // from the file start
  size_t nbytes;
};

class SafetensorsFile {  // reads the whole file into memory
 public:
  // Reads and validates path: header length within the file, JSON parses, known dtypes, every
  // entry's offsets in range, non-overlapping and covering the data buffer exactly, nbytes ==
  // numel * dtype size. Any thread. Throws std::runtime_error "<path>: <what> (at byte offset X)".
  static SafetensorsFile read(const std::string& path);
  // The same checks on a file's bytes already in memory (the checkpoint loader reads each file once
  // to check its checksum, then parses it here). path is used in messages only.
  static SafetensorsFile parse(const std::string& path, std::vector<uint8_t> bytes);

  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // The tensor's bytes, valid while this object lives. Throws std::runtime_error naming the
  // tensor and the path if absent.
  const uint8_t* data(const std::string& name) const;
  // Tensor names by data offset (the order they were written).
  std::vector<std::string> names_in_file_order() const;

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;  // the whole file
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::string> order_;  // names by offset
};

// Bytes per element of a safetensors dtype ("F32" -> 4). Throws std::runtime_error on unknown.
size_t dtype_size(const std::string& dtype);

}  // namespace storage

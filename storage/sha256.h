// SHA-256 (FIPS 180-4), written here so checkpoint hashing needs no crypto library. Incremental:
// the trainer hashes a checkpoint file block by block while the storage layer records the digest.
// Hashes identify checkpoint files, not secrets, so no constant-time care is taken.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace storage {

class Sha256 {
 public:
  Sha256();
  // Feeds n bytes. Any thread, one object per thread; never fails.
  void update(const void* data, size_t n);
  // Finishes and returns 64 lowercase hex characters. The object is spent afterwards: calling
  // update() or hex_digest() again is a bug and aborts with file:line.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);  // block: 64 bytes

  uint32_t state_[8];
  uint8_t buf_[64];       // partial block
  size_t buf_len_ = 0;    // bytes in buf_, < 64
  uint64_t total_len_ = 0;  // bytes fed so far
  bool finished_ = false;
};

// One-shot digest of a buffer. Any thread; never fails.
std::string sha256_hex(const void* data, size_t n);
// Digest of a whole file, read in 1 MiB blocks. Any thread; throws std::runtime_error naming the
// path (and the errno text) if the file cannot be opened or read.
std::string sha256_file(const std::string& path);

}  // namespace storage

// safetensors writer and validating reader (format in safetensors.h). The writer uses POSIX
// open/write/fsync rather than iostreams because a checkpoint is only durable after fsync, which
// iostreams cannot do. The reader parses the header with ordered_json so tensors of zero bytes
// (which share an offset with their neighbour) keep the order they were written in.
#include "storage/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "storage/file_io.h"
#include "storage/sha256.h"

namespace storage {

namespace {

using ordered_json = nlohmann::ordered_json;

std::string errno_text() { return std::strerror(errno); }

// Closes the fd on scope exit (set fd = -1 to close it by hand); keeps throw paths from leaking it.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Sets *out = numel(shape) * elem; false when a dim is negative or the product overflows size_t.
bool checked_nbytes(const std::vector<int64_t>& shape, size_t elem, size_t* out) {
  size_t n = elem;
  for (int64_t s : shape) {
    if (s < 0) return false;
    if (s != 0 && n > std::numeric_limits<size_t>::max() / static_cast<size_t>(s)) return false;
    n *= static_cast<size_t>(s);
  }
  *out = n;
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

}  // namespace

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I64", 8}, {"I32", 4}, {"I16", 2},  {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1},
  };
  auto it = sizes.find(dtype);
  if (it == sizes.end()) throw std::runtime_error("unknown safetensors dtype \"" + dtype + "\"");
  return it->second;
}

namespace {

// Gathers small pieces (the header, norms, scalars) into writes of up to CHUNK bytes and writes
// large tensors in CHUNK slices without copying, hashing every byte on the way.
class ChunkWriter {
 public:
  static constexpr size_t CHUNK = size_t(4) << 20;
  ChunkWriter(FileIo& io, int fd, const std::string& path) : io_(io), fd_(fd), path_(path) {}
  void put(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    if (n) sha_.update(p, n);
    while (n > 0) {
      if (buf_.empty() && n >= CHUNK) {
        io_.write(fd_, path_, p, CHUNK, offset_);
        offset_ += CHUNK;
        p += CHUNK;
        n -= CHUNK;
        continue;
      }
      const size_t take = std::min(n, CHUNK - buf_.size());
      buf_.insert(buf_.end(), p, p + take);
      p += take;
      n -= take;
      if (buf_.size() == CHUNK) flush();
    }
  }
  void flush() {
    if (buf_.empty()) return;
    io_.write(fd_, path_, buf_.data(), buf_.size(), offset_);
    offset_ += buf_.size();
    buf_.clear();
  }
  std::string digest() { return sha_.hex_digest(); }

 private:
  FileIo& io_;
  int fd_;
  const std::string& path_;
  std::vector<uint8_t> buf_;
  uint64_t offset_ = 0;
  Sha256 sha_;
};

}  // namespace

int64_t write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  return write_safetensors(posix_io(), path, tensors, metadata, nullptr);
}

int64_t write_safetensors(FileIo& io, const std::string& path, const std::vector<TensorView>& tensors,
                          const std::map<std::string, std::string>& metadata, std::string* sha256) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::set<std::string> seen;
  size_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      throw std::runtime_error(path + ": tensor name \"" + t.name + "\" is empty, reserved or repeated");
    }
    size_t want = 0;
    const size_t elem = dtype_size(t.dtype);
    if (!checked_nbytes(t.shape, elem, &want) || want != t.nbytes) {
      throw std::runtime_error(path + ": tensor \"" + t.name + "\" " + t.dtype + shape_str(t.shape) +
                               " needs " + std::to_string(want) + " bytes, got " + std::to_string(t.nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      throw std::runtime_error(path + ": tensor \"" + t.name + "\" has no data pointer");
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data buffer starts at a multiple of 8.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));

  const int fd = io.create(path);
  bool open = true;
  try {
    ChunkWriter w(io, fd, path);
    w.put(len_bytes, 8);
    w.put(text.data(), text.size());
    for (const TensorView& t : tensors) w.put(t.data, t.nbytes);
    w.flush();
    io.fsync(fd, path);
    open = false;
    // close() can report a deferred write error (NFS); treat it as a failed write.
    io.close(fd, path);
    if (sha256) *sha256 = w.digest();
  } catch (...) {
    if (open) ::close(fd);
    try {
      io.remove_tree(path);
    } catch (const std::exception&) {
      // The save fails with the first error; a leftover partial file is removed by the next save.
    }
    throw;
  }
  return static_cast<int64_t>(8 + text.size() + offset);
}

void fsync_dir(const std::string& dir) {
  Fd f;
  f.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (f.fd < 0) throw std::runtime_error(dir + ": cannot open directory to fsync: " + errno_text());
  if (::fsync(f.fd) != 0) throw std::runtime_error(dir + ": directory fsync failed: " + errno_text());
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, uint64_t at) {
  throw std::runtime_error(path + ": " + what + " (at byte offset " + std::to_string(at) + ")");
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw std::runtime_error(path + ": cannot open: " + errno_text());
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw std::runtime_error(path + ": cannot stat: " + errno_text());
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(f.fd, bytes.data() + got, bytes.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(path + ": read failed: " + errno_text());
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  // The file shrank between fstat and read; report what is really there.
  bytes.resize(got);
  return bytes;
}

}  // namespace

SafetensorsFile SafetensorsFile::read(const std::string& path) { return parse(path, read_whole_file(path)); }

SafetensorsFile SafetensorsFile::parse(const std::string& path, std::vector<uint8_t> bytes) {
  SafetensorsFile out;
  out.path_ = path;
  out.bytes_ = std::move(bytes);
  const std::vector<uint8_t>& b = out.bytes_;
  const uint64_t size = b.size();
  if (size < 8) {
    fail(path, "file is " + std::to_string(size) + " bytes, expected at least 8 for the header length "
               "---> HINT: is this a safetensors file?", 0);
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(b[i]) << (8 * i);
  if (n > size - 8) {
    fail(path, "header length " + std::to_string(n) + " exceeds the " + std::to_string(size - 8) +
               " bytes after it ---> HINT: truncated file, or not safetensors", 0);
  }
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;

  ordered_json header;
  try {
    header = ordered_json::parse(b.begin() + 8, b.begin() + static_cast<std::ptrdiff_t>(data_start));
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what(), 8 + (e.byte > 0 ? e.byte - 1 : 0));
  }
  if (!header.is_object()) fail(path, "header must be a JSON object", 8);

  struct Span {
    uint64_t begin, end;
    size_t order;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const ordered_json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ must be an object of strings", 8);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(path, "__metadata__." + m.key() + " must be a string", 8);
        out.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\"";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      fail(path, where + ": expected an object with dtype, shape and data_offsets", 8);
    }
    const ordered_json& jd = v["dtype"];
    const ordered_json& js = v["shape"];
    const ordered_json& jo = v["data_offsets"];
    if (!jd.is_string()) fail(path, where + ": dtype must be a string", 8);
    SafetensorsEntry e;
    e.dtype = jd.get<std::string>();
    size_t elem = 0;
    try {
      elem = dtype_size(e.dtype);
    } catch (const std::runtime_error& err) {
      fail(path, where + ": " + err.what(), 8);
    }
    if (!js.is_array()) fail(path, where + ": shape must be an array", 8);
    for (const auto& s : js) {
      if (!s.is_number_unsigned() || s.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
        fail(path, where + ": shape entries must be non-negative integers (got " + s.dump() + ")", 8);
      }
      e.shape.push_back(s.get<int64_t>());
    }
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned()) {
      fail(path, where + ": data_offsets must be [begin, end] with non-negative integers (got " + jo.dump() + ")",
           8);
    }
    const uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      fail(path, where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] must be ordered and within the " + std::to_string(data_size) +
                     "-byte data buffer ---> HINT: truncated file?",
           data_start + std::min(begin, data_size));
    }
    size_t want = 0;
    if (!checked_nbytes(e.shape, elem, &want) || want != end - begin) {
      fail(path, where + ": " + e.dtype + shape_str(e.shape) + " needs " + std::to_string(want) +
                     " bytes but data_offsets span " + std::to_string(end - begin),
           data_start + begin);
    }
    e.offset = static_cast<size_t>(data_start + begin);
    e.nbytes = static_cast<size_t>(end - begin);
    out.entries_[name] = e;
    spans.push_back({begin, end, spans.size(), name});
  }

  // Tile check: sorted by begin (ties: zero-byte tensors first, then header order), each span
  // must start where the previous one ended, and the last must end at the buffer's end.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& c) {
    if (a.begin != c.begin) return a.begin < c.begin;
    if (a.end != c.end) return a.end < c.end;
    return a.order < c.order;
  });
  uint64_t cursor = 0;
  std::string prev = "the start of the data buffer";
  for (const Span& s : spans) {
    if (s.begin < cursor) {
      fail(path, "tensor \"" + s.name + "\" overlaps " + prev + ": it begins at data offset " +
                     std::to_string(s.begin) + ", expected " + std::to_string(cursor),
           data_start + s.begin);
    }
    if (s.begin > cursor) {
      fail(path, "gap before tensor \"" + s.name + "\": it begins at data offset " + std::to_string(s.begin) +
                     ", expected " + std::to_string(cursor) + " (the end of " + prev + ")",
           data_start + cursor);
    }
    cursor = s.end;
    prev = "tensor \"" + s.name + "\"";
    out.order_.push_back(s.name);
  }
  if (cursor != data_size) {
    fail(path, "tensors cover " + std::to_string(cursor) + " bytes of a " + std::to_string(data_size) +
                   "-byte data buffer; expected them to cover it exactly",
         data_start + cursor);
  }
  return out;
}

const uint8_t* SafetensorsFile::data(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::runtime_error(path_ + ": no tensor named \"" + name + "\"");
  return bytes_.data() + it->second.offset;
}

std::vector<std::string> SafetensorsFile::names_in_file_order() const { return order_; }

}  // namespace storage

// open_source: the "FORMAT:GLOB" dispatch and the glob expansion every format shares. Files are
// deduplicated by their real path because corpora such as the fortunes package ship each file
// twice (a `.u8` symlink beside the original).
#include "trainer/data/source.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

#include "trainer/data/mapped_files.h"
#include "trainer/data/source_internal.h"

namespace trainer::data {

namespace detail {

MappedFile::MappedFile(const std::string& path, const std::string& key) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(key + ": " + path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(key + ": " + path + ": cannot stat (" + std::strerror(err) + ")");
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(key + ": " + path + ": cannot map " + std::to_string(size_) + " bytes (" +
                               std::strerror(err) + ")");
    }
    data_ = static_cast<const char*>(p);
    fault_handle_ = remember_mapping(data_, static_cast<size_t>(size_), path);
  }
  // The mapping keeps the file's pages reachable; the descriptor is not needed any more.
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_), fault_handle_(o.fault_handle_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.fault_handle_ = -1;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    forget_mapping(fault_handle_);
    if (data_) ::munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
    data_ = o.data_;
    size_ = o.size_;
    fault_handle_ = o.fault_handle_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.fault_handle_ = -1;
  }
  return *this;
}

MappedFile::~MappedFile() {
  forget_mapping(fault_handle_);
  if (data_) ::munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
}

void fail_at(const std::string& key, const std::string& file, int64_t byte, const std::string& what) {
  throw std::runtime_error(key + ": " + file + ": byte " + std::to_string(byte) + ": " + what);
}

}  // namespace detail

bool is_token_source(const std::string& spec) {
  return spec.rfind("llmc:", 0) == 0 || spec.rfind("u16:", 0) == 0 || spec.rfind("random:", 0) == 0;
}

namespace {

bool excluded(const std::string& path, const std::vector<std::string>& exclude) {
  const auto slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  for (const auto& pat : exclude) {
    if (fnmatch(pat.c_str(), base.c_str(), 0) == 0 || fnmatch(pat.c_str(), path.c_str(), 0) == 0) return true;
  }
  return false;
}

struct ParsedSpec {
  std::string format;   // text | jsonl | llmc | u16
  std::string pattern;  // the glob
};

ParsedSpec parse_spec(const std::string& spec, const std::string& key) {
  const auto colon = spec.find(':');
  if (colon != std::string::npos) {
    ParsedSpec p{spec.substr(0, colon), spec.substr(colon + 1)};
    if (p.format == "text" || p.format == "jsonl" || p.format == "llmc" || p.format == "u16" || p.format == "random")
      return p;
  }
  throw std::runtime_error(key + ": source '" + spec + "' has no known format prefix; expected text:GLOB, " +
                           "jsonl:GLOB, llmc:GLOB (llm.c token shards) or u16:GLOB (raw uint16 tokens)");
}

std::vector<std::string> expand_pattern(const std::string& pattern, const std::vector<std::string>& exclude,
                                        const std::string& key) {
  if (pattern.empty()) throw std::runtime_error(key + ": the source names no files (empty glob)");
  glob_t g{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  std::set<std::string> seen_real;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::string p = g.gl_pathv[i];
      struct stat st{};
      if (stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (excluded(p, exclude)) continue;
      char real[PATH_MAX];
      std::string rp = realpath(p.c_str(), real) ? std::string(real) : p;
      if (!seen_real.insert(rp).second) continue;
      files.push_back(p);
    }
  }
  globfree(&g);
  if (files.empty()) {
    const bool literal = pattern.find_first_of("*?[") == std::string::npos;
    struct stat st{};
    if (literal && stat(pattern.c_str(), &st) != 0) {
      throw std::runtime_error(key + ": " + pattern + ": cannot open (" + std::strerror(errno) + ")" +
                               "\n---> HINT: check the path");
    }
    throw std::runtime_error(key + ": '" + pattern + "' matches no readable files" +
                             (exclude.empty() ? "" : " (after data.exclude)") +
                             "\n---> HINT: check the path; globs need quotes in the shell but not in the config");
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> expand_source_files(const std::string& spec, const std::vector<std::string>& exclude,
                                             const std::string& key) {
  const ParsedSpec p = parse_spec(spec, key);
  if (p.format == "random") return {};  // no files behind it
  return expand_pattern(p.pattern, exclude, key);
}

std::unique_ptr<Source> open_source(const std::string& spec, const SourceOptions& opts, const Tokenizer& tok) {
  const ParsedSpec p = parse_spec(spec, opts.key);
  if (p.format == "random") return detail::open_random_source(p.pattern, opts);
  auto files = expand_pattern(p.pattern, opts.exclude, opts.key);
  if (p.format == "text") return detail::open_text_source(std::move(files), opts, tok);
  if (p.format == "jsonl") return detail::open_jsonl_source(std::move(files), opts, tok);
  return detail::open_token_source(std::move(files), opts, p.format == "llmc");
}

namespace detail {

std::unique_ptr<TextDocumentSource> open_text_documents(const std::string& spec, const SourceOptions& opts) {
  const std::string full = spec.find(':') == std::string::npos ? "text:" + spec : spec;
  const ParsedSpec p = parse_spec(full, opts.key);
  if (p.format != "text" && p.format != "jsonl") {
    throw std::runtime_error(opts.key + ": '" + spec + "' holds token ids; training a tokenizer reads text: or " +
                             "jsonl: sources");
  }
  // A tokenizer that needs UTF-8 makes the text source check every file at open time.
  struct Utf8Check final : Tokenizer {
    int64_t vocab_size() const override { return 0; }
    int32_t eot() const override { return 0; }
    void encode(std::string_view, std::vector<int32_t>&, const std::string&) const override {}
    std::string decode(const std::vector<int32_t>&) const override { return {}; }
    bool needs_utf8() const override { return true; }
  } check;
  auto files = expand_pattern(p.pattern, opts.exclude, opts.key);
  if (p.format == "text") return open_text_source(std::move(files), opts, check);
  return open_jsonl_source(std::move(files), opts, check);
}

}  // namespace detail

SourceOptions source_options(const DataConfig& data, int64_t vocab_size, const std::string& key) {
  SourceOptions o;
  o.exclude = data.exclude;
  o.separator = data.separator;
  o.text_field = data.text_field;
  o.eot_token = data.eot_token;
  o.vocab_size = vocab_size;
  o.key = key;
  return o;
}

}  // namespace trainer::data

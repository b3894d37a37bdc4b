// Pieces shared by the source formats (source.cpp, text_sources.cpp, token_sources.cpp) and their
// tests; not part of the data API. Files are memory-mapped read-only and stay mapped while the
// source lives, so read_document is a copy out of the page cache with no syscall and no lock.
// No torch.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/source.h"

namespace trainer::data::detail {

// Where one document lives: 16 bytes, so a billion-token corpus of 1000-token documents indexes
// in 16 MB. Units are bytes for text formats and tokens (from the first token) for token formats.
struct DocRecord {
  int64_t offset = 0;
  uint32_t length = 0;
  int32_t file = 0;  // index into the source's files()
};
static_assert(sizeof(DocRecord) == 16, "DocRecord is packed into 16 bytes");

// A whole file mapped read-only (nothing mapped for an empty file). Move-only.
class MappedFile {
 public:
  MappedFile() = default;
  // Throws std::runtime_error "KEY: FILE: cannot open (...)" when the file cannot be read.
  MappedFile(const std::string& path, const std::string& key);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  const char* data() const { return data_; }
  int64_t size() const { return size_; }
  std::string_view view() const { return {data_, static_cast<size_t>(size_)}; }

 private:
  const char* data_ = nullptr;
  int64_t size_ = 0;
  int fault_handle_ = -1;  // trainer/data/mapped_files.h: names the file if a read of it faults
};

// "KEY: FILE: byte N: WHAT" as a std::runtime_error.
[[noreturn]] void fail_at(const std::string& key, const std::string& file, int64_t byte, const std::string& what);

// Text formats expose the raw document text (tokenizer training reads it).
class TextDocumentSource : public Source {
 public:
  // Replaces out with document i's text. Any thread. Throws like read_document.
  virtual void document_text(int64_t i, std::string& out) const = 0;
};

// Opens a text: or jsonl: spec (no prefix = text:) for its raw texts, every file checked for
// UTF-8 (tokenizer training). Throws as open_source, and for token formats.
std::unique_ptr<TextDocumentSource> open_text_documents(const std::string& spec, const SourceOptions& opts);

// Past max_mapped files, text formats read documents with pread instead of keeping every file
// mapped (vm.max_map_count is 65530 by default; a corpus of one file per document can exceed it).
constexpr size_t MAX_MAPPED_FILES = 4096;

std::unique_ptr<TextDocumentSource> open_text_source(std::vector<std::string> files, const SourceOptions& opts,
                                                     const Tokenizer& tok, size_t max_mapped = MAX_MAPPED_FILES);
std::unique_ptr<TextDocumentSource> open_jsonl_source(std::vector<std::string> files, const SourceOptions& opts,
                                                      const Tokenizer& tok);
// llmc = true: llm.c shards with their 1024-byte header; false: raw uint16 arrays.
std::unique_ptr<Source> open_token_source(std::vector<std::string> files, const SourceOptions& opts, bool llmc);
// random:DOCS (random_source.cpp): synthetic token documents for benchmarks.
std::unique_ptr<Source> open_random_source(const std::string& count, const SourceOptions& opts);

// ---------------------------------------------------------------------------------------------

// Whether p[0, n) is only whitespace.
inline bool is_blank(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != '\f' && c != '\v') return false;
  }
  return true;
}

// Calls emit(begin, end) for every document of text[0, n) split at separator lines (a line equal
// to separator, ignoring a trailing '\r'), at runs of blank lines (separator "<blank>"), or the
// whole text (separator ""). Empty and whitespace-only documents are skipped.
template <class Emit>
void split_text(const char* text, size_t n, const std::string& separator, Emit&& emit) {
  auto push = [&](size_t b, size_t e) {
    if (e > b && !is_blank(text + b, e - b)) emit(b, e);
  };
  if (separator.empty()) {
    push(0, n);
    return;
  }
  const bool blank_mode = separator == "<blank>";
  size_t doc_begin = 0, line_begin = 0;
  while (line_begin < n) {
    const void* nlp = std::memchr(text + line_begin, '\n', n - line_begin);
    const size_t line_end = nlp ? static_cast<size_t>(static_cast<const char*>(nlp) - text) : n;
    size_t content_end = line_end;
    if (content_end > line_begin && text[content_end - 1] == '\r') --content_end;
    const size_t len = content_end - line_begin;
    const bool is_sep = blank_mode ? is_blank(text + line_begin, len)
                                   : len == separator.size() && std::memcmp(text + line_begin, separator.data(), len) == 0;
    const size_t next = nlp ? line_end + 1 : n;
    if (is_sep) {
      push(doc_begin, line_begin);
      doc_begin = next;
    }
    line_begin = next;
  }
  push(doc_begin, n);
}

}  // namespace trainer::data::detail

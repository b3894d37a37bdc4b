// Text formats: text:GLOB (documents split at separator lines) and jsonl:GLOB (one JSON object per
// line). Both validate everything they can at open time (UTF-8 when the tokenizer needs it, every
// JSONL line's syntax and field type), so a bad byte stops the run before the first step instead of
// hours into it. JSONL lines are parsed again at read time with a SAX handler that stops at the
// field, because keeping decoded texts would hold the corpus in memory.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "trainer/data/source_internal.h"

namespace trainer::data::detail {

namespace {

std::string hex_byte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", c);
  return buf;
}

void check_utf8(const std::string& key, const std::string& file, std::string_view text, int64_t base) {
  const int64_t bad = first_invalid_utf8(text);
  if (bad < 0) return;
  fail_at(key, file, base + bad,
          "invalid UTF-8 (byte " + hex_byte(static_cast<unsigned char>(text[static_cast<size_t>(bad)])) +
              "); expected UTF-8 text, which the tokenizer needs\n"
              "---> HINT: convert the file (iconv -f latin1 -t utf-8) or use data.tokenizer = \"byte\"");
}

uint32_t checked_length(const std::string& key, const std::string& file, int64_t offset, int64_t length) {
  if (length > static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
    fail_at(key, file, offset,
            "a document of " + std::to_string(length) + " bytes; expected at most 4 GiB per document (set " +
                "data.separator so the file splits)");
  }
  return static_cast<uint32_t>(length);
}

// Reads file[offset, offset + length) with open + pread + close (the unmapped path).
void read_range(const std::string& key, const std::string& file, int64_t offset, int64_t length, std::string& out) {
  out.resize(static_cast<size_t>(length));
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(key + ": " + file + ": cannot open (" + std::strerror(errno) + ")");
  int64_t done = 0;
  while (done < length) {
    const ssize_t r = ::pread(fd, out.data() + done, static_cast<size_t>(length - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : 0;
      ::close(fd);
      fail_at(key, file, offset + done,
              r < 0 ? std::string("read failed (") + std::strerror(err) + ")"
                    : "the file ended early; expected " + std::to_string(length - done) +
                          " more bytes (did it change since the run started?)");
    }
    done += r;
  }
  ::close(fd);
}

// Shared by both text formats: the files, their mappings (or none, past MAX_MAPPED_FILES), the
// document records and the helpers that read a record's bytes.
class FileBackedText : public TextDocumentSource {
 public:
  int64_t num_documents() const override { return static_cast<int64_t>(docs_.size()); }
  int64_t document_tokens(int64_t) const override { return -1; }
  std::string where(int64_t i) const override {
    const DocRecord& d = docs_[static_cast<size_t>(i)];
    return files_[static_cast<size_t>(d.file)] + ":" + std::to_string(d.offset);
  }
  const std::vector<std::string>& files() const override { return files_; }

 protected:
  FileBackedText(std::vector<std::string> files, const SourceOptions& opts, size_t max_mapped)
      : files_(std::move(files)), key_(opts.key), mapped_(files_.size() <= max_mapped) {}

  // The bytes of record d: a view into the mapping, or read into scratch.
  std::string_view bytes(const DocRecord& d, std::string& scratch) const {
    if (mapped_) return maps_[static_cast<size_t>(d.file)].view().substr(static_cast<size_t>(d.offset), d.length);
    read_range(key_, files_[static_cast<size_t>(d.file)], d.offset, d.length, scratch);
    return scratch;
  }

  void keep(MappedFile m) {
    if (mapped_) maps_.push_back(std::move(m));
  }

  void require_documents(const std::string& what) const {
    if (!docs_.empty()) return;
    throw std::runtime_error(key_ + ": " + files_.front() + (files_.size() > 1 ? " (and " + std::to_string(files_.size() - 1) + " more files)" : "") +
                             ": byte 0: no documents; expected " + what);
  }

  std::vector<std::string> files_;
  std::string key_;
  bool mapped_;
  std::vector<MappedFile> maps_;  // one per file when mapped_
  std::vector<DocRecord> docs_;
};

// [text]

class TextSource final : public FileBackedText {
 public:
  TextSource(std::vector<std::string> files, const SourceOptions& opts, const Tokenizer& tok, size_t max_mapped)
      : FileBackedText(std::move(files), opts, max_mapped) {
    for (size_t f = 0; f < files_.size(); ++f) {
      MappedFile m(files_[f], key_);
      if (tok.needs_utf8()) check_utf8(key_, files_[f], m.view(), 0);
      split_text(m.data(), static_cast<size_t>(m.size()), opts.separator, [&](size_t b, size_t e) {
        const auto off = static_cast<int64_t>(b);
        docs_.push_back({off, checked_length(key_, files_[f], off, static_cast<int64_t>(e - b)), static_cast<int32_t>(f)});
      });
      keep(std::move(m));
    }
    require_documents("text that is not only whitespace" +
                      (opts.separator.empty() ? std::string() : " between data.separator = \"" + opts.separator + "\" lines"));
  }

  void read_document(int64_t i, const Tokenizer& tok, std::vector<int32_t>& out) const override {
    std::string scratch;
    tok.encode(bytes(docs_[static_cast<size_t>(i)], scratch), out, where(i));
    out.push_back(tok.eot());
  }

  void document_text(int64_t i, std::string& out) const override {
    std::string scratch;
    const std::string_view v = bytes(docs_[static_cast<size_t>(i)], scratch);
    out.assign(v.data(), v.size());
  }
};

// [jsonl]

using nlohmann::json;

// Walks one line's events: the top level must be an object; its first `field` member's kind is
// recorded and, when it is a string, its decoded text kept. stop_at_field ends the parse there.
class FieldSax final : public nlohmann::json_sax<json> {
 public:
  FieldSax(const std::string& field, bool stop_at_field) : field_(field), stop_(stop_at_field) {}

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("a boolean"); }
  bool number_integer(number_integer_t) override { return value("a number"); }
  bool number_unsigned(number_unsigned_t) override { return value("a number"); }
  bool number_float(number_float_t, const string_t&) override { return value("a number"); }
  bool binary(binary_t&) override { return value("binary"); }
  bool string(string_t& s) override {
    if (depth_ == 0 || !expect_ || found_) return value("a string");
    expect_ = false;
    found_ = true;
    kind = "a string";
    text = std::move(s);
    return !stop_;
  }
  bool start_object(std::size_t) override {
    if (depth_ == 0) top_object = true;
    else value("an object");
    ++depth_;
    return true;
  }
  bool key(string_t& k) override {
    expect_ = depth_ == 1 && k == field_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    value("an array");
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    error_position = static_cast<int64_t>(position);
    error = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..." -> "syntax error ..."
    const auto col = error.find("column ");
    if (col != std::string::npos) {
      const auto colon = error.find(": ", col);
      if (colon != std::string::npos) error = error.substr(colon + 2);
    }
    return false;
  }

  bool top_object = false;
  bool found_ = false;
  std::string kind;            // the field's JSON kind ("a string", "a number", ...) when found_
  std::string text;            // the field's text when it is a string
  std::string error;           // a syntax error, without nlohmann's prefix
  int64_t error_position = 0;  // 1-based byte position in the line of the syntax error

 private:
  bool value(const char* what) {
    if (depth_ == 1 && expect_) {
      expect_ = false;
      if (!found_) {
        found_ = true;
        kind = what;
      }
    }
    return true;
  }
  const std::string& field_;
  bool stop_;
  int depth_ = 0;
  bool expect_ = false;
};

class JsonlSource final : public FileBackedText {
 public:
  // The tokenizer is not consulted: JSON text is UTF-8 by definition and every line is checked.
  JsonlSource(std::vector<std::string> files, const SourceOptions& opts)
      : FileBackedText(std::move(files), opts, MAX_MAPPED_FILES), field_(opts.text_field) {
    for (size_t f = 0; f < files_.size(); ++f) {
      MappedFile m(files_[f], key_);
      index_file(static_cast<int32_t>(f), m.data(), static_cast<size_t>(m.size()));
      keep(std::move(m));
    }
    require_documents("lines holding a JSON object with a string field \"" + field_ + "\" that is not only whitespace");
  }

  void read_document(int64_t i, const Tokenizer& tok, std::vector<int32_t>& out) const override {
    std::string text;
    document_text(i, text);
    tok.encode(text, out, where(i));
    out.push_back(tok.eot());
  }

  void document_text(int64_t i, std::string& out) const override {
    const DocRecord& d = docs_[static_cast<size_t>(i)];
    std::string scratch;
    const std::string_view line = bytes(d, scratch);
    FieldSax sax(field_, /*stop_at_field=*/true);
    json::sax_parse(line.data(), line.data() + line.size(), &sax);
    if (!sax.found_ || sax.kind != "a string") {
      fail_at(key_, files_[static_cast<size_t>(d.file)], d.offset,
              "the line no longer holds a string field \"" + field_ + "\" (did the file change since the run started?)");
    }
    out = std::move(sax.text);
  }

 private:
  void index_file(int32_t f, const char* data, size_t n) {
    const std::string& file = files_[static_cast<size_t>(f)];
    size_t line_begin = 0;
    int64_t line_no = 0;
    while (line_begin < n) {
      ++line_no;
      const void* nlp = std::memchr(data + line_begin, '\n', n - line_begin);
      const size_t line_end = nlp ? static_cast<size_t>(static_cast<const char*>(nlp) - data) : n;
      size_t content_end = line_end;
      if (content_end > line_begin && data[content_end - 1] == '\r') --content_end;
      const size_t next = nlp ? line_end + 1 : n;
      const char* line = data + line_begin;
      const size_t len = content_end - line_begin;
      const auto off = static_cast<int64_t>(line_begin);
      if (is_blank(line, len)) {
        line_begin = next;
        continue;
      }
      const std::string at = file + ":" + std::to_string(off) + ": line " + std::to_string(line_no) + ": ";
      // JSON text is UTF-8 (RFC 8259); name the byte rather than relay the parser's wording.
      const int64_t bad = first_invalid_utf8(std::string_view(line, len));
      if (bad >= 0) {
        throw std::runtime_error(key_ + ": " + at + "invalid UTF-8 at byte " + std::to_string(off + bad) + " (" +
                                 hex_byte(static_cast<unsigned char>(line[bad])) + "); expected UTF-8 JSON");
      }
      FieldSax sax(field_, /*stop_at_field=*/false);
      json::sax_parse(line, line + len, &sax);
      if (!sax.error.empty()) {
        throw std::runtime_error(key_ + ": " + at + "not valid JSON at byte " +
                                 std::to_string(off + std::max<int64_t>(sax.error_position - 1, 0)) + ": " +
                                 sax.error + "; expected one JSON object per line");
      }
      if (!sax.top_object) throw std::runtime_error(key_ + ": " + at + "not a JSON object; expected one object per line");
      if (!sax.found_) {
        throw std::runtime_error(key_ + ": " + at + "no field \"" + field_ +
                                 "\"; expected the document text there (data.text_field)");
      }
      if (sax.kind != "a string") {
        throw std::runtime_error(key_ + ": " + at + "field \"" + field_ + "\" is " + sax.kind +
                                 ", expected a string (data.text_field)");
      }
      if (!is_blank(sax.text.data(), sax.text.size())) {
        docs_.push_back({off, checked_length(key_, file, off, static_cast<int64_t>(len)), f});
      }
      line_begin = next;
    }
  }

  std::string field_;
};

}  // namespace

std::unique_ptr<TextDocumentSource> open_text_source(std::vector<std::string> files, const SourceOptions& opts,
                                                     const Tokenizer& tok, size_t max_mapped) {
  return std::make_unique<TextSource>(std::move(files), opts, tok, max_mapped);
}

std::unique_ptr<TextDocumentSource> open_jsonl_source(std::vector<std::string> files, const SourceOptions& opts,
                                                      const Tokenizer&) {
  return std::make_unique<JsonlSource>(std::move(files), opts);
}

}  // namespace trainer::data::detail

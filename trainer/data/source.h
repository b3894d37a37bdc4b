// Corpus sources: every file format deltadeck reads, behind one indexed interface. Opening a source
// scans its files once and keeps a compact index of where each document lives, so the loader can
// shuffle, shard across ranks and resume by document index without holding the corpus in memory.
//   text:GLOB   a document per file, or documents split at separator lines (data.separator)
//   jsonl:GLOB  one JSON object per line; the document is its data.text_field string
//   llmc:GLOB   llm.c token shards: 256 int32 header (magic 20240520, version 1, token count), then
//               uint16 tokens; documents split at data.eot_token
//   u16:GLOB    raw uint16 token arrays (nanoGPT's train.bin); documents split at data.eot_token
//   random:DOCS synthetic documents of uniform token ids (benchmarks; needs model.vocab_size)
// No torch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/api.h"
#include "trainer/data/tokenizer.h"

namespace trainer::data {

struct SourceOptions {
  std::vector<std::string> exclude;  // globs of files to skip
  std::string separator = "%";       // text: a line equal to this ends a document; "" = one per file;
                                     // "<blank>" = one or more blank lines end a document
  std::string text_field = "text";   // jsonl: the field holding the document
  int64_t eot_token = 50256;         // token sources: the id between documents
  int64_t vocab_size = 0;            // token sources: ids must be < this (0 = unchecked)
  std::string key = "data.train";    // the config key this source came from, for errors
};

// The options a run's [data] section gives every source; `key` names the source in errors.
SourceOptions source_options(const DataConfig& data, int64_t vocab_size, const std::string& key);

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t num_documents() const = 0;
  // Appends document i's tokens followed by an end-of-document id. Text sources tokenize here with
  // tok and append tok.eot(); token sources copy their ids and append opts.eot_token (the shard's
  // own EOT, e.g. 50256 in GPT-2 shards; tok is unused). Thread-safe (const, no shared buffers).
  // Throws std::runtime_error naming the file and byte offset on a bad record found only now
  // (e.g. a JSONL line whose field is not a string, invalid UTF-8 under SentencePiece).
  virtual void read_document(int64_t i, const Tokenizer& tok, std::vector<int32_t>& out) const = 0;
  // Tokens of document i without reading it, where the format knows it (token sources: exact,
  // EOT excluded); -1 for text sources.
  virtual int64_t document_tokens(int64_t i) const = 0;
  // "file:byte_offset" of document i, for messages.
  virtual std::string where(int64_t i) const = 0;
  // Files this source covers, in index order.
  virtual const std::vector<std::string>& files() const = 0;
};

// Opens one source spec ("text:/data/*.txt"). Throws std::runtime_error, naming opts.key, the file
// and byte offset and what was expected, for: an unknown prefix, a glob matching no file, an
// unreadable file, a shard with a wrong magic or version, a header token count that disagrees with
// the file size, a truncated shard or odd-sized u16 file, a token id >= opts.vocab_size, invalid
// UTF-8 when tok.needs_utf8(), a JSONL line that is not an object with a string opts.text_field.
// A source with no documents is an error too.
std::unique_ptr<Source> open_source(const std::string& spec, const SourceOptions& opts, const Tokenizer& tok);
// True for the formats that hold token ids rather than text (llmc:, u16:, random:): they carry no
// tokenizer, so the model's vocabulary must be given and data.tokenizer does not decode them.
bool is_token_source(const std::string& spec);

// The files spec names ("FORMAT:GLOB"), as open_source would read them: sorted, files matching an
// exclude glob (by base name or full path) dropped, symlinked duplicates (same real path) kept
// once. Cheap (no file is read), for config validation. Any thread. Throws std::runtime_error
// naming key for an unknown prefix or a glob that matches no regular file.
std::vector<std::string> expand_source_files(const std::string& spec, const std::vector<std::string>& exclude,
                                             const std::string& key);

}  // namespace trainer::data

// Text sources: "text:GLOB" entries expanded to files (sorted, symlinked duplicates and excluded
// globs dropped), each file split into documents at separator lines. No torch.
#pragma once

#include <string>
#include <vector>

namespace trainer::data {

struct TextDocument {
  std::string text;
  std::string file;     // where it came from (for error messages)
  int64_t offset = 0;   // byte offset of its first byte in that file
};

// Expands one source spec ("text:/path/*.txt") to the files it names. `key` (e.g. "data.train[0]")
// is used in errors. Throws std::runtime_error when the prefix is unknown or nothing matches.
std::vector<std::string> expand_text_source(const std::string& spec, const std::vector<std::string>& exclude,
                                            const std::string& key);

// Splits a file's text into documents: a line equal to `separator` (ignoring a trailing '\r')
// ends a document; an empty separator makes the whole file one document. Documents that are
// empty or only whitespace are dropped.
std::vector<TextDocument> split_documents(const std::string& text, const std::string& separator,
                                          const std::string& file);

// Reads every file of every source and splits it. Throws std::runtime_error naming the file on a
// read failure.
std::vector<TextDocument> read_text_sources(const std::vector<std::string>& specs,
                                            const std::vector<std::string>& exclude,
                                            const std::string& separator);

}  // namespace trainer::data

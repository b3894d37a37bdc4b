// Text sources. Files are deduplicated by their real path because corpora such as the fortunes
// package ship each file twice (a `.u8` symlink beside the original).
#include "trainer/data/text_source.h"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>

namespace trainer::data {

namespace {
bool excluded(const std::string& path, const std::vector<std::string>& exclude) {
  const auto slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  for (const auto& pat : exclude) {
    if (fnmatch(pat.c_str(), base.c_str(), 0) == 0 || fnmatch(pat.c_str(), path.c_str(), 0) == 0) return true;
  }
  return false;
}
}  // namespace

std::vector<std::string> expand_text_source(const std::string& spec, const std::vector<std::string>& exclude,
                                            const std::string& key) {
  const std::string prefix = "text:";
  if (spec.rfind(prefix, 0) != 0) {
    throw std::runtime_error(key + ": source '" + spec + "' is not supported yet (this build reads text:GLOB)");
  }
  const std::string pattern = spec.substr(prefix.size());
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
    throw std::runtime_error(key + ": '" + pattern + "' matches no readable files" +
                             (exclude.empty() ? "" : " (after data.exclude)") +
                             "\n---> HINT: check the path; globs need quotes in the shell but not in the config");
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<TextDocument> split_documents(const std::string& text, const std::string& separator,
                                          const std::string& file) {
  std::vector<TextDocument> docs;
  auto push = [&](size_t begin, size_t end) {
    std::string d = text.substr(begin, end - begin);
    if (d.find_first_not_of(" \t\r\n") == std::string::npos) return;
    docs.push_back({std::move(d), file, static_cast<int64_t>(begin)});
  };
  if (separator.empty()) {
    push(0, text.size());
    return docs;
  }
  size_t doc_begin = 0, line_begin = 0;
  while (line_begin < text.size()) {
    size_t nl = text.find('\n', line_begin);
    size_t line_end = nl == std::string::npos ? text.size() : nl;
    size_t content_end = line_end;
    if (content_end > line_begin && text[content_end - 1] == '\r') --content_end;
    const bool is_sep = text.compare(line_begin, content_end - line_begin, separator) == 0 &&
                        content_end - line_begin == separator.size();
    const size_t next = nl == std::string::npos ? text.size() : nl + 1;
    if (is_sep) {
      push(doc_begin, line_begin);
      doc_begin = next;
    }
    line_begin = next;
  }
  push(doc_begin, text.size());
  return docs;
}

std::vector<TextDocument> read_text_sources(const std::vector<std::string>& specs,
                                            const std::vector<std::string>& exclude,
                                            const std::string& separator) {
  std::vector<TextDocument> all;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string key = "data.train[" + std::to_string(i) + "]";
    for (const auto& f : expand_text_source(specs[i], exclude, key)) {
      std::ifstream in(f, std::ios::binary);
      if (!in) throw std::runtime_error(f + ": cannot open (" + std::strerror(errno) + ")");
      std::ostringstream ss;
      ss << in.rdbuf();
      if (in.bad()) throw std::runtime_error(f + ": read failed (" + std::strerror(errno) + ")");
      auto docs = split_documents(ss.str(), separator, f);
      all.insert(all.end(), std::make_move_iterator(docs.begin()), std::make_move_iterator(docs.end()));
    }
  }
  return all;
}

}  // namespace trainer::data

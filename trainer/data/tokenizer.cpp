// make_tokenizer's spec dispatch and the UTF-8 check shared by the tokenizers and sources.
#include "trainer/data/tokenizer.h"

#include <cstring>
#include <stdexcept>

#include "trainer/data/byte_tokenizer.h"
#include "trainer/data/sentencepiece_tokenizer.h"

namespace trainer::data {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  const std::string sp = "sentencepiece:";
  if (spec.rfind(sp, 0) == 0) {
    const std::string path = spec.substr(sp.size());
    if (path.empty()) throw std::invalid_argument("data.tokenizer: \"" + spec + "\" names no .model file");
    return load_sentencepiece_tokenizer(path);
  }
  throw std::invalid_argument("data.tokenizer: unknown tokenizer \"" + spec +
                              "\"; expected \"byte\" or \"sentencepiece:PATH.model\"");
}

int64_t tokenizer_vocab_size(const std::string& spec) {
  if (spec == "byte") return ByteTokenizer::VOCAB;
  return make_tokenizer(spec)->vocab_size();
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF. ASCII runs
// are skipped 8 bytes at a time, which is most of any corpus.
int64_t first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return static_cast<int64_t>(i);
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return static_cast<int64_t>(i);
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

}  // namespace trainer::data

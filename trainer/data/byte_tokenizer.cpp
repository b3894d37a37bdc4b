// Byte-level tokenizer. encode is a widening copy the compiler vectorizes: the text loader must
// reach >= 5M tokens/s on two threads, so there is no per-byte push_back.
#include "trainer/data/byte_tokenizer.h"

namespace trainer::data {

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  const size_t n0 = out.size();
  out.resize(n0 + text.size());
  const auto* src = reinterpret_cast<const unsigned char*>(text.data());
  int32_t* dst = out.data() + n0;  // (text.size(),)
  for (size_t i = 0; i < text.size(); ++i) dst[i] = static_cast<int32_t>(src[i]);
}

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out, const std::string&) const {
  encode(text, out);
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) {
    if (id == EOT) s += "\n<|eot|>\n";
    else if (id >= 0 && id < 256) s += static_cast<char>(id);
    else s += '?';
  }
  return s;
}

}  // namespace trainer::data

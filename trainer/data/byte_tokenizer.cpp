#include "trainer/data/byte_tokenizer.h"

#include <stdexcept>

namespace trainer::data {

void ByteTokenizer::encode(const std::string& text, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size());
  for (unsigned char c : text) out.push_back(static_cast<int32_t>(c));
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

int64_t tokenizer_vocab_size(const std::string& spec) {
  if (spec == "byte") return ByteTokenizer::VOCAB;
  throw std::invalid_argument("data.tokenizer: '" + spec + "' is not supported by this build yet (use \"byte\")");
}

}  // namespace trainer::data

// Byte-level tokenizer: ids 0..255 are the bytes, 256 ends a document. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

class ByteTokenizer {
 public:
  static constexpr int32_t EOT = 256;
  static constexpr int64_t VOCAB = 257;
  int64_t vocab_size() const { return VOCAB; }
  int32_t eot() const { return EOT; }
  // Appends the bytes of text as ids (no EOT).
  void encode(const std::string& text, std::vector<int32_t>& out) const;
  // Bytes of ids; EOT becomes "\n<|eot|>\n", anything else out of range becomes '?'.
  std::string decode(const std::vector<int32_t>& ids) const;
};

// The vocabulary size a tokenizer spec gives ("byte" -> 257). Throws std::invalid_argument
// naming data.tokenizer for specs this build does not support.
int64_t tokenizer_vocab_size(const std::string& spec);

}  // namespace trainer::data

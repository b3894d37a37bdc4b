// Byte-level tokenizer: ids 0..255 are the bytes, 256 ends a document. Any bytes are accepted
// (no UTF-8 requirement), so text sources never fail on encoding under it. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/tokenizer.h"

namespace trainer::data {

// `final` so calls through a ByteTokenizer& are not virtual.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t EOT = 256;
  static constexpr int64_t VOCAB = 257;
  int64_t vocab_size() const override { return VOCAB; }
  int32_t eot() const override { return EOT; }
  // Appends the bytes of text as ids (no EOT). Never throws. Any thread.
  void encode(std::string_view text, std::vector<int32_t>& out, const std::string& where) const override;
  // The same, without a `where` (callers that cannot fail: sampling prompts).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // Bytes of ids; EOT becomes "\n<|eot|>\n", anything else out of range becomes '?'. Any thread.
  std::string decode(const std::vector<int32_t>& ids) const override;
  bool needs_utf8() const override { return false; }
};

}  // namespace trainer::data

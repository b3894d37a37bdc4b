// Tokenizers behind one interface: byte-level (ids 0..255 are the bytes, 256 ends a document) and
// SentencePiece (a trained .model file). Encoding is const and thread-safe, so every loader
// producer thread shares one instance. No torch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // The id appended after every document (the model learns where documents end).
  virtual int32_t eot() const = 0;
  // Appends the ids of text. `where` (e.g. "/data/a.txt:1234") names the text in errors; the
  // SentencePiece tokenizer throws std::runtime_error on invalid UTF-8 with where + the byte offset
  // of the first bad byte. Text never encodes to eot(), even text that reads "<|eot|>". Any thread.
  virtual void encode(std::string_view text, std::vector<int32_t>& out, const std::string& where) const = 0;
  // Text of ids (end-of-document shown as "\n<|eot|>\n"). Any thread.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Whether encode needs valid UTF-8 (SentencePiece) or takes any bytes (byte-level).
  virtual bool needs_utf8() const = 0;
};

// "byte" or "sentencepiece:PATH.model". Any thread. Throws std::invalid_argument starting
// "data.tokenizer: " for an unknown kind, and std::runtime_error naming the file when a .model
// cannot be loaded or has no "<|eot|>" piece.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// The vocabulary size `spec` gives without keeping the tokenizer (config resolution). Any thread.
// Throws as make_tokenizer (a missing .model is a std::runtime_error naming the file).
int64_t tokenizer_vocab_size(const std::string& spec);

// Byte offset of the first byte of the first invalid UTF-8 sequence of text (strict RFC 3629: no
// overlongs, surrogates or code points above U+10FFFF), or -1 when it is valid. Any thread.
int64_t first_invalid_utf8(std::string_view text);

struct SentencePieceTrainOptions {
  std::vector<std::string> inputs;  // globs of text files ("jsonl:GLOB" reads JSONL, with text_field)
  std::vector<std::string> exclude; // globs of files to skip
  std::string separator;            // document separator line (as data.separator)
  int64_t vocab_size = 8000;
  std::string out_model;            // path of the .model to write (a .vocab is written next to it)
  std::string model_type = "bpe";   // bpe | unigram
  std::string text_field = "text";  // jsonl inputs: the field holding the document
  int64_t max_sentences = 2000000;  // lines sampled for training (SentencePiece reads documents
                                    // line by line; "\n" is a piece of its own)
};
// Trains a SentencePiece model whose end-of-document piece is "<|eot|>" (a user-defined symbol,
// so eot() finds it) and that round-trips any UTF-8 text byte for byte (identity normalization,
// byte fallback). Main or any one thread (SentencePiece uses 2 threads inside). Throws
// std::runtime_error naming the option or file that is wrong (invalid UTF-8 with its byte offset).
void train_sentencepiece(const SentencePieceTrainOptions& opts);

}  // namespace trainer::data

// `deltadeck tokenizer train`: trains a SentencePiece model for data.tokenizer =
// "sentencepiece:F.model" from the same text sources (globs, exclude, separator) training reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace app {

struct TokenizerTrainArgs {
  std::vector<std::string> inputs;   // globs (text: by default; jsonl:GLOB also works)
  std::vector<std::string> exclude;  // globs of files to skip
  std::string separator = "%";       // as data.separator: "" = a document per file, "<blank>" = blank lines
  int64_t vocab_size = 0;
  std::string out;                   // F.model (F.vocab is written next to it)
  std::string model_type = "bpe";    // bpe | unigram
  bool force = false;                // replace an existing F.model (and F.vocab)
};

// Trains, reloads the model to check it, and prints one summary line; returns the exit code (2 when
// --out exists and --force was not given: runs that read that model would go on with other ids).
// The model and vocab are written under temporary names and renamed into place once checked.
// Main thread. Throws std::runtime_error (main prints it) for unreadable inputs or bad options.
int tokenizer_train(const TokenizerTrainArgs& args);

}  // namespace app

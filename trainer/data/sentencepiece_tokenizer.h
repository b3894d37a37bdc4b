// The SentencePiece tokenizer behind make_tokenizer("sentencepiece:PATH"); kept out of tokenizer.h
// so only sentencepiece_tokenizer.cpp includes <sentencepiece_processor.h>. No torch.
#pragma once

#include <memory>
#include <string>

#include "trainer/data/tokenizer.h"

namespace trainer::data {

// Loads a .model whose end-of-document piece is "<|eot|>". Any thread. Throws std::runtime_error
// naming path when it is missing, unreadable, not a model, or has no "<|eot|>" piece.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path);

}  // namespace trainer::data

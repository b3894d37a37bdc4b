// Text generation from a checkpoint: rebuild the model from the config the checkpoint carries,
// load its weights, and decode token by token with per-layer caches (GDN state + conv tails,
// MLA latents, attention K/V), so a DeltaNet layer's cost per token does not grow with context.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace trainer {

struct SampleOptions {
  std::string checkpoint;    // a step_XXXXXXXX directory, or a run directory (newest checkpoint)
  std::string prompt;        // empty: start a fresh document
  int64_t max_tokens = 256;  // tokens to generate; stops earlier at end-of-document
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k filter
  uint64_t seed = 0;
  int threads = 0;           // ATen CPU threads; 0 keeps the default
};

struct SampleStats {
  std::string checkpoint_dir;     // the checkpoint actually loaded
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  bool ended_document = false;    // stopped at the end-of-document token
  // The run trained on token files (llmc:, u16:, random:), whose tokenizer deltadeck does not have:
  // the prompt was read as token ids and on_text got ids, each after a space but the first.
  bool token_ids = false;
};

// Generates text; every decoded piece is passed to on_text as soon as it exists (the prompt is
// not echoed). Throws std::runtime_error naming the checkpoint path or the bad option. Any thread.
SampleStats sample_text(const SampleOptions& opts, const std::function<void(const std::string&)>& on_text);

}  // namespace trainer

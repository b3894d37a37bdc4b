// Sampling: checkpoint -> config -> model -> cached decode. The prompt is fed through the same
// step() as generation (no separate prefill path), which keeps one decode path to test.
#include "trainer/sample.h"

#include <torch/torch.h>

#include <cctype>
#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>

#include "model/decoder_lm.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/data/source.h"
#include "trainer/data/tokenizer.h"

namespace trainer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Picks the next token from logits [V] (fp32): temperature, then top-k, then a draw.
int64_t pick_token(const torch::Tensor& logits, double temperature, int64_t top_k) {
  if (temperature <= 0) return logits.argmax().item<int64_t>();
  auto z = logits / temperature;
  if (top_k > 0 && top_k < z.size(0)) {
    auto kth = std::get<0>(z.topk(top_k)).min();
    z = z.masked_fill(z < kth, -std::numeric_limits<float>::infinity());
  }
  return torch::multinomial(torch::softmax(z, 0), 1).item<int64_t>();
}

// Token files (llmc:, u16:, random:) hold ids of a tokenizer the run never had (GPT-2's, for llm.c
// shards): data.tokenizer would decode them as garbage, so such runs sample ids, not text.
bool trained_on_token_ids(const RunConfig& c) {
  if (c.data.train.empty()) return false;
  for (const std::string& src : c.data.train) {
    if (!data::is_token_source(src)) return false;
  }
  return true;
}

// "50256 464 3290" -> ids, each below the vocabulary size; errors name --prompt.
std::vector<int32_t> parse_prompt_ids(const std::string& text, int64_t vocab, const std::string& sources) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    const std::string word = text.substr(i, j - i);
    if (word.size() > 9 || word.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error("--prompt: this run trained on token files (" + sources +
                               "), whose tokenizer deltadeck does not have: give the prompt as token ids separated by "
                               "spaces, e.g. --prompt \"50256 464\" (got '" + word + "')");
    const int64_t id = std::stoll(word);
    if (id >= vocab)
      throw std::runtime_error("--prompt: token id " + word + " is not below the model's vocabulary size " +
                               std::to_string(vocab));
    ids.push_back(static_cast<int32_t>(id));
    i = j;
  }
  return ids;
}

}  // namespace

SampleStats sample_text(const SampleOptions& o, const std::function<void(const std::string&)>& on_text) {
  if (o.max_tokens < 1) throw std::runtime_error("--max-tokens: must be >= 1 (got " + std::to_string(o.max_tokens) + ")");
  if (o.temperature < 0) throw std::runtime_error("--temperature: must be >= 0 (got " + std::to_string(o.temperature) + ")");
  if (o.top_k < 0) throw std::runtime_error("--top-k: must be >= 0 (got " + std::to_string(o.top_k) + ")");
  if (o.threads > 0) at::set_num_threads(o.threads);

  SampleStats st;
  st.checkpoint_dir = find_checkpoint(o.checkpoint);
  auto ck = load_checkpoint(st.checkpoint_dir);
  if (ck.config_toml.empty())
    throw std::runtime_error(st.checkpoint_dir + "/model.safetensors: carries no run config (written by an older "
                             "deltadeck); retrain or resume once to write a checkpoint that does");
  auto parsed = parse_config(ck.config_toml, st.checkpoint_dir + " (embedded config)", {});
  if (!parsed.ok()) throw std::runtime_error(st.checkpoint_dir + ": embedded config is invalid: " + parsed.errors[0]);
  RunConfig cfg = parsed.config;
  // The run's tokenizer (a SentencePiece .model is read from the path the run used), or token ids.
  st.token_ids = trained_on_token_ids(cfg);
  std::unique_ptr<data::Tokenizer> tok;
  if (!st.token_ids) tok = data::make_tokenizer(cfg.data.tokenizer);
  const int64_t eot = st.token_ids ? cfg.data.eot_token : tok->eot();
  std::vector<int32_t> prompt;
  if (st.token_ids && !o.prompt.empty()) {
    std::string sources;
    for (const std::string& src : cfg.data.train) sources += (sources.empty() ? "" : ", ") + src;
    prompt = parse_prompt_ids(o.prompt, cfg.model.vocab_size, "data.train = " + sources);
  } else if (!o.prompt.empty()) {
    tok->encode(o.prompt, prompt, "--prompt");
  }
  if (prompt.empty()) prompt.push_back(static_cast<int32_t>(eot));  // a fresh document follows an end-of-document
  // RoPE tables are rebuilt, not stored: size them for the whole generation.
  cfg.model.max_seq_len = std::max<int64_t>(cfg.model.max_seq_len, static_cast<int64_t>(prompt.size()) + o.max_tokens);

  model::DecoderLM m(cfg.model);
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> by_name(ck.weights.begin(), ck.weights.end());
    for (auto& item : m->named_parameters()) {
      auto it = by_name.find(item.key());
      if (it == by_name.end())
        throw std::runtime_error(st.checkpoint_dir + "/model.safetensors: no tensor '" + item.key() + "'");
      if (it->second.sizes() != item.value().sizes())
        throw std::runtime_error(st.checkpoint_dir + "/model.safetensors: '" + item.key() + "' has shape " +
                                 c10::str(it->second.sizes()) + ", the model needs " + c10::str(item.value().sizes()));
      item.value().copy_(it->second);
    }
  }
  m->eval();
  torch::manual_seed(o.seed);
  torch::NoGradGuard no_grad;
  auto state = m->new_decode_state();
  auto feed = [&](int64_t id) { return m->step(torch::full({1, 1}, id, torch::kInt64), state)[0][0]; };

  auto t0 = Clock::now();
  torch::Tensor logits;
  for (int32_t id : prompt) logits = feed(id);
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  st.prefill_s = seconds_since(t0);

  t0 = Clock::now();
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const int64_t next = pick_token(logits, o.temperature, o.top_k);
    ++st.generated_tokens;
    if (next == eot) {
      st.ended_document = true;
      break;
    }
    // Ids are separated by spaces, and from the prompt's when one was given.
    if (st.token_ids) on_text((i == 0 && o.prompt.empty() ? "" : " ") + std::to_string(next));
    else on_text(tok->decode({static_cast<int32_t>(next)}));
    if (i + 1 < o.max_tokens) logits = feed(next);
  }
  st.decode_s = seconds_since(t0);
  return st;
}

}  // namespace trainer

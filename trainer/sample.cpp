// Sampling: checkpoint -> config -> model -> cached decode. The prompt is fed through the same
// step() as generation (no separate prefill path), which keeps one decode path to test.
#include "trainer/sample.h"

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <stdexcept>

#include "model/decoder_lm.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
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
  // The run's tokenizer (a SentencePiece .model is read from the path the run used).
  auto tok_ptr = data::make_tokenizer(cfg.data.tokenizer);
  const data::Tokenizer& tok = *tok_ptr;
  std::vector<int32_t> prompt;
  if (o.prompt.empty()) prompt.push_back(tok.eot());  // a fresh document follows an end-of-document
  else tok.encode(o.prompt, prompt, "--prompt");
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
    if (next == tok.eot()) {
      st.ended_document = true;
      break;
    }
    on_text(tok.decode({static_cast<int32_t>(next)}));
    if (i + 1 < o.max_tokens) logits = feed(next);
  }
  st.decode_s = seconds_since(t0);
  return st;
}

}  // namespace trainer

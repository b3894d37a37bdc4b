// Session: the run's thread lifecycle, and resolve_config (what this build can run).
#include "trainer/session.h"

#include <thread>

#include "trainer/data/source.h"
#include "trainer/data/tokenizer.h"
#include "trainer/train_loop.h"

namespace trainer {

namespace {

bool is_token_source(const std::string& spec) { return spec.rfind("llmc:", 0) == 0 || spec.rfind("u16:", 0) == 0; }

}  // namespace

std::vector<std::string> resolve_config(RunConfig& cfg) {
  std::vector<std::string> errors;
  std::vector<std::pair<std::string, std::string>> sources;  // (key, spec)
  for (size_t i = 0; i < cfg.data.train.size(); ++i)
    sources.emplace_back("data.train[" + std::to_string(i) + "]", cfg.data.train[i]);
  for (size_t i = 0; i < cfg.data.val_sources.size(); ++i)
    sources.emplace_back("data.val[" + std::to_string(i) + "]", cfg.data.val_sources[i]);
  bool any_text = false, any_tokens = false;
  for (const auto& [key, spec] : sources) (is_token_source(spec) ? any_tokens : any_text) = true;

  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::make_tokenizer(cfg.data.tokenizer);
    const int64_t tok_vocab = tok->vocab_size();
    if (cfg.model.vocab_size == 0 && any_tokens) {
      errors.push_back("model.vocab_size: required with token sources (llmc:, u16:), which carry no tokenizer; e.g. "
                       "50304 for GPT-2 shards");
    } else if (cfg.model.vocab_size == 0) {
      cfg.model.vocab_size = tok_vocab;
    } else if (any_text && cfg.model.vocab_size < tok_vocab) {
      errors.push_back("model.vocab_size: " + std::to_string(cfg.model.vocab_size) + " is smaller than the " +
                       "tokenizer's vocabulary (" + std::to_string(tok_vocab) + " for data.tokenizer = \"" +
                       cfg.data.tokenizer + "\")");
    }
  } catch (const std::exception& e) {
    errors.push_back(e.what());
  }
  if (cfg.train.precision != "fp32")
    errors.push_back("train.precision: \"" + cfg.train.precision + "\" is not available in this build yet (use \"fp32\")");
  if (cfg.run.devices != "auto" && cfg.run.devices != "cpu")
    errors.push_back("run.devices: \"" + cfg.run.devices + "\" is not available in this build yet (use \"auto\" or \"cpu\")");
  if (!errors.empty() || !tok) return errors;
  // Open (index and check) every source now, so bad data stops the run before anything is
  // written: wrong magic, truncation, token ids >= vocab, invalid UTF-8... The loader indexes them
  // again on the worker thread.
  for (const auto& [key, spec] : sources) {
    try {
      data::open_source(spec, data::source_options(cfg.data, cfg.model.vocab_size, key), *tok);
    } catch (const std::exception& e) {
      errors.push_back(e.what());
    }
  }
  return errors;
}

struct Session::Impl {
  RunConfig cfg;
  SessionOptions opts;
  Channel<Event> events{4096};
  Channel<Command> commands{64};
  std::thread worker;
};

Session::Session(RunConfig cfg, SessionOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(cfg);
  impl_->opts = std::move(opts);
}

Session::~Session() {
  if (impl_->worker.joinable()) {
    impl_->commands.try_push(Command::Stop);
    impl_->commands.close();
    // Nobody may be draining events any more: closing lets a blocked push return.
    impl_->events.close();
    impl_->worker.join();
  }
}

void Session::start() {
  impl_->worker = std::thread([this] { run_training(impl_->cfg, impl_->opts, impl_->events, impl_->commands); });
}

Channel<Event>& Session::events() { return impl_->events; }

void Session::send(Command c) { impl_->commands.push(c); }

void Session::join() {
  if (impl_->worker.joinable()) impl_->worker.join();
}

}  // namespace trainer

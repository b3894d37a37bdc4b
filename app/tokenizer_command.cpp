// The model is reloaded through make_tokenizer after training, so a model that this command
// reports as written is one `data.tokenizer` accepts.
#include "app/tokenizer_command.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "storage/file_util.h"
#include "trainer/data/tokenizer.h"

namespace app {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int tokenizer_train(const TokenizerTrainArgs& args) {
  // A model that runs already read must not change under them: replacing one takes --force.
  const std::string vocab_out = ends_with(args.out, ".model") ? args.out.substr(0, args.out.size() - 6) + ".vocab" : "";
  if (!args.force && storage::files::exists(args.out)) {
    std::fprintf(stderr,
                 "deltadeck: tokenizer train --out: %s exists; runs that read it would go on with other token ids. "
                 "Pass --force to replace it\n",
                 args.out.c_str());
    return 2;
  }
  trainer::data::SentencePieceTrainOptions o;
  o.inputs = args.inputs;
  o.exclude = args.exclude;
  o.separator = args.separator;
  o.vocab_size = args.vocab_size;
  // Written as F.tmp.model and F.tmp.vocab, checked, then renamed: a failed or interrupted training
  // leaves an existing model whole.
  o.out_model = ends_with(args.out, ".model") ? args.out.substr(0, args.out.size() - 6) + ".tmp.model" : args.out;
  o.model_type = args.model_type;
  const auto t0 = std::chrono::steady_clock::now();
  trainer::data::train_sentencepiece(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string tmp_vocab = o.out_model.substr(0, o.out_model.size() - 6) + ".vocab";
  auto discard = [&] {
    std::remove(o.out_model.c_str());
    std::remove(tmp_vocab.c_str());
  };
  std::unique_ptr<trainer::data::Tokenizer> tok;
  try {
    tok = trainer::data::make_tokenizer("sentencepiece:" + o.out_model);
  } catch (...) {
    discard();
    throw;
  }
  if (std::rename(o.out_model.c_str(), args.out.c_str()) != 0 ||
      (storage::files::exists(tmp_vocab) && std::rename(tmp_vocab.c_str(), vocab_out.c_str()) != 0)) {
    std::fprintf(stderr, "deltadeck: tokenizer train --out: cannot rename %s into %s (%s)\n", o.out_model.c_str(),
                 args.out.c_str(), std::strerror(errno));
    discard();
    return 1;
  }
  std::printf("%s: %s, vocab %lld, <|eot|> = %d, trained in %.1f s\n"
              "use it with: data.tokenizer = \"sentencepiece:%s\"\n",
              args.out.c_str(), args.model_type.c_str(), static_cast<long long>(tok->vocab_size()), tok->eot(), s,
              args.out.c_str());
  return 0;
}

}  // namespace app

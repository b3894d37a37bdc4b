// The model is reloaded through make_tokenizer after training, so a model that this command
// reports as written is one `data.tokenizer` accepts.
#include "app/tokenizer_command.h"

#include <chrono>
#include <cstdio>

#include "trainer/data/tokenizer.h"

namespace app {

int tokenizer_train(const TokenizerTrainArgs& args) {
  trainer::data::SentencePieceTrainOptions o;
  o.inputs = args.inputs;
  o.exclude = args.exclude;
  o.separator = args.separator;
  o.vocab_size = args.vocab_size;
  o.out_model = args.out;
  o.model_type = args.model_type;
  const auto t0 = std::chrono::steady_clock::now();
  trainer::data::train_sentencepiece(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto tok = trainer::data::make_tokenizer("sentencepiece:" + args.out);
  std::printf("%s: %s, vocab %lld, <|eot|> = %d, trained in %.1f s\n"
              "use it with: data.tokenizer = \"sentencepiece:%s\"\n",
              args.out.c_str(), args.model_type.c_str(), static_cast<long long>(tok->vocab_size()), tok->eot(), s,
              args.out.c_str());
  return 0;
}

}  // namespace app

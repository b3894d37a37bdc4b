// The benchmark times whole fwd+bwd passes of the layer (projections, conv, gates, core, gated
// norm) so the figure is what training pays, and reports the best of N after one warm-up run.
#include "app/bench_command.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "model/gated_deltanet.h"
#include "model/model_config.h"
#include "trainer/data/loader.h"
#include "trainer/data/tokenizer.h"

namespace app {

namespace {

double time_fwd_bwd(model::GatedDeltaNet& layer, const torch::Tensor& u, const model::Positions& p, int repeats) {
  double best = 1e30;
  for (int r = 0; r <= repeats; ++r) {  // r == 0 is the warm-up
    auto x = u.detach().requires_grad_(true);
    const auto t0 = std::chrono::steady_clock::now();
    layer->forward(x, p).sum().backward();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
    layer->zero_grad();
  }
  return best;
}

}  // namespace

int bench_model(const BenchModelArgs& a) {
  auto c = model::make_preset(a.preset, model::Family::Hybrid);
  if (!c) {
    std::cerr << "deltadeck: --preset: unknown preset \"" << a.preset << "\"\n";
    return 2;
  }
  if (a.repeats < 1) {
    std::cerr << "deltadeck: --repeats: must be >= 1\n";
    return 2;
  }
  for (int64_t T : a.lengths) {
    if (T < 1) {
      std::cerr << "deltadeck: --lengths: every length must be >= 1 (got " << T << ")\n";
      return 2;
    }
  }
  if (a.threads > 0) at::set_num_threads(a.threads);
  torch::manual_seed(0);
  model::GatedDeltaNet layer(*c);
  std::printf("Gated DeltaNet layer, preset %s: d=%lld H=%lld dk=%lld dv=%lld C=%lld, B=1, fp32, CPU, %d ATen threads\n",
              a.preset.c_str(), static_cast<long long>(c->d), static_cast<long long>(c->gdn_heads),
              static_cast<long long>(c->gdn_dk), static_cast<long long>(c->gdn_dv),
              static_cast<long long>(c->gdn_chunk), at::get_num_threads());
  std::printf("forward+backward, best of %d:\n", a.repeats);
  std::printf("%8s %14s %14s %9s %16s\n", "T", "chunked ms", "recurrent ms", "speedup", "chunked us/tok");
  for (int64_t T : a.lengths) {
    auto u = torch::randn({1, T, c->d});
    auto p = model::dense_positions(1, T, torch::kCPU);
    layer->use_reference = false;
    const double chunked = time_fwd_bwd(layer, u, p, a.repeats);
    layer->use_reference = true;
    const double recurrent = time_fwd_bwd(layer, u, p, a.repeats);
    std::printf("%8lld %14.2f %14.2f %8.1fx %16.2f\n", static_cast<long long>(T), chunked * 1e3, recurrent * 1e3,
                recurrent / chunked, chunked * 1e6 / static_cast<double>(T));
    std::fflush(stdout);
  }
  return 0;
}

int bench_data(const BenchDataArgs& a) {
  // --seconds inf would pass "> 0" and never end.
  const bool seconds_ok = a.seconds > 0 && std::isfinite(a.seconds);
  if (a.sources.empty() || a.threads < 1 || a.seq_len < 1 || a.batch_size < 1 || !seconds_ok) {
    std::cerr << "deltadeck: bench data needs --source, --threads, --seq-len and --batch >= 1, and a finite "
                 "--seconds > 0\n";
    return 2;
  }
  trainer::RunConfig cfg;
  cfg.data.train = a.sources;
  cfg.data.exclude = a.exclude;
  cfg.data.separator = a.separator;
  cfg.data.eot_token = a.eot_token;
  cfg.data.tokenizer = a.tokenizer;
  cfg.data.val_fraction = 0;
  cfg.data.loader_threads = a.threads;
  cfg.data.prefetch = 8;
  cfg.train.seq_len = a.seq_len;
  cfg.train.batch_size = a.batch_size;
  bool token_source = false;
  for (const auto& s : a.sources) token_source = token_source || s.rfind("llmc:", 0) == 0 || s.rfind("u16:", 0) == 0;
  try {
    cfg.model.vocab_size = a.vocab_size > 0 ? a.vocab_size
                                            : (token_source ? 65536 : trainer::data::tokenizer_vocab_size(a.tokenizer));
    const auto t0 = std::chrono::steady_clock::now();
    trainer::data::Loader loader(cfg, 0, 1, "");
    const double open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("sources indexed in %.2f s: %lld documents; tokenizer %s, %lld producer threads, batches %lld x %lld\n",
                open_s, static_cast<long long>(loader.stats().train_documents), a.tokenizer.c_str(),
                static_cast<long long>(a.threads), static_cast<long long>(a.batch_size), static_cast<long long>(a.seq_len));
    // Warm-up: the first batch includes thread start-up.
    double wait = 0;
    loader.next(&wait);
    int64_t tokens = 0, batches = 0;
    const auto t1 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < a.seconds) {
      auto b = loader.next(&wait);
      tokens += b.inputs.numel();
      ++batches;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
    std::printf("%lld batches, %lld tokens in %.2f s: %.2f M tokens/s\n", static_cast<long long>(batches),
                static_cast<long long>(tokens), elapsed, static_cast<double>(tokens) / elapsed / 1e6);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace app

// The benchmark times whole fwd+bwd passes of the layer (projections, conv, gates, core, gated
// norm) so the figure is what training pays, and reports the best of N after one warm-up run.
#include "app/bench_command.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "model/gated_deltanet.h"
#include "model/model_config.h"

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

}  // namespace app

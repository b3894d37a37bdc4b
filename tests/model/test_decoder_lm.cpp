// Whole models against MODEL.md §11: parameter counts of every preset (13), causality of every
// mixer and model (10), packed = separate (11), initialisation (15), initial loss (16), the
// overfit smoke test (17), cached decoding (19), and activation checkpointing (same gradients).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "model/decoder_lm.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;

using model::Family;

model::ModelConfig preset(const std::string& name, Family f) { return *model::make_preset(name, f); }

struct Named {
  std::string name;
  model::ModelConfig cfg;
};

// The three tiny models every whole-model test covers.
std::vector<Named> tiny_models() {
  return {{"hybrid", preset("tiny", Family::Hybrid)},
          {"gpt", preset("tiny", Family::Gpt)},
          {"tiny-moe", preset("tiny-moe", Family::Hybrid)}};
}

}  // namespace

TEST(DecoderLM, ParameterCountsOfEveryPreset) {
  // MODEL.md §8 table: {preset, family} -> {total, active}.
  const std::map<std::pair<std::string, Family>, std::pair<int64_t, int64_t>> table = {
      {{"tiny", Family::Hybrid}, {2072976, 2072976}},
      {{"tiny", Family::Gpt}, {1705600, 1705600}},
      {{"tiny-moe", Family::Hybrid}, {3848592, 2079120}},
      {{"tiny-moe", Family::Gpt}, {3481216, 1711744}},
      {{"small", Family::Hybrid}, {24290200, 24290200}},
      {{"small", Family::Gpt}, {23204736, 23204736}},
      {{"base", Family::Hybrid}, {125115232, 125115232}},
      {{"base", Family::Gpt}, {117197568, 117197568}},
      {{"moe-1b", Family::Hybrid}, {1063924368, 242889360}},
      {{"moe-1b", Family::Gpt}, {1016239104, 195204096}},
  };
  for (const auto& [key, expected] : table) {
    const auto& [name, family] = key;
    auto c = preset(name, family);
    EXPECT_EQ(model::count_params(c), expected.first) << name << " " << model::family_name(family);
    EXPECT_EQ(model::count_active_params(c), expected.second) << name << " " << model::family_name(family);
    model::DecoderLM m(c);
    EXPECT_EQ(numel_sum(*m), expected.first) << name << " " << model::family_name(family);
  }
}

TEST(DecoderLM, HybridPatternPlacesMixers) {
  model::DecoderLM m(preset("tiny", Family::Hybrid));
  std::string kinds;
  for (auto& b : *m->blocks) kinds += b->as<model::BlockImpl>()->mixer_kind();
  EXPECT_EQ(kinds, "GGAGGA");
  auto names = m->named_parameters();
  EXPECT_TRUE(names.contains("blocks.0.gdn.A_log"));
  EXPECT_TRUE(names.contains("blocks.2.mla.wkv_a.weight"));
  EXPECT_FALSE(names.contains("blocks.2.gdn.A_log"));
}

TEST(DecoderLM, CausalEveryModelFp32AndFp64) {
  for (const auto& [name, cfg] : tiny_models()) {
    for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
      torch::manual_seed(7);
      model::DecoderLM m(cfg);
      m->to(dtype);
      torch::NoGradGuard no_grad;
      const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-12;
      auto tokens = torch::randint(0, cfg.vocab_size, {1, 150}, torch::kInt64);
      auto z = m->forward(tokens);
      for (int64_t t : {0, 63, 64, 100}) {
        auto changed = tokens.clone();
        changed.narrow(1, t + 1, 150 - t - 1).random_(0, cfg.vocab_size);
        auto z2 = m->forward(changed);
        EXPECT_LE(max_abs_diff(z.narrow(1, 0, t + 1), z2.narrow(1, 0, t + 1)), tol) << name << " t=" << t;
        // The test could fail: a position after t must see the change.
        EXPECT_GT(max_abs_diff(z.narrow(1, t + 1, 1), z2.narrow(1, t + 1, 1)), 0.0) << name << " t=" << t;
      }
    }
  }
}

TEST(DecoderLM, PackedEqualsSeparateDocuments) {
  const std::vector<int64_t> cu = {0, 5, 69, 70, 200};
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(11);
    model::DecoderLM m(cfg);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, cfg.vocab_size, {1, 200}, torch::kInt64);
    auto packed = m->forward_packed(tokens, torch::tensor(cu, torch::kInt64));
    double worst = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      auto doc = tokens.narrow(1, cu[n], cu[n + 1] - cu[n]);
      auto alone = m->forward(doc);
      worst = std::max(worst, max_abs_diff(packed.narrow(1, cu[n], cu[n + 1] - cu[n]), alone));
    }
    EXPECT_LE(worst, 1e-5) << name;
    // The same row without boundaries differs: the packing is what isolates the documents.
    EXPECT_GT(max_abs_diff(m->forward(tokens), packed), 1e-3) << name;
  }
}

// A packed batch of several rows: cu_seqlens over the flattened B*T tokens, cut at the row end.
TEST(DecoderLM, PackedRowsEqualSeparateDocuments) {
  const std::vector<int64_t> cu = {0, 30, 100, 101, 140, 200};  // rows of T=100: [0,100) and [100,200)
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(12);
    model::DecoderLM m(cfg);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, cfg.vocab_size, {2, 100}, torch::kInt64);
    auto packed = m->forward_packed(tokens, torch::tensor(cu, torch::kInt32)).reshape({200, -1});
    auto flat = tokens.reshape({1, 200});
    double worst = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      auto alone = m->forward(flat.narrow(1, cu[n], cu[n + 1] - cu[n]))[0];
      worst = std::max(worst, max_abs_diff(packed.narrow(0, cu[n], cu[n + 1] - cu[n]), alone));
    }
    EXPECT_LE(worst, 1e-5) << name;
  }
  // A piece that crosses the row end is refused.
  model::DecoderLM m(tiny_models()[0].cfg);
  auto tokens = torch::randint(0, 100, {2, 100}, torch::kInt64);
  EXPECT_THROW(m->forward_packed(tokens, torch::tensor(std::vector<int64_t>{0, 150, 200})), c10::Error);
}

TEST(DecoderLM, InitialLossNearLnV) {
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(3);
    model::DecoderLM m(cfg);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, cfg.vocab_size, {4, 128}, torch::kInt64);
    auto targets = torch::randint(0, cfg.vocab_size, {4, 128}, torch::kInt64);
    const double ce = m->loss_parts(tokens, targets).ce.item<double>();
    EXPECT_LT(std::abs(ce - std::log(static_cast<double>(cfg.vocab_size))), 0.1) << name << " ce=" << ce;
  }
}

TEST(DecoderLM, InitialisationStatistics) {
  auto c = preset("small", Family::Hybrid);  // large enough matrices for a ±5% std check
  torch::manual_seed(5);
  model::DecoderLM m(c);
  const double std0 = 0.02, std_out = 0.02 / std::sqrt(2.0 * c.n_layers);
  for (const auto& item : m->named_parameters()) {
    const auto& name = item.key();
    const auto& p = item.value();
    const bool is_norm = name.find("norm") != std::string::npos && p.dim() == 1;
    if (is_norm) {
      EXPECT_TRUE(torch::all(p == 1).item<bool>()) << name;
      continue;
    }
    if (p.dim() != 2 || p.numel() < 20000 || name.find("conv_") != std::string::npos) continue;
    const double s = p.std().item<double>();
    auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool residual_out = ends_with(".wo.weight") || ends_with(".down.weight");
    const double want = residual_out ? std_out : std0;
    EXPECT_NEAR(s, want, 0.05 * want) << name;
  }
  torch::manual_seed(5);
  model::DecoderLM again(c);
  auto a = m->named_parameters(), b = again->named_parameters();
  for (const auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
}

TEST(DecoderLM, OverfitsOneBatch) {
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(1);
    model::DecoderLM m(cfg);
    auto data = torch::randint(0, cfg.vocab_size, {2, 129}, torch::kInt64);
    auto x = data.narrow(1, 0, 128), y = data.narrow(1, 1, 128);
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
    double best_late = 1e9;
    for (int step = 1; step <= 300; ++step) {
      opt.zero_grad();
      auto loss = m->loss(x, y);
      loss.backward();
      opt.step();
      const double v = loss.item<double>();
      ASSERT_TRUE(std::isfinite(v)) << name << " step " << step;
      if (step >= 250) best_late = std::min(best_late, v);
    }
    EXPECT_LT(best_late, 0.5) << name;
  }
}

TEST(DecoderLM, CachedDecodeEqualsFullForward) {
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(9);
    model::DecoderLM m(cfg);
    m->eval();
    torch::NoGradGuard no_grad;
    const int64_t T = 70;  // crosses a GDN chunk boundary (C = 64)
    auto tokens = torch::randint(0, cfg.vocab_size, {2, T}, torch::kInt64);
    auto full = m->forward(tokens);
    auto state = m->new_decode_state();
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
      auto z = m->step(tokens.narrow(1, t, 1), state);
      worst = std::max(worst, max_abs_diff(z, full.narrow(1, t, 1)));
    }
    EXPECT_LE(worst, 1e-4) << name;
  }
}

TEST(DecoderLM, ActivationCheckpointingGivesSameGradients) {
  for (auto [name, cfg] : tiny_models()) {
    std::map<std::string, torch::Tensor> grads[2];
    double losses[2];
    for (int ck = 0; ck < 2; ++ck) {
      cfg.activation_checkpointing = ck == 1;
      torch::manual_seed(21);
      model::DecoderLM m(cfg);
      m->to(torch::kFloat64);
      auto tokens = torch::randint(0, cfg.vocab_size, {2, 40}, torch::kInt64);
      auto targets = torch::randint(0, cfg.vocab_size, {2, 40}, torch::kInt64);
      auto loss = m->loss(tokens, targets);
      loss.backward();
      losses[ck] = loss.item<double>();
      for (const auto& item : m->named_parameters()) {
        ASSERT_TRUE(item.value().grad().defined()) << name << " " << item.key() << " ck=" << ck;
        grads[ck][item.key()] = item.value().grad().clone();
      }
    }
    EXPECT_EQ(losses[0], losses[1]) << name;
    for (const auto& [k, g] : grads[0]) EXPECT_LE(max_abs_diff(g, grads[1][k]), 1e-12) << name << " " << k;
  }
}

TEST(DecoderLM, MoeAuxLossIsReportedAndAdded) {
  torch::manual_seed(2);
  auto cfg = preset("tiny-moe", Family::Hybrid);
  model::DecoderLM m(cfg);
  auto tokens = torch::randint(0, cfg.vocab_size, {2, 32}, torch::kInt64);
  auto parts = m->loss_parts(tokens, tokens);
  // Six MoE layers, each near α = 0.01 at a near-uniform router.
  EXPECT_NEAR(parts.aux.item<double>(), 6 * 0.01, 0.02);
  EXPECT_NEAR(parts.total.item<double>(), parts.ce.item<double>() + parts.aux.item<double>(), 1e-6);
  model::DecoderLM dense(preset("tiny", Family::Hybrid));
  EXPECT_EQ(dense->loss_parts(tokens, tokens).aux.item<double>(), 0.0);
}

TEST(DecoderLM, GptMixerAloneIsCausal) {
  auto c = preset("tiny", Family::Gpt);
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::manual_seed(4);
    model::Attention attn(c);
    attn->to(dtype);
    torch::NoGradGuard no_grad;
    auto u = torch::randn({2, 150, c.d}, torch::TensorOptions().dtype(dtype));
    auto p = model::dense_positions(2, 150, torch::kCPU);
    auto y = attn(u, p);
    for (int64_t t : {0, 63, 64, 100}) {
      auto u2 = u.clone();
      u2.narrow(1, t + 1, 150 - t - 1).normal_();
      auto y2 = attn(u2, p);
      EXPECT_LE(max_abs_diff(y.narrow(1, 0, t + 1), y2.narrow(1, 0, t + 1)), dtype == torch::kFloat32 ? 1e-6 : 1e-12);
    }
  }
}

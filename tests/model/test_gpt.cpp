// The GPT baseline against MODEL.md: shapes, parameter count (§9), causality (§11.10), initial
// loss (§11.16), RoPE golden vector and relative-position property (§11.7), RMSNorm against the
// kernels' plain reference, init statistics (§11.15).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "kernels/rmsnorm.h"
#include "model/decoder_lm.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;

model::ModelConfig tiny_gpt(int64_t vocab) {
  auto c = *model::make_preset("tiny", model::Family::Gpt);
  c.vocab_size = vocab;
  return c;
}

}  // namespace

TEST(Gpt, LogitsShape) {
  torch::manual_seed(42);
  model::DecoderLM m(tiny_gpt(257));
  auto tokens = torch::randint(0, 257, {2, 37}, torch::kInt64);
  auto z = m->forward(tokens);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{2, 37, 257}));
  EXPECT_EQ(z.scalar_type(), torch::kFloat32);
}

TEST(Gpt, ParameterCountMatchesFormula) {
  for (int64_t vocab : {4096, 257}) {
    auto c = tiny_gpt(vocab);
    model::DecoderLM m(c);
    EXPECT_EQ(numel_sum(*m), model::count_params(c)) << "vocab " << vocab;
  }
  // MODEL.md §8: the tiny GPT has 1,705,600 parameters.
  model::DecoderLM m(tiny_gpt(4096));
  EXPECT_EQ(numel_sum(*m), 1705600);
  auto untied = tiny_gpt(4096);
  untied.tie_embeddings = false;
  model::DecoderLM mu(untied);
  EXPECT_EQ(numel_sum(*mu), model::count_params(untied));
  EXPECT_EQ(numel_sum(*mu), 1705600 + 4096 * 128);
}

TEST(Gpt, CausalFp32AndFp64) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::manual_seed(42);
    auto c = tiny_gpt(257);
    model::DecoderLM m(c);
    m->to(dtype);
    const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-12;
    auto tokens = torch::randint(0, 257, {1, 150}, torch::kInt64);
    torch::NoGradGuard ng;
    auto base = m->forward(tokens);
    for (int64_t t : {0, 63, 64, 100}) {
      auto changed = tokens.clone();
      changed.narrow(1, t + 1, 150 - t - 1).random_(0, 257);
      auto out = m->forward(changed);
      const double diff = (out.narrow(1, 0, t + 1) - base.narrow(1, 0, t + 1)).abs().max().item<double>();
      EXPECT_LE(diff, tol) << "t=" << t << " dtype " << dtype;
      // And the change is visible after t (the test can fail).
      EXPECT_GT((out.narrow(1, t + 1, 149 - t) - base.narrow(1, t + 1, 149 - t)).abs().max().item<double>(), 1e-6);
    }
  }
}

TEST(Gpt, InitialLossIsLogVocab) {
  torch::manual_seed(42);
  model::DecoderLM m(tiny_gpt(4096));
  auto x = torch::randint(0, 4096, {4, 256}, torch::kInt64);
  auto y = torch::randint(0, 4096, {4, 256}, torch::kInt64);
  torch::NoGradGuard ng;
  const double loss = m->loss(x, y).item<double>();
  EXPECT_LT(std::abs(loss - std::log(4096.0)), 0.1) << loss;
}

TEST(Gpt, LossIgnoresMinusOne) {
  torch::manual_seed(42);
  model::DecoderLM m(tiny_gpt(257));
  auto x = torch::randint(0, 257, {1, 16}, torch::kInt64);
  auto y = torch::randint(0, 257, {1, 16}, torch::kInt64);
  torch::NoGradGuard ng;
  auto y_masked = y.clone();
  y_masked.narrow(1, 8, 8).fill_(-1);
  auto z = m->forward(x);
  auto expected = torch::nn::functional::cross_entropy(z.narrow(1, 0, 8).reshape({-1, 257}), y.narrow(1, 0, 8).reshape({-1}));
  EXPECT_NEAR(m->loss(x, y_masked).item<double>(), expected.item<double>(), 1e-6);
}

TEST(Rope, GoldenVector) {
  auto t = model::make_rope_tables(4, 8, 1e4);
  auto x = torch::tensor({1.0, 2.0, 3.0, 4.0}, torch::kFloat64).view({1, 1, 1, 4});
  auto pos = torch::ones({1, 1}, torch::kInt64);
  auto y = model::apply_rope(x, pos, t).view({4});
  const double golden[4] = {-1.9841107, 1.9599007, 2.4623779, 4.0197997};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i].item<double>(), golden[i], 1e-6);
}

TEST(Rope, DotProductDependsOnlyOnOffset) {
  torch::manual_seed(42);
  auto t = model::make_rope_tables(16, 64, 1e4);
  auto q = torch::randn({1, 1, 1, 16}, torch::kFloat64), k = torch::randn({1, 1, 1, 16}, torch::kFloat64);
  auto at = [&](const torch::Tensor& x, int64_t p) {
    return model::apply_rope(x, torch::full({1, 1}, p, torch::kInt64), t);
  };
  const double a = (at(q, 5) * at(k, 2)).sum().item<double>();
  const double b = (at(q, 5 + 17) * at(k, 2 + 17)).sum().item<double>();
  EXPECT_NEAR(a, b, 1e-10);
}

TEST(RmsNorm, MatchesPlainReference) {
  torch::manual_seed(42);
  for (int64_t C : {60, 128, 257}) {
    model::RMSNorm norm(C, /*affine=*/true);
    {
      torch::NoGradGuard ng;
      norm->weight.uniform_(0.5, 1.5);
    }
    auto x = torch::randn({7, C});
    auto y = norm->forward(x).contiguous();
    auto ref = torch::full({7, C}, NAN);
    kernels::rmsnorm_forward_ref(ref.data_ptr<float>(), x.data_ptr<float>(), norm->weight.data_ptr<float>(), 7, C, 1e-6);
    EXPECT_LE((y - ref).abs().max().item<double>(), 1e-5) << "C=" << C;
  }
}

TEST(Gpt, InitStatistics) {
  torch::manual_seed(42);
  auto c = tiny_gpt(4096);
  model::DecoderLM m(c);
  const double std_out = 0.02 / std::sqrt(2.0 * c.n_layers);
  EXPECT_NEAR(m->emb->weight.std().item<double>(), 0.02, 0.02 * 0.05);
  for (const auto& item : m->named_parameters()) {
    const auto& name = item.key();
    const auto& p = item.value();
    if (name.find("norm") != std::string::npos) {
      EXPECT_TRUE(torch::all(p == 1).item<bool>()) << name;
    } else if (p.numel() >= 16384) {
      const bool out_proj = name.find(".wo.") != std::string::npos || name.find(".down.") != std::string::npos;
      const double expected = out_proj ? std_out : 0.02;
      EXPECT_NEAR(p.std().item<double>(), expected, expected * 0.05) << name;
    }
  }
  // Same seed, same parameters.
  torch::manual_seed(42);
  model::DecoderLM m2(c);
  auto p1 = m->parameters(), p2 = m2->parameters();
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(torch::equal(p1[i], p2[i]));
}

TEST(Gpt, RejectsUnknownMixer) {
  auto c = tiny_gpt(257);
  c.pattern = "GXA";
  EXPECT_THROW(model::DecoderLM{c}, std::invalid_argument);
}

// MODEL.md §11.9: GQA equals attention with K/V heads repeat-interleaved, written out by hand
// (projections, RoPE, QK-norm, masked softmax); with nkv = nh it is plain multi-head attention.
TEST(Gpt, GroupedQueryAttentionMatchesExplicitRepeat) {
  for (int64_t nkv : {2, 4}) {
    auto c = tiny_gpt(257);
    c.attn_kv_heads = nkv;
    torch::manual_seed(8);
    model::Attention attn(c);
    torch::NoGradGuard ng;
    const int64_t B = 2, T = 37, nh = c.attn_heads, dh = c.attn_head_dim;
    auto u = torch::randn({B, T, c.d});
    auto p = model::dense_positions(B, T, torch::kCPU);
    auto y = attn(u, p);

    auto tables = model::make_rope_tables(dh, T, c.rope_theta);
    auto q = model::rms_norm_plain(model::apply_rope(attn->wq(u).view({B, T, nh, dh}), p.pos, tables));
    auto k = model::rms_norm_plain(model::apply_rope(attn->wk(u).view({B, T, nkv, dh}), p.pos, tables));
    auto v = attn->wv(u).view({B, T, nkv, dh});
    k = k.repeat_interleave(nh / nkv, 2);
    v = v.repeat_interleave(nh / nkv, 2);
    auto scores = torch::einsum("bthd,bshd->bhts", {q, k}) / std::sqrt(static_cast<double>(dh));
    auto future = torch::ones({T, T}, torch::kBool).triu(1);
    auto probs = torch::softmax(scores.masked_fill(future, -INFINITY), -1);
    auto o = torch::einsum("bhts,bshd->bthd", {probs, v}).reshape({B, T, nh * dh});
    EXPECT_LE((attn->wo(o) - y).abs().max().item<double>(), 1e-5) << "nkv=" << nkv;
  }
}

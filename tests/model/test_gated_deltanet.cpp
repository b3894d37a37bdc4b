// The Gated DeltaNet layer against MODEL.md §11: short conv against the explicit sum and packed
// isolation (6), parameter count (13), init statistics (15), chunked = reference layer, packed =
// separate documents, causality (10), fp64 finite-difference gradient check of the whole layer (5)
// and token-by-token decoding (19). Measured errors are printed as "[gdn] name: value".
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model/gated_deltanet.h"
#include "model/gdr.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;

const auto F64 = torch::TensorOptions().dtype(torch::kFloat64);

// A small G layer: d=24, H=2, dk=4, dv=6, W=4, chunk 8 (T=20 spans three chunks).
model::ModelConfig small_gdn(bool neg_eig = false) {
  model::ModelConfig c;
  c.d = 24;
  c.gdn_heads = 2;
  c.gdn_dk = 4;
  c.gdn_dv = 6;
  c.gdn_conv = 4;
  c.gdn_chunk = 8;
  c.gdn_neg_eig = neg_eig;
  return c;
}

model::ModelConfig tiny_hybrid() {
  auto c = *model::make_preset("tiny", model::Family::Hybrid);
  return c;
}

// Explicit MODEL.md §4 conv: silu(Σ_j w[c,j] x[t−W+1+j, c]) with x = 0 before the document start.
torch::Tensor conv_explicit(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& starts) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), W = w.size(1);
  auto out = torch::zeros_like(x);
  auto xa = x.accessor<double, 3>();
  auto wa = w.accessor<double, 2>();
  auto oa = out.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      int64_t start = 0;
      for (int64_t s : starts)
        if (s <= t) start = s;
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t s = t - W + 1 + j;
          if (s >= start) acc += wa[c][j] * xa[b][s][c];
        }
        oa[b][t][c] = acc / (1.0 + std::exp(-acc));
      }
    }
  return out;
}

}  // namespace

// §11.6: the conv equals the explicit sum, dense and packed.
TEST(ShortConv, MatchesExplicitSum) {
  torch::manual_seed(42);
  auto w = torch::randn({5, 4}, F64);
  auto x = torch::randn({2, 13, 5}, F64);
  auto dense = model::short_conv(x, w, model::dense_positions(2, 13, torch::kCPU));
  const double ed = max_abs_diff(dense, conv_explicit(x, w, {0}));
  EXPECT_LE(ed, 1e-12);
  auto cu = torch::tensor({0, 3, 4, 11, 20}, torch::kInt64);
  auto xp = torch::randn({1, 20, 5}, F64);
  auto packed = model::short_conv(xp, w, model::packed_positions(cu, 20, torch::kCPU));
  const double ep = max_abs_diff(packed, conv_explicit(xp, w, {0, 3, 4, 11}));
  EXPECT_LE(ep, 1e-12);
  // The packed row differs from the same row read as one document (the masks do something).
  EXPECT_GT(max_abs_diff(packed, conv_explicit(xp, w, {0})), 1e-3);
  // Width 1 is a pointwise scale.
  auto w1 = torch::randn({5, 1}, F64);
  EXPECT_LE(max_abs_diff(model::short_conv(x, w1, model::dense_positions(2, 13, torch::kCPU)),
                         conv_explicit(x, w1, {0})),
            1e-12);
  std::printf("[gdn] short conv vs explicit: dense %.2e packed %.2e\n", ed, ep);
}

// §11.6: changing one document's inputs leaves the other documents' outputs bitwise unchanged.
TEST(ShortConv, VarlenIsolationBitwise) {
  torch::manual_seed(42);
  const std::vector<int64_t> cu_v = {0, 3, 4, 11, 20};
  auto p = model::packed_positions(torch::tensor(cu_v, torch::kInt64), 20, torch::kCPU);
  auto w = torch::randn({7, 4});
  auto x = torch::randn({1, 20, 7});
  auto base = model::short_conv(x, w, p);
  for (size_t n = 0; n + 1 < cu_v.size(); ++n) {
    const int64_t s = cu_v[n], len = cu_v[n + 1] - cu_v[n];
    auto x2 = x.clone();
    x2.narrow(1, s, len).normal_();
    auto out = model::short_conv(x2, w, p);
    for (size_t m = 0; m + 1 < cu_v.size(); ++m) {
      auto a = base.narrow(1, cu_v[m], cu_v[m + 1] - cu_v[m]);
      auto b = out.narrow(1, cu_v[m], cu_v[m + 1] - cu_v[m]);
      if (m == n) EXPECT_FALSE(torch::equal(a, b)) << "doc " << n;
      else EXPECT_TRUE(torch::equal(a, b)) << "changed doc " << n << " moved doc " << m;
    }
  }
}

// §9/§13: Σ numel of one G layer equals P_G, and the parameter names the trainer relies on.
TEST(GatedDeltaNet, ParameterCount) {
  auto c = tiny_hybrid();
  model::GatedDeltaNet m(c);
  EXPECT_EQ(numel_sum(*m), model::params_mixer(c, 'G'));
  EXPECT_EQ(numel_sum(*m), 133764);
  auto small = *model::make_preset("small", model::Family::Hybrid);
  model::GatedDeltaNet ms(small);
  EXPECT_EQ(numel_sum(*ms), 891846);
  EXPECT_EQ(numel_sum(*ms), model::params_mixer(small, 'G'));
  auto named = m->named_parameters();
  for (const char* n : {"A_log", "dt_bias", "norm_w", "conv_q", "conv_k", "conv_v", "wq.weight", "wk.weight",
                        "wv.weight", "wa.weight", "wb.weight", "wg.weight", "wo.weight"})
    EXPECT_NE(named.find(n), nullptr) << n;
  EXPECT_EQ(named.size(), 13u);
  EXPECT_EQ(m->conv_v.sizes(), (std::vector<int64_t>{256, 4}));
  EXPECT_EQ(m->wo->weight.sizes(), (std::vector<int64_t>{128, 256}));
}

// §11.15 for the G layer: gate init ranges, norm weight 1, Linear stds.
TEST(GatedDeltaNet, InitStatistics) {
  torch::manual_seed(42);
  auto c = tiny_hybrid();
  c.gdn_heads = 512;  // many heads, so the ranges are sampled densely
  c.gdn_dk = 8;
  c.gdn_dv = 16;
  model::GatedDeltaNet m(c);
  auto dt = torch::softplus(m->dt_bias.to(torch::kFloat64));
  auto A = m->A_log.to(torch::kFloat64).exp();
  EXPECT_GE(dt.min().item<double>(), 1e-3 * (1 - 1e-6));
  EXPECT_LE(dt.max().item<double>(), 0.1 * (1 + 1e-6));
  EXPECT_LT(dt.min().item<double>(), 2e-3);  // log-uniform: the low end is reached
  EXPECT_GT(dt.max().item<double>(), 0.05);
  EXPECT_GT(A.min().item<double>(), 0.0);
  EXPECT_LE(A.max().item<double>(), 16.0);
  EXPECT_GT(A.max().item<double>(), 15.0);
  EXPECT_LT(A.min().item<double>(), 1.0);
  EXPECT_TRUE(torch::equal(m->norm_w, torch::ones({c.gdn_dv})));
  EXPECT_LE(m->conv_q.abs().max().item<double>(), 0.5);
  // Linear stds (§11.15): wq [H·dk,d] is large enough for ±5%.
  const double s = m->wq->weight.std().item<double>();
  EXPECT_NEAR(s, 0.02, 0.02 * 0.05);
  const double s_out = m->wo->weight.std().item<double>();
  const double want_out = 0.02 / std::sqrt(2.0 * c.n_layers);
  EXPECT_NEAR(s_out, want_out, want_out * 0.05);
  // Same seed, same parameters.
  torch::manual_seed(7);
  model::GatedDeltaNet a(c);
  torch::manual_seed(7);
  model::GatedDeltaNet b(c);
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

// The chunked layer equals the reference layer, dense and packed (fp64).
TEST(GatedDeltaNet, ChunkedLayerMatchesReferenceLayer) {
  torch::manual_seed(42);
  auto c = small_gdn();
  model::GatedDeltaNet m(c);
  m->reset_parameters(0.3, 0.3);
  m->to(torch::kFloat64);
  auto u = torch::randn({2, 37, c.d}, F64);
  auto p = model::dense_positions(2, 37, torch::kCPU);
  torch::NoGradGuard ng;
  auto fast = m->forward(u, p);
  m->use_reference = true;
  auto ref = m->forward(u, p);
  const double e = max_abs_diff(fast, ref);
  EXPECT_LE(e, 1e-12);
  EXPECT_GT(ref.abs().max().item<double>(), 1e-2);
  std::printf("[gdn] layer chunked vs reference fp64: %.2e\n", e);
}

// §11.11 for the G layer alone: a packed row equals each document run on its own.
TEST(GatedDeltaNet, PackedEqualsSeparate) {
  torch::manual_seed(42);
  auto c = tiny_hybrid();
  c.gdn_chunk = 16;
  model::GatedDeltaNet m(c);
  m->reset_parameters(0.1, 0.1);
  const std::vector<int64_t> cu_v = {0, 5, 69, 70, 200};
  auto u = torch::randn({1, 200, c.d});
  torch::NoGradGuard ng;
  auto packed = m->forward(u, model::packed_positions(torch::tensor(cu_v, torch::kInt64), 200, torch::kCPU));
  double worst = 0;
  for (size_t n = 0; n + 1 < cu_v.size(); ++n) {
    const int64_t s = cu_v[n], len = cu_v[n + 1] - cu_v[n];
    auto alone = m->forward(u.narrow(1, s, len), model::dense_positions(1, len, torch::kCPU));
    worst = std::max(worst, max_abs_diff(packed.narrow(1, s, len), alone));
  }
  EXPECT_LE(worst, 1e-5);
  // Read as one document, the row gives different outputs after the first boundary.
  auto whole = m->forward(u, model::dense_positions(1, 200, torch::kCPU));
  EXPECT_GT(max_abs_diff(whole.narrow(1, 5, 195), packed.narrow(1, 5, 195)), 1e-4);
  std::printf("[gdn] layer packed vs separate fp32: %.2e\n", worst);
}

// §11.10 for the G layer: outputs at positions ≤ t ignore inputs after t.
TEST(GatedDeltaNet, CausalFp32AndFp64) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::manual_seed(42);
    auto c = tiny_hybrid();
    model::GatedDeltaNet m(c);
    m->reset_parameters(0.1, 0.1);
    m->to(dtype);
    const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-12;
    const int64_t T = 150;
    auto u = torch::randn({1, T, c.d}, torch::TensorOptions().dtype(dtype));
    auto p = model::dense_positions(1, T, torch::kCPU);
    torch::NoGradGuard ng;
    auto base = m->forward(u, p);
    double worst = 0;
    for (int64_t t : {0, 63, 64, 100}) {
      auto changed = u.clone();
      changed.narrow(1, t + 1, T - t - 1).normal_();
      auto out = m->forward(changed, p);
      const double diff = max_abs_diff(out.narrow(1, 0, t + 1), base.narrow(1, 0, t + 1));
      EXPECT_LE(diff, tol) << "t=" << t << " dtype " << dtype;
      worst = std::max(worst, diff);
      EXPECT_GT(max_abs_diff(out.narrow(1, t + 1, T - t - 1), base.narrow(1, t + 1, T - t - 1)), 1e-4);
    }
    std::printf("[gdn] causality %s: max %.2e\n", dtype == torch::kFloat32 ? "fp32" : "fp64", worst);
  }
}

namespace {

// Central-difference check of ∂(Σ out ⊙ R)/∂θ at a few random elements of every parameter and of u,
// against autograd. Returns the worst |fd − ad| / (1 + |ad|).
double finite_difference_check(model::GatedDeltaNet& m, const torch::Tensor& u0, const model::Positions& p,
                               int64_t per_tensor) {
  auto u = u0.detach().clone().requires_grad_(true);
  auto R = torch::randn({u.size(0), u.size(1), m->wo->weight.size(0)}, F64);
  auto loss_of = [&]() { return (m->forward(u, p) * R).sum(); };
  auto named = m->named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> targets = {{"u", u}};
  for (const auto& kv : named) targets.emplace_back(kv.key(), kv.value());
  for (auto& t : targets)
    if (t.second.grad().defined()) t.second.mutable_grad() = torch::Tensor();
  loss_of().backward();
  double worst = 0;
  const double eps = 1e-6;
  for (auto& [name, t] : targets) {
    auto grad = t.grad();
    EXPECT_TRUE(grad.defined()) << name;
    if (!grad.defined()) continue;
    EXPECT_GT(grad.abs().max().item<double>(), 1e-8) << name << ": zero gradient";
    auto flat = t.data().view({-1});
    auto gflat = grad.reshape({-1});
    for (int64_t r = 0; r < per_tensor; ++r) {
      const int64_t i = torch::randint(0, flat.numel(), {1}).item<int64_t>();
      const double x0 = flat[i].item<double>();
      double lp, lm;
      {
        torch::NoGradGuard ng;
        flat[i] = x0 + eps;
        lp = loss_of().item<double>();
        flat[i] = x0 - eps;
        lm = loss_of().item<double>();
        flat[i] = x0;
      }
      const double fd = (lp - lm) / (2 * eps), ad = gflat[i].item<double>();
      const double err = std::abs(fd - ad) / (1.0 + std::abs(ad));
      EXPECT_LE(err, 1e-6) << name << "[" << i << "]: fd " << fd << " autograd " << ad;
      worst = std::max(worst, err);
    }
  }
  return worst;
}

}  // namespace

// §11.5: the whole G layer (conv, L2Norm, gates, A_log, dt_bias, gated norm, chunked core) passes an
// fp64 finite-difference gradient check with T=20, dense and packed.
TEST(GatedDeltaNet, GradcheckFp64DenseAndVarlen) {
  double worst = 0;
  for (bool neg_eig : {false, true}) {
    torch::manual_seed(42);
    auto c = small_gdn(neg_eig);
    model::GatedDeltaNet m(c);
    m->reset_parameters(0.3, 0.3);
    m->to(torch::kFloat64);
    // Stronger decay than the init range, so A_log and dt_bias have visible gradients.
    {
      torch::NoGradGuard ng;
      m->dt_bias.fill_(0.5);
    }
    auto u = torch::randn({2, 20, c.d}, F64);
    worst = std::max(worst, finite_difference_check(m, u, model::dense_positions(2, 20, torch::kCPU), 4));
    auto up = torch::randn({1, 20, c.d}, F64);
    auto cu = torch::tensor({0, 3, 11, 12, 20}, torch::kInt64);
    worst = std::max(worst, finite_difference_check(m, up, model::packed_positions(cu, 20, torch::kCPU), 4));
  }
  std::printf("[gdn] layer gradcheck fp64 (T=20, dense+varlen): max rel err %.2e\n", worst);
}

// §11.19 for the G layer: step() token by token equals forward() (fp32, 1e-4).
TEST(GatedDeltaNet, DecodeMatchesForward) {
  torch::manual_seed(42);
  auto c = tiny_hybrid();
  c.gdn_chunk = 16;
  model::GatedDeltaNet m(c);
  m->reset_parameters(0.1, 0.1);
  const int64_t B = 2, T = 40;
  auto u = torch::randn({B, T, c.d});
  torch::NoGradGuard ng;
  auto full = m->forward(u, model::dense_positions(B, T, torch::kCPU));
  model::MixerCache cache;
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) outs.push_back(m->step(u.narrow(1, t, 1), cache));
  auto stepped = torch::cat(outs, 1);
  EXPECT_EQ(cache.pos, T);
  EXPECT_EQ(cache.state.sizes(), (std::vector<int64_t>{B, c.gdn_heads, c.gdn_dk, c.gdn_dv}));
  EXPECT_EQ(cache.state.scalar_type(), torch::kFloat32);
  EXPECT_EQ(cache.conv_q.sizes(), (std::vector<int64_t>{B, c.gdn_conv - 1, c.gdn_heads * c.gdn_dk}));
  const double e = max_abs_diff(stepped, full);
  EXPECT_LE(e, 1e-4);
  EXPECT_GT(full.abs().max().item<double>(), 1e-2);
  std::printf("[gdn] decode vs forward fp32: %.2e (max |out| %.2e)\n", e, full.abs().max().item<double>());
}

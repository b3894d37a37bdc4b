// MLA mixer (MODEL.md §5) against an explicit reference (§11.8): per-head K/V from the latent by
// einsum, RoPE by explicit 2×2 rotations, and a masked softmax loop over j ≤ t within the
// document, computed in fp64 from the layer's own weights. Also: padded V columns are exactly 0,
// absorbed decode equals the full forward (§11.19), causality (§11.10), packed = separate and
// Σ numel = P_A (§9).
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "model/layers.h"
#include "model/mla.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;

[[maybe_unused]] ::testing::Environment* const single_thread_env =
    ::testing::AddGlobalTestEnvironment(new testing_support::SingleThreadEnvironment);

model::ModelConfig mla_config(const char* preset, bool q_lora) {
  auto c = *model::make_preset(preset, model::Family::Hybrid);
  if (!q_lora) c.mla_q_rank = 0;
  return c;
}

// Larger than the §7 init so attention is far from uniform and every term matters.
model::MLA make_mla(const model::ModelConfig& c) {
  model::MLA m(c);
  m->reset_parameters(0.15, 0.1);
  torch::NoGradGuard ng;
  // Non-trivial norm weights, so a missing or misplaced norm weight shows.
  for (auto& item : m->named_parameters())
    if (item.key().find("norm") != std::string::npos) item.value().uniform_(0.5, 1.5);
  return m;
}

torch::Tensor rms_norm_ref(const torch::Tensor& x, const torch::Tensor& w) {
  return x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
}

// RoPE by explicit 2×2 rotations of the pairs (j, j + r/2): x [T,n,r] (fp64), pos[t].
torch::Tensor rope_ref(const torch::Tensor& x, const std::vector<int64_t>& pos, double theta) {
  const int64_t T = x.size(0), r = x.size(2), half = r / 2;
  auto out = x.clone();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      const double a = static_cast<double>(pos[t]) * std::pow(theta, -2.0 * j / static_cast<double>(r));
      const double cs = std::cos(a), sn = std::sin(a);
      auto x1 = x.select(0, t).select(-1, j), x2 = x.select(0, t).select(-1, j + half);
      out.select(0, t).select(-1, j).copy_(cs * x1 - sn * x2);
      out.select(0, t).select(-1, j + half).copy_(sn * x1 + cs * x2);
    }
  }
  return out;
}

// The explicit §5 forward of one row u [T,d] whose documents start at doc_start (positions
// restart in each). Everything in fp64 from the module's weights.
torch::Tensor mla_reference_row(model::MLAImpl& m, const model::ModelConfig& c, const torch::Tensor& u_row,
                                const std::vector<int64_t>& doc_start) {
  auto f64 = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat64); };
  const int64_t T = u_row.size(0), nh = c.mla_heads, dn = c.mla_nope_dim, dr = c.mla_rope_dim,
                dva = c.mla_v_dim, rkv = c.mla_kv_rank, dqk = dn + dr;
  auto u = f64(u_row);
  std::vector<int64_t> start(T), pos(T);
  {
    int64_t s = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b : doc_start)
        if (b <= t) s = b;
      start[t] = s;
      pos[t] = t - s;
    }
  }
  torch::Tensor q;  // [T,nh,dqk]
  if (c.mla_q_rank > 0) {
    auto qa = rms_norm_ref(torch::matmul(u, f64(m.wq_a->weight).t()), f64(m.q_norm->weight));
    q = torch::matmul(qa, f64(m.wq_b->weight).t());
  } else {
    q = torch::matmul(u, f64(m.wq->weight).t());
  }
  q = q.view({T, nh, dqk});
  auto a = torch::matmul(u, f64(m.wkv_a->weight).t());                       // [T,rkv+dr]
  auto lat = rms_norm_ref(a.narrow(1, 0, rkv), f64(m.kv_norm->weight));      // [T,rkv]
  auto k_r = rope_ref(a.narrow(1, rkv, dr).unsqueeze(1), pos, c.rope_theta);  // [T,1,dr]
  auto wb = f64(m.wkv_b->weight).view({nh, dn + dva, rkv});
  auto k_n = torch::einsum("tr,hnr->thn", {lat, wb.narrow(1, 0, dn)});      // [T,nh,dn]
  auto v = torch::einsum("tr,hvr->thv", {lat, wb.narrow(1, dn, dva)});      // [T,nh,dva]
  auto q_r = rope_ref(q.narrow(2, dn, dr), pos, c.rope_theta);              // [T,nh,dr]
  auto Q = torch::cat({q.narrow(2, 0, dn), q_r}, 2);
  auto K = torch::cat({k_n, k_r.expand({T, nh, dr})}, 2);
  const double s = 1.0 / std::sqrt(static_cast<double>(dqk));
  auto O = torch::zeros({T, nh, dva}, torch::kFloat64);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t j0 = start[t], n = t - j0 + 1;
    auto sc = s * torch::einsum("hd,jhd->hj", {Q[t], K.narrow(0, j0, n)});     // [nh,n]
    auto p = torch::softmax(sc, -1);
    O[t] = torch::einsum("hj,jhv->hv", {p, v.narrow(0, j0, n)});
  }
  return torch::matmul(O.reshape({T, nh * dva}), f64(m.wo->weight).t());
}

}  // namespace

TEST(Mla, ParameterCountMatchesFormula) {
  for (const char* preset : {"tiny", "small", "base", "moe-1b"}) {
    auto c = *model::make_preset(preset, model::Family::Hybrid);
    model::MLA m(c);
    EXPECT_EQ(numel_sum(*m), model::params_mixer(c, 'A')) << preset;
  }
  EXPECT_EQ(numel_sum(*model::MLA(mla_config("tiny", true))), 63616);
  auto small = mla_config("small", true);
  ASSERT_EQ(small.mla_q_rank, 0);
  model::MLA ms(small);
  EXPECT_EQ(numel_sum(*ms), 528512);
  EXPECT_TRUE(ms->wq_a.is_empty() && !ms->wq.is_empty() && ms->q_norm.is_empty());
}

TEST(Mla, DenseMatchesReference) {
  for (bool q_lora : {true, false}) {
    torch::manual_seed(42);
    auto c = mla_config("tiny", q_lora);
    auto m = make_mla(c);
    const int64_t B = 2, T = 37;
    auto u = torch::randn({B, T, c.d});
    torch::NoGradGuard ng;
    auto y = m->forward(u, model::dense_positions(B, T, u.device()));
    ASSERT_EQ(y.sizes(), u.sizes());
    double err = 0, scale = 0;
    for (int64_t b = 0; b < B; ++b) {
      auto ref = mla_reference_row(*m, c, u[b], {0});
      err = std::max(err, max_abs_diff(y[b], ref));
      scale = std::max(scale, ref.abs().max().item<double>());
    }
    std::printf("[mla dense rq=%ld] max|Δ| = %.3g (max|y| = %.3g)\n", static_cast<long>(c.mla_q_rank), err, scale);
    EXPECT_LE(err, 1e-5);
    EXPECT_GT(scale, 0.1);  // outputs are O(1), so 1e-5 is a real bound
  }
}

TEST(Mla, VarlenMatchesReference) {
  for (bool q_lora : {true, false}) {
    torch::manual_seed(42);
    auto c = mla_config("tiny", q_lora);
    auto m = make_mla(c);
    auto cu = torch::tensor({0, 7, 40, 41, 100}, torch::kInt64);
    const int64_t N = 100;
    auto u = torch::randn({1, N, c.d});
    torch::NoGradGuard ng;
    auto y = m->forward(u, model::packed_positions(cu, N, u.device()));
    auto ref = mla_reference_row(*m, c, u[0], {0, 7, 40, 41});
    const double err = max_abs_diff(y[0], ref);
    std::printf("[mla varlen rq=%ld] max|Δ| = %.3g\n", static_cast<long>(c.mla_q_rank), err);
    EXPECT_LE(err, 1e-5);
    // The reference really separates documents: one row without the split differs.
    auto mixed = mla_reference_row(*m, c, u[0], {0});
    EXPECT_GT(max_abs_diff(mixed.narrow(0, 7, 93), ref.narrow(0, 7, 93)), 1e-3);
  }
}

TEST(Mla, PaddedValueColumnsAreExactlyZero) {
  torch::manual_seed(42);
  auto c = mla_config("tiny", true);
  ASSERT_LT(c.mla_v_dim, c.mla_nope_dim + c.mla_rope_dim);  // tiny exercises the padding
  auto m = make_mla(c);
  torch::NoGradGuard ng;
  const double s = 1.0 / std::sqrt(static_cast<double>(m->qk_dim()));
  auto cu = torch::tensor({0, 7, 40, 41, 100}, torch::kInt64);
  for (bool varlen : {false, true}) {
    const int64_t B = varlen ? 1 : 2, T = varlen ? 100 : 37;
    auto p = varlen ? model::packed_positions(cu, T, torch::kCPU) : model::dense_positions(B, T, torch::kCPU);
    auto u = torch::randn({B, T, c.d});
    auto qkv = m->project(u, p);
    ASSERT_EQ(qkv.v.size(-1), c.mla_v_dim);
    auto vp = torch::constant_pad_nd(qkv.v, {0, m->qk_dim() - c.mla_v_dim});
    auto o_pad = model::causal_attention(qkv.q, qkv.k, vp, s, p);  // [B,nh,T,dqk]
    auto pad_cols = o_pad.narrow(-1, c.mla_v_dim, m->qk_dim() - c.mla_v_dim);
    EXPECT_EQ(pad_cols.abs().max().item<double>(), 0.0) << "varlen " << varlen;
    auto o = model::causal_attention(qkv.q, qkv.k, qkv.v, s, p);    // [B,nh,T,dva]
    EXPECT_TRUE(torch::equal(o, o_pad.narrow(-1, 0, c.mla_v_dim))) << "varlen " << varlen;
  }
}

TEST(Mla, DecodeMatchesForward) {
  for (bool q_lora : {true, false}) {
    torch::manual_seed(42);
    auto c = mla_config("tiny", q_lora);
    auto m = make_mla(c);
    const int64_t B = 2, T = 40;
    auto u = torch::randn({B, T, c.d});
    torch::NoGradGuard ng;
    auto full = m->forward(u, model::dense_positions(B, T, u.device()));
    model::MixerCache cache;
    double err = 0;
    for (int64_t t = 0; t < T; ++t) {
      auto y = m->step(u.narrow(1, t, 1), cache);
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{B, 1, c.d}));
      err = std::max(err, max_abs_diff(y, full.narrow(1, t, 1)));
    }
    std::printf("[mla decode rq=%ld] max|Δ| = %.3g\n", static_cast<long>(c.mla_q_rank), err);
    EXPECT_LE(err, 1e-4);
    EXPECT_EQ(cache.pos, T);
    EXPECT_EQ(cache.latent.sizes(), (std::vector<int64_t>{B, T, c.mla_kv_rank}));
    EXPECT_EQ(cache.k_rope.sizes(), (std::vector<int64_t>{B, T, c.mla_rope_dim}));
    EXPECT_FALSE(cache.k.defined() || cache.v.defined());
  }
}

TEST(Mla, DecodeBeyondRopeTable) {
  torch::manual_seed(42);
  auto c = mla_config("tiny", true);
  c.max_seq_len = 8;  // forward and step must grow the tables
  auto m = make_mla(c);
  const int64_t B = 1, T = 20;
  auto u = torch::randn({B, T, c.d});
  torch::NoGradGuard ng;
  auto full = m->forward(u, model::dense_positions(B, T, u.device()));
  auto ref = mla_reference_row(*m, c, u[0], {0});
  EXPECT_LE(max_abs_diff(full[0], ref), 1e-5);
  model::MLA m2(c);
  m2->reset_parameters(0.15, 0.1);
  {
    auto src = m->named_parameters();
    for (auto& item : m2->named_parameters()) item.value().copy_(src[item.key()]);
  }
  model::MixerCache cache;
  double err = 0;
  for (int64_t t = 0; t < T; ++t) err = std::max(err, max_abs_diff(m2->step(u.narrow(1, t, 1), cache), full.narrow(1, t, 1)));
  EXPECT_LE(err, 1e-4);
}

TEST(Mla, CausalFp32AndFp64) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::manual_seed(42);
    auto c = mla_config("tiny", true);
    auto m = make_mla(c);
    m->to(dtype);
    const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-12;
    const int64_t T = 150;
    auto u = torch::randn({2, T, c.d}, dtype);
    auto p = model::dense_positions(2, T, u.device());
    torch::NoGradGuard ng;
    auto base = m->forward(u, p);
    ASSERT_EQ(base.scalar_type(), dtype);
    for (int64_t t : {0, 63, 64, 100}) {
      auto changed = u.clone();
      changed.narrow(1, t + 1, T - t - 1).normal_();
      auto out = m->forward(changed, p);
      EXPECT_LE(max_abs_diff(out.narrow(1, 0, t + 1), base.narrow(1, 0, t + 1)), tol) << "t=" << t << " " << dtype;
      EXPECT_GT(max_abs_diff(out.narrow(1, t + 1, T - t - 1), base.narrow(1, t + 1, T - t - 1)), 1e-3);
    }
  }
}

TEST(Mla, PackedEqualsSeparate) {
  for (bool q_lora : {true, false}) {
    torch::manual_seed(42);
    auto c = mla_config("tiny", q_lora);
    auto m = make_mla(c);
    const std::vector<int64_t> cuv = {0, 5, 69, 70, 200};
    const int64_t N = 200;
    auto u = torch::randn({1, N, c.d});
    torch::NoGradGuard ng;
    auto packed = m->forward(u, model::packed_positions(torch::tensor(cuv, torch::kInt64), N, u.device()));
    double err = 0;
    for (size_t i = 0; i + 1 < cuv.size(); ++i) {
      const int64_t len = cuv[i + 1] - cuv[i];
      auto sep = m->forward(u.narrow(1, cuv[i], len), model::dense_positions(1, len, u.device()));
      err = std::max(err, max_abs_diff(packed.narrow(1, cuv[i], len), sep));
    }
    std::printf("[mla packed rq=%ld] max|Δ| = %.3g\n", static_cast<long>(c.mla_q_rank), err);
    EXPECT_LE(err, 1e-5);
  }
}

TEST(Mla, Gradients) {
  // Every parameter receives a finite, nonzero gradient through the training path.
  torch::manual_seed(42);
  auto c = mla_config("tiny", true);
  auto m = make_mla(c);
  auto u = torch::randn({2, 17, c.d}, torch::requires_grad());
  m->forward(u, model::dense_positions(2, 17, u.device())).pow(2).sum().backward();
  for (auto& item : m->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(torch::isfinite(item.value().grad()).all().item<bool>()) << item.key();
    EXPECT_GT(item.value().grad().abs().max().item<double>(), 0.0) << item.key();
  }
}

TEST(Mla, RunsUnderBf16Autocast) {
  torch::manual_seed(42);
  auto c = mla_config("tiny", true);
  auto m = make_mla(c);
  const int64_t B = 2, T = 24;
  auto u = torch::randn({B, T, c.d});
  torch::NoGradGuard ng;
  auto ref = m->forward(u, model::dense_positions(B, T, u.device()));
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  auto y = m->forward(u, model::dense_positions(B, T, u.device()));
  model::MixerCache cache;
  std::vector<torch::Tensor> steps;
  for (int64_t t = 0; t < T; ++t) steps.push_back(m->step(u.narrow(1, t, 1), cache));
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  const double zmax = ref.abs().max().item<double>();
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LE(max_abs_diff(y, ref), 3e-2 * zmax);
  EXPECT_LE(max_abs_diff(torch::cat(steps, 1), ref), 3e-2 * zmax);
}

// The attention output's heads to tokens (each head's first dv of D columns): the same values as
// ATen's narrow, transpose and reshape, forward and backward, exactly; the padding columns' gradient
// is zero and the gradient lies in [B,T,H,D] memory (what the flash kernels' output has).
TEST(Mla, HeadsToTokensMatchesNarrowTransposeReshape) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 31);
  const int64_t B = 2, T = 5, H = 3, D = 6;
  for (const int64_t dv : {int64_t{4}, D}) {
    // o as the flash kernels hand it over: [B,T,H,D] memory seen as [B,H,T,D].
    auto base = torch::randn({B, T, H, D}, torch::kFloat64);
    auto o = base.clone().transpose(1, 2).requires_grad_(true);
    auto o_ref = base.clone().transpose(1, 2).requires_grad_(true);
    // The gradient as the node hands it back (a leaf's .grad is re-laid out like the leaf).
    auto o_mid = o * 1.0;
    torch::Tensor handed_back;
    o_mid.register_hook([&](const torch::Tensor& g) { handed_back = g; });
    auto y = model::heads_to_tokens(o_mid, dv);
    auto y_ref = o_ref.narrow(-1, 0, dv).transpose(1, 2).reshape({B, T, H * dv});
    ASSERT_EQ(y.sizes(), y_ref.sizes());
    EXPECT_TRUE(y.is_contiguous());
    EXPECT_EQ(max_abs_diff(y, y_ref), 0.0) << "dv " << dv;
    auto g = torch::randn_like(y);
    y.backward(g);
    y_ref.backward(g);
    EXPECT_EQ(max_abs_diff(o.grad(), o_ref.grad()), 0.0) << "dv " << dv;
    ASSERT_TRUE(handed_back.defined());
    EXPECT_TRUE(handed_back.transpose(1, 2).is_contiguous()) << "dv " << dv;
    if (dv < D) {
      EXPECT_EQ(o.grad().narrow(-1, dv, D - dv).abs().max().item<double>(), 0.0);
    }
  }
  EXPECT_THROW(model::heads_to_tokens(torch::zeros({2, 3, 4}), 2), c10::Error);
  EXPECT_THROW(model::heads_to_tokens(torch::zeros({1, 2, 3, 4}), 5), c10::Error);
}

// MoE feed-forward (MODEL.md §3, §11.12): E=1,k=1 equals SwiGLU exactly; a zero router gives
// L_aux = α; the fast dispatch equals the index_add reference, forward and gradients; every token
// goes to k distinct experts; ∂L_aux/∂W_r flows only through P. Plus Σ numel = P_MoE (§9) and
// causality (§11.10). The row moves between token and expert order against explicit loops.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model/expert_grads_in_pieces.h"
#include "model/expert_product.h"
#include "model/grad_square_sums.h"
#include "model/grouped_linear.h"
#include "model/layers.h"
#include "model/mixed_linear.h"
#include "model/moe.h"
#include "model/moe_dispatch.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;

model::ModelConfig moe_config() { return *model::make_preset("tiny-moe", model::Family::Hybrid); }

// Larger than the §7 init so routing is decisive and the expert outputs are O(1).
model::MoE make_moe(const model::ModelConfig& c) {
  model::MoE m(c);
  m->reset_parameters(0.2, 0.1);
  return m;
}

}  // namespace

TEST(Moe, ParameterCountMatchesFormula) {
  for (const char* preset : {"tiny-moe", "moe-1b"}) {
    auto c = *model::make_preset(preset, model::Family::Hybrid);
    model::MoE m(c);
    EXPECT_EQ(numel_sum(*m), model::params_ffn(c)) << preset;
  }
  auto c = moe_config();
  model::MoE m(c);
  EXPECT_EQ(numel_sum(*m), 443392);
  auto names = m->named_parameters();
  EXPECT_EQ(names["router"].sizes(), (std::vector<int64_t>{8, 128}));
  EXPECT_EQ(names["gate"].sizes(), (std::vector<int64_t>{8, 128, 128}));
  EXPECT_EQ(names["up"].sizes(), (std::vector<int64_t>{8, 128, 128}));
  EXPECT_EQ(names["down"].sizes(), (std::vector<int64_t>{8, 128, 128}));
  EXPECT_EQ(names["shared.down.weight"].sizes(), (std::vector<int64_t>{128, 128}));
  c.moe_shared_hidden = 0;
  model::MoE no_shared(c);
  EXPECT_TRUE(no_shared->shared.is_empty());
  EXPECT_EQ(numel_sum(*no_shared), model::params_ffn(c));
}

TEST(Moe, SingleExpertEqualsSwiGLU) {
  torch::manual_seed(42);
  auto c = moe_config();
  c.moe_experts = 1;
  c.moe_top_k = 1;
  c.moe_shared_hidden = 0;
  for (bool norm : {true, false}) {
    c.moe_norm_topk = norm;
    auto m = make_moe(c);
    model::SwiGLU ref(c.d, c.moe_expert_hidden);
    {
      torch::NoGradGuard ng;
      ref->gate->weight.copy_(m->gate[0]);
      ref->up->weight.copy_(m->up[0]);
      ref->down->weight.copy_(m->down[0]);
    }
    auto u = torch::randn({3, 29, c.d});
    torch::NoGradGuard ng;
    auto expected = ref(u);
    auto fast = m->forward(u);
    auto slow = m->forward_reference(u);
    ASSERT_EQ(fast.y.sizes(), u.sizes());
    EXPECT_EQ(max_abs_diff(fast.y, expected), 0.0) << "norm_topk " << norm;
    EXPECT_EQ(max_abs_diff(slow.y, expected), 0.0) << "norm_topk " << norm;
    // One expert takes every token: perfect balance.
    EXPECT_NEAR(fast.aux_loss.item<double>(), c.moe_aux_coef, 1e-9);
  }
}

TEST(Moe, ZeroRouterGivesAlpha) {
  torch::manual_seed(42);
  for (int64_t k : {1, 2, 3}) {
    auto c = moe_config();
    c.moe_top_k = k;
    auto m = make_moe(c);
    {
      torch::NoGradGuard ng;
      m->router.zero_();
    }
    auto u = torch::randn({2, 37, c.d});
    torch::NoGradGuard ng;
    for (auto out : {m->forward(u), m->forward_reference(u)}) {
      EXPECT_EQ(out.aux_loss.scalar_type(), torch::kFloat32);
      EXPECT_EQ(out.aux_loss.dim(), 0);
      const double aux = out.aux_loss.item<double>();
      std::printf("[moe zero router k=%ld] aux - alpha = %.3g\n", static_cast<long>(k), aux - c.moe_aux_coef);
      EXPECT_NEAR(aux, c.moe_aux_coef, 4 * c.moe_aux_coef * 1.2e-7);
    }
  }
}

TEST(Moe, TopKDistinctExperts) {
  torch::manual_seed(42);
  for (int64_t k : {1, 2, 5, 8}) {
    auto c = moe_config();
    c.moe_top_k = k;
    for (bool norm : {true, false}) {
      c.moe_norm_topk = norm;
      auto m = make_moe(c);
      auto u = torch::randn({333, c.d});
      torch::NoGradGuard ng;
      auto r = m->route(u);
      ASSERT_EQ(r.topk_idx.sizes(), (std::vector<int64_t>{333, k}));
      EXPECT_EQ(r.topk_idx.scalar_type(), torch::kInt64);
      EXPECT_EQ(r.probs.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(((r.topk_idx >= 0) & (r.topk_idx < c.moe_experts)).all().item<bool>());
      // k distinct experts per token: the one-hot rows add up to a 0/1 vector with k ones.
      auto hot = torch::one_hot(r.topk_idx, c.moe_experts).sum(1);  // [N,E]
      EXPECT_EQ(hot.max().item<int64_t>(), 1) << "k=" << k;
      EXPECT_TRUE((hot.sum(1) == k).all().item<bool>()) << "k=" << k;
      // γ are the chosen probabilities, the largest ones, renormalised when asked.
      auto chosen = r.probs.gather(1, r.topk_idx);
      auto kth = std::get<0>(r.probs.topk(k, 1)).select(1, k - 1).unsqueeze(1);
      EXPECT_TRUE((chosen >= kth).all().item<bool>());
      auto expect_w = norm ? chosen / chosen.sum(1, true) : chosen;
      EXPECT_LE(max_abs_diff(r.topk_w, expect_w), 1e-7);
      EXPECT_LE(max_abs_diff(r.probs.sum(1), torch::ones({333})), 1e-6);
    }
  }
}

TEST(Moe, FastDispatchMatchesReference) {
  // γ applied in the experts' SwiGLU (the default) or in the combine, with and without the shared expert.
  for (const int variant : {0, 1, 2, 3}) {
    const bool gamma_in_swiglu = variant < 2, shared = variant % 2 == 0;
    model::moe_router_weights_in_swiglu(gamma_in_swiglu);
    torch::manual_seed(42);
    auto c = moe_config();
    if (!shared) c.moe_shared_hidden = 0;
    c.moe_experts = 9;  // awkward E and k
    c.moe_top_k = 3;
    auto m = make_moe(c);
    auto u = torch::randn({2, 63, c.d});
    auto R = torch::randn({2, 63, c.d});

    auto run = [&](bool fast) {
      m->zero_grad();
      auto uu = u.clone().requires_grad_(true);
      auto out = fast ? m->forward(uu) : m->forward_reference(uu);
      // Aux loss is part of the training loss: include it with a weight that makes it matter.
      (out.y * R).sum().add(out.aux_loss * 100.0).backward();
      std::vector<torch::Tensor> g = {out.y.detach(), out.aux_loss.detach(), uu.grad().clone()};
      for (auto& p : m->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      return g;
    };
    auto f = run(true), r = run(false);
    const auto names = m->named_parameters().keys();
    double worst = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      // fp32 both ways, summed in different orders (and by different BLAS blockings when the
      // thread count changes): 1e-6 of the largest value, at least 1e-5 absolute. du sums k
      // experts, the shared expert and the router path, so its entries reach O(10).
      const double err = max_abs_diff(f[i], r[i]);
      const double scale = r[i].abs().max().item<double>();
      const std::string what = i == 0 ? "y" : i == 1 ? "aux" : i == 2 ? "du" : "d" + names[i - 3];
      EXPECT_LE(err, std::max(1e-5, 1e-6 * scale)) << what << " (largest |value| " << scale << ")";
      EXPECT_GT(r[i].abs().max().item<double>(), 1e-4) << what << " is zero: the comparison would be empty";
      worst = std::max(worst, err);
    }
    std::printf("[moe fast vs ref shared=%d, γ in %s] max|Δ| over y, aux, grads = %.3g\n", shared,
                gamma_in_swiglu ? "SwiGLU" : "combine", worst);
  }
  model::moe_router_weights_in_swiglu(true);
}

TEST(Moe, AuxGradFlowsOnlyThroughP) {
  torch::manual_seed(42);
  auto c = moe_config();
  auto m = make_moe(c);
  auto u = torch::randn({97, c.d});
  auto r = m->route(u);
  auto aux = m->aux_loss(r);
  auto g = torch::autograd::grad({aux}, {m->router}, {}, /*retain_graph=*/true)[0];  // [E,d]
  // Analytic: L = α Σ_e f_e (1/N) Σ_t s_te with f constant, s = softmax(u W_rᵀ):
  // ∂L/∂z_te = (α/N) s_te (f_e − Σ_e' f_e' s_te'),  ∂L/∂W_r = (∂L/∂z)ᵀ u.
  torch::NoGradGuard ng;
  const double N = 97, E = c.moe_experts, k = c.moe_top_k;
  auto s = torch::softmax(torch::matmul(u.to(torch::kFloat64), m->router.to(torch::kFloat64).t()), -1);  // [N,E]
  auto f = torch::one_hot(r.topk_idx.reshape({-1}), c.moe_experts).sum(0).to(torch::kFloat64) * (E / (k * N));  // [E]
  auto dz = (c.moe_aux_coef / N) * s * (f.unsqueeze(0) - (s * f).sum(1, true));
  auto expected = torch::matmul(dz.t(), u.to(torch::kFloat64));
  const double err = max_abs_diff(g, expected), scale = expected.abs().max().item<double>();
  std::printf("[moe aux grad] max|Δ| = %.3g (max|g| = %.3g)\n", err, scale);
  EXPECT_LE(err, 1e-6 * scale + 1e-12);
  // Control: had f_e carried a gradient (a soft count Σ_t 1[e∈I_t]·s_te/sg(s_te), equal in
  // value), the router gradient would differ by far more than the tolerance.
  torch::Tensor aux_wrong, g_wrong;
  {
    torch::AutoGradMode on(true);
    auto s32 = r.probs;
    auto mask = torch::one_hot(r.topk_idx, c.moe_experts).sum(1).to(torch::kFloat32);  // [N,E]
    auto f_soft = (mask * s32 / s32.detach()).sum(0) * (E / (k * N));
    aux_wrong = c.moe_aux_coef * (f_soft * s32.mean(0)).sum();
    g_wrong = torch::autograd::grad({aux_wrong}, {m->router})[0];
  }
  EXPECT_NEAR(aux_wrong.item<double>(), aux.item<double>(), 1e-7);
  EXPECT_GT(max_abs_diff(g_wrong, expected), 100 * (err + 1e-12));
}

TEST(Moe, CausalFp32AndFp64) {
  // Per-token routing and an aux loss that never feeds back into y: outputs at ≤ t ignore inputs
  // after t.
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::manual_seed(42);
    auto c = moe_config();
    auto m = make_moe(c);
    m->to(dtype);
    const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-12;
    const int64_t T = 150;
    auto u = torch::randn({2, T, c.d}, dtype);
    torch::NoGradGuard ng;
    auto base = m->forward(u).y;
    ASSERT_EQ(base.scalar_type(), dtype);
    for (int64_t t : {0, 63, 64, 100}) {
      auto changed = u.clone();
      changed.narrow(1, t + 1, T - t - 1).normal_();
      auto out = m->forward(changed).y;
      EXPECT_LE(max_abs_diff(out.narrow(1, 0, t + 1), base.narrow(1, 0, t + 1)), tol) << "t=" << t << " " << dtype;
      EXPECT_GT(max_abs_diff(out.narrow(1, t + 1, T - t - 1), base.narrow(1, t + 1, T - t - 1)), 1e-3);
    }
  }
}

TEST(Moe, UnusedExpertAndEmptyGradient) {
  // Expert 0 never wins (its router row points away from the all-positive inputs): the fast
  // path skips its empty slice and still matches the reference, with a zero gradient there.
  torch::manual_seed(42);
  auto c = moe_config();
  auto m = make_moe(c);
  {
    torch::NoGradGuard ng;
    m->router[0].fill_(-1.0);
  }
  auto u = torch::randn({50, c.d}).abs() + 0.1;
  auto r = m->route(u);
  ASSERT_FALSE((r.topk_idx == 0).any().item<bool>());
  std::vector<torch::Tensor> y, dgate;
  for (bool fast : {true, false}) {
    m->zero_grad();
    auto out = fast ? m->forward(u) : m->forward_reference(u);
    out.y.sum().backward();
    y.push_back(out.y.detach());
    dgate.push_back(m->gate.grad().clone());
  }
  EXPECT_LE(max_abs_diff(y[0], y[1]), 1e-5);
  // fp32 both ways, γ applied at another point (the experts' SwiGLU, not the combine): 1e-6 of the
  // largest gradient (about 300 here).
  EXPECT_LE(max_abs_diff(dgate[0], dgate[1]), 1e-6 * dgate[1].abs().max().item<double>());
  EXPECT_EQ(dgate[0][0].abs().max().item<double>(), 0.0);
  EXPECT_GT(dgate[0][1].abs().max().item<double>(), 0.0);
}

TEST(Moe, RouterStaysFp32UnderAutocast) {
  torch::manual_seed(42);
  auto c = moe_config();
  auto m = make_moe(c);
  auto u = torch::randn({2, 33, c.d});
  torch::NoGradGuard ng;
  auto plain = m->route(u.reshape({-1, c.d}));
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  auto r = m->route(u.reshape({-1, c.d}));
  auto out = m->forward(u);
  // Control: the same matmul outside the router is autocast to bf16.
  auto logits_bf16 = torch::matmul(u.reshape({-1, c.d}), m->router.t());
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(logits_bf16.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(r.probs.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(r.probs, plain.probs));
  EXPECT_TRUE(torch::equal(r.topk_idx, plain.topk_idx));
  EXPECT_EQ(out.y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(out.aux_loss.scalar_type(), torch::kFloat32);
  auto ref = m->forward(u);
  EXPECT_LE(max_abs_diff(out.y, ref.y), 3e-2 * ref.y.abs().max().item<double>());
}

// Under bf16 autocast the layer's fp32 input reaches the router as itself and the experts rounded
// once (RouterAndExpertInputsFn), whose backward sums the router's fp32 gradient and the experts'
// bf16 one. du against the per-expert reference under the same autocast: from the aux loss alone
// (the router's path only: fp32 on both sides, so near-exact) and from the output (both paths; bf16
// products on both sides, summed in other orders).
TEST(Moe, InputGradientUnderAutocastSumsRouterAndExperts) {
  torch::manual_seed(43);
  auto c = moe_config();
  auto m = make_moe(c);
  auto u = torch::randn({2, 40, c.d});
  auto R = torch::randn({2, 40, c.d});
  auto du = [&](bool fast, bool from_output) {
    m->zero_grad();
    auto uu = u.clone().requires_grad_(true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    auto out = fast ? m->forward(uu) : m->forward_reference(uu);
    auto loss = from_output ? (out.y.to(torch::kFloat32) * R).sum() : out.aux_loss;
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    loss.backward();
    return uu.grad().clone();
  };
  const auto router_fast = du(true, false), router_ref = du(false, false);
  const auto out_fast = du(true, true), out_ref = du(false, true);
  const double e_router = testing_support::rel_norm_diff(router_fast, router_ref);
  const double e_out = testing_support::rel_norm_diff(out_fast, out_ref);
  std::printf("[moe autocast] du from the aux loss %.1e, from the output %.1e\n", e_router, e_out);
  EXPECT_GT(router_ref.abs().max().item<double>(), 0.0);
  EXPECT_LT(e_router, 1e-5);
  EXPECT_LT(e_out, 2e-2);
}

// The grouped linear under the fast dispatch: the per-group reference, and bad row counts named.
TEST(Moe, GroupedLinearReferenceAndErrors) {
  torch::manual_seed(5);
  auto x = torch::randn({7, 4}), w = torch::randn({3, 5, 4});
  const std::vector<int64_t> rows{2, 0, 5};
  auto y = model::grouped_linear(x, w, rows);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{7, 5}));
  EXPECT_TRUE(torch::allclose(y.narrow(0, 0, 2), torch::matmul(x.narrow(0, 0, 2), w[0].t())));
  EXPECT_TRUE(torch::allclose(y.narrow(0, 2, 5), torch::matmul(x.narrow(0, 2, 5), w[2].t())));
  try {
    model::grouped_linear(x, w, {2, 2, 2});
    FAIL() << "row counts that do not add up were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not add up to x's 7 rows"), std::string::npos) << e.what();
  }
}

// expert_product (model/expert_product.h) on the CPU, its looped reference path: y and dx against
// the per-group matmuls through autograd (fp64 products of fp32 weights), and each weight's .grad
// written by the first backward and added by the second, with experts of no rows (zero gradient).
// On the CPU the MoE layer does not take it, even inside a WeightGradInPlaceScope.
TEST(Moe, ExpertProductWritesThenAddsWeightGradients) {
  torch::manual_seed(9);
  const std::vector<int64_t> rows{3, 0, 6, 2, 0};
  const int64_t M = 11, K = 8, E = 5;
  auto x0 = torch::randn({M, K}, torch::kFloat64);
  std::vector<torch::Tensor> w0 = {torch::randn({E, 4, K}), torch::randn({E, 6, K})};
  auto offsets = torch::tensor(rows, torch::kInt64).cumsum(0).to(torch::kInt32);
  auto dy1 = torch::randn({M, 10}, torch::kFloat64), dy2 = torch::randn({M, 10}, torch::kFloat64);
  auto run = [&](bool ours) {
    std::vector<torch::Tensor> w;
    for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
    auto x = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> out;
    for (const auto& dy : {dy1, dy2}) {
      auto y = ours ? model::expert_product(x, w, offsets, torch::kFloat64)
                    : model::grouped_linear_reference(x, torch::cat({w[0], w[1]}, 1).to(torch::kFloat64), rows);
      y.backward(dy);
      out.push_back(y.detach());
      out.push_back(x.grad().clone());
      for (const auto& t : w) out.push_back(t.grad().clone());
    }
    EXPECT_EQ(w[0].grad().scalar_type(), torch::kFloat32);
    return out;
  };
  const auto want = run(false), got = run(true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // fp64 sums in other orders, weight gradients rounded to fp32 once (written) or twice (added).
    EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-5) << "tensor " << i;
  }
  // Experts 1 and 4 had no rows: exactly zero gradients, in both weights, after both backwards.
  for (size_t i : {size_t{6}, size_t{7}})
    for (int64_t e : {int64_t{1}, int64_t{4}}) EXPECT_EQ(got[i][e].abs().max().item<double>(), 0.0) << i << " " << e;
  {
    model::WeightGradInPlaceScope scope;
    std::vector<torch::Tensor> w;
    for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
    EXPECT_FALSE(model::expert_product_applies(x0.to(torch::kBFloat16), w, torch::kBFloat16)) << "on the CPU";
  }
  // Wrong offsets and shapes are named.
  try {
    model::expert_product(x0, w0, offsets.narrow(0, 0, 3), torch::kFloat64);
    FAIL() << "offsets for 3 of 5 experts were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected int32 offsets [5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::expert_product(x0, {torch::randn({E, 4, K + 1})}, offsets, torch::kFloat64), c10::Error);
}

// The weight-gradient product's piece size (model/expert_product.h): by default kExpertGradPieceMeans
// times the mean rows per expert rounded up to 64, so even routing stays one piece per expert and
// only an expert past that is cut; a set size is used as it is, 0 is unsplit.
TEST(Moe, ExpertGradPieceRowsFollowTheMeanRowsPerExpert) {
  model::expert_grad_piece_rows(-1);
  EXPECT_EQ(model::expert_grad_piece_rows_for(16384 * 6, 64), 1536 * model::kExpertGradPieceMeans);
  EXPECT_EQ(model::expert_grad_piece_rows_for(63, 8), 64);  // 8 rows a mean: rounded up to 64
  EXPECT_GE(model::expert_grad_piece_rows_for(1000, 3), 1000 / 3 * model::kExpertGradPieceMeans);
  EXPECT_EQ(model::expert_grad_piece_rows_for(1000, 3) % 64, 0);
  EXPECT_EQ(model::expert_grad_piece_rows_for(0, 8), 0);
  model::expert_grad_piece_rows(7);
  EXPECT_EQ(model::expert_grad_piece_rows_for(16384 * 6, 64), 7);
  model::expert_grad_piece_rows(0);
  EXPECT_EQ(model::expert_grad_piece_rows_for(16384 * 6, 64), 0);
  model::expert_grad_piece_rows(-1);
}

// The pieces' sum (model/expert_product.h) against a loop over each expert's pieces: experts with
// none (first, inside, last) get zeros, unused pieces after the last are ignored.
TEST(Moe, ExpertGradPiecesSumPerExpert) {
  torch::manual_seed(11);
  const std::vector<int32_t> count = {0, 3, 1, 0, 2, 0};
  std::vector<int32_t> first;
  int32_t g = 0;
  for (const int32_t c : count) {
    first.push_back(g);
    g += c;
  }
  auto pieces = torch::randn({g + 3, 4, 5}, torch::kFloat64).to(torch::kBFloat16);
  const auto got = model::sum_expert_grad_pieces(pieces, torch::tensor(first, torch::kInt32), torch::tensor(count, torch::kInt32));
  ASSERT_EQ(got.sizes(), torch::IntArrayRef({6, 4, 5}));
  EXPECT_EQ(got.scalar_type(), torch::kFloat32);
  for (size_t e = 0; e < count.size(); ++e) {
    auto want = torch::zeros({4, 5}, torch::kFloat32);
    for (int32_t p = 0; p < count[e]; ++p) want += pieces[first[e] + p].to(torch::kFloat32);
    EXPECT_TRUE(torch::allclose(got[static_cast<int64_t>(e)], want, 1e-6, 1e-6)) << "expert " << e;
  }
}

// The registry of expert gradients left in pieces (model/expert_grads_in_pieces.h), on the CPU
// (written out through the ATen scatter): scopes nest and the outermost end forgets; a group naming
// one weight twice is refused and leaves nothing; a weight with both .grad and pieces gets the
// pieces added to its .grad and takes no recorded sum meanwhile; zero_grad's forget drops a
// product's pieces unapplied; without producer sums no scope leaves gradients in pieces.
TEST(Moe, ExpertGradPiecesRegistryKeepsEveryPartOfAGradient) {
  const at::Device cpu(torch::kCPU);
  const int64_t E = 3, K = 8;
  auto w0 = torch::zeros({E, 4, K}).requires_grad_(true), w1 = torch::zeros({E, 2, K}).requires_grad_(true);
  auto pieces = torch::randn({E, 6, K}).to(torch::kBFloat16);
  const auto sums = torch::tensor({1.0, 2.0}, torch::kFloat64);
  const auto part0 = pieces.narrow(1, 0, 4).to(torch::kFloat), part1 = pieces.narrow(1, 4, 2).to(torch::kFloat);
  {
    model::ExpertGradsInPiecesScope outer(cpu, true);
    {
      model::ExpertGradsInPiecesScope inner(cpu, true);
      model::record_expert_grad_pieces({w0, w1}, pieces, {}, {}, sums);
    }
    ASSERT_TRUE(model::expert_grads_in_pieces(cpu)) << "the inner scope's end closed the outer one";
    ASSERT_NE(model::expert_grad_pieces_of(w0), nullptr) << "the inner scope's end forgot the outer one's pieces";
    EXPECT_EQ(model::recorded_grad_square_sum(w1).item<double>(), 2.0);

    // .grad beside pieces: neither alone is the gradient.
    w0.mutable_grad() = torch::ones({E, 4, K});
    EXPECT_FALSE(model::recorded_grad_square_sum(w0).defined());
    model::materialize_expert_grad_pieces_beside_grads({w0, w1});
    EXPECT_EQ(model::expert_grad_pieces_of(w0), nullptr);
    EXPECT_EQ(model::expert_grad_pieces_of(w1), nullptr);
    EXPECT_TRUE(torch::equal(w0.grad(), part0 + 1)) << "the pieces were not added to .grad";
    EXPECT_TRUE(torch::equal(w1.grad(), part1)) << "the product's other weight was not written";

    w0.mutable_grad() = torch::Tensor();
    w1.mutable_grad() = torch::Tensor();
    EXPECT_THROW(model::record_expert_grad_pieces({w0, w0}, pieces, {}, {}, sums), c10::Error);
    EXPECT_EQ(model::expert_grad_pieces_of(w0), nullptr) << "a refused group left an entry";
    model::record_expert_grad_pieces({w0, w1}, pieces, {}, {}, sums);
    model::forget_expert_grad_pieces({w1});
    EXPECT_EQ(model::expert_grad_pieces_of(w0), nullptr) << "forget keeps the product's other weight";
    EXPECT_FALSE(w0.grad().defined());
    model::record_expert_grad_pieces({w0, w1}, pieces, {}, {}, sums);
  }
  EXPECT_FALSE(model::expert_grads_in_pieces(cpu));
  EXPECT_EQ(model::expert_grad_pieces_of(w0), nullptr) << "kept after the outermost scope";
  EXPECT_THROW(model::record_expert_grad_pieces({w0, w1}, pieces, {}, {}, sums), c10::Error) << "recorded outside a scope";

  model::producer_grad_square_sums(false);
  {
    model::ExpertGradsInPiecesScope off(cpu, true);
    EXPECT_FALSE(model::expert_grads_in_pieces(cpu)) << "pieces without producer sums leave the norm nothing to read";
  }
  model::producer_grad_square_sums(true);
}

// Collection of recorded sums of squares nests like the scopes above: an inner scope's start and
// end keep what the outer one recorded.
TEST(Moe, GradSquareSumScopesNest) {
  const at::Device cpu(torch::kCPU);
  auto w = torch::zeros({4}).requires_grad_(true);
  w.mutable_grad() = torch::ones({4});
  model::GradSquareSumsScope outer(cpu, true);
  model::record_grad_square_sum(w, torch::tensor(4.0, torch::kFloat64));
  {
    model::GradSquareSumsScope inner(cpu, true);
    EXPECT_TRUE(model::recorded_grad_square_sum(w).defined()) << "the inner start forgot the outer sums";
  }
  EXPECT_TRUE(model::grad_square_sums_collecting(cpu));
  ASSERT_TRUE(model::recorded_grad_square_sum(w).defined()) << "the inner end forgot the outer sums";
  EXPECT_EQ(model::recorded_grad_square_sum(w).item<double>(), 4.0);
}

// dispatch_rows / combine_rows against explicit loops over the pairs, values and gradients (fp64;
// rows exact, dx up to summation order): dispatch puts token t's row at the expert-order position
// of each of its k pairs, and its backward sums those k rows; combine undoes the expert order, and
// its backward redoes it.
TEST(Moe, DispatchAndCombineMoveRowsExactly) {
  torch::manual_seed(7);
  const int64_t N = 13, k = 3, d = 5, E = 4;
  auto flat = torch::randint(0, E, {N * k}, torch::kInt64);
  const auto o = model::expert_order(flat, k);
  auto fl = flat.accessor<int64_t, 1>();
  auto ord = o.order.accessor<int64_t, 1>(), inv = o.inverse.accessor<int64_t, 1>();
  for (int64_t p = 0; p < N * k; ++p) {
    EXPECT_EQ(inv[ord[p]], p);
    if (p > 0) {
      EXPECT_TRUE(fl[ord[p - 1]] < fl[ord[p]] || (fl[ord[p - 1]] == fl[ord[p]] && ord[p - 1] < ord[p]));
    }
  }
  auto opt = torch::TensorOptions().dtype(torch::kFloat64);
  auto x = torch::randn({N, d}, opt).requires_grad_(true);
  auto R = torch::randn({N * k, d}, opt);
  auto xs = model::dispatch_rows(x, o, k);
  (xs * R).sum().backward();
  auto want_dx = torch::zeros({N, d}, opt);
  for (int64_t p = 0; p < N * k; ++p) {
    const int64_t t = ord[p] / k;
    EXPECT_EQ(max_abs_diff(xs[p], x.detach()[t]), 0.0) << "position " << p;
    want_dx[t] += R[p];
  }
  EXPECT_LT(max_abs_diff(x.grad(), want_dx), 1e-14);  // k terms, summed in another order

  auto ys = torch::randn({N * k, d}, opt).requires_grad_(true);
  auto yt = model::combine_rows(ys, o);
  (yt * R).sum().backward();
  for (int64_t pair = 0; pair < N * k; ++pair) {
    EXPECT_EQ(max_abs_diff(yt[pair], ys.detach()[inv[pair]]), 0.0) << "pair " << pair;
    EXPECT_EQ(max_abs_diff(ys.grad()[inv[pair]], R[pair]), 0.0) << "pair " << pair;
  }
  EXPECT_THROW(model::dispatch_rows(torch::zeros({N + 1, d}, opt), o, k), c10::Error);
  EXPECT_THROW(model::expert_order(flat.to(torch::kInt32), k), c10::Error);
}

// Assignments per expert from the sorted experts (what the layer's forward uses) against a direct
// count, with experts that get no pair at the start, middle and end of the range.
TEST(Moe, ExpertCountsFromSortedOrderMatchACount) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 17);
  const int64_t E = 9, k = 3;
  auto flat = torch::randint(1, E - 1, {40 * k}, torch::kInt64);  // experts 0 and E − 1 never hit
  flat.masked_fill_(flat == 4, 5);                                 // nor expert 4
  const auto order = model::expert_order(flat, k);
  const auto got = model::expert_counts_sorted(order.sorted, E);
  ASSERT_EQ(got.sizes(), torch::IntArrayRef({E}));
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(got[e].item<int64_t>(), (flat == e).sum().item<int64_t>()) << "expert " << e;
  }
  EXPECT_TRUE(torch::equal(order.sorted, flat.index_select(0, order.order)));
  EXPECT_THROW(model::expert_counts_sorted(order.sorted.to(torch::kInt32), E), c10::Error);
  // Given E, the order also carries the counts and where each expert's slice ends.
  const auto with_e = model::expert_order(flat, k, E);
  EXPECT_TRUE(torch::equal(with_e.counts, got));
  ASSERT_EQ(with_e.ends.scalar_type(), torch::kInt32);
  EXPECT_TRUE(torch::equal(with_e.ends, got.cumsum(0).to(torch::kInt32)));
  EXPECT_TRUE(torch::equal(with_e.order, order.order));
  EXPECT_FALSE(order.counts.defined());
}

// The shared expert's output added by the combine: y = add + Σ γ ys, and add's gradient is y's.
TEST(Moe, CombineAddsTheSharedOutput) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 23);
  const int64_t N = 11, k = 2, d = 6, E = 5;
  auto opt = torch::TensorOptions().dtype(torch::kFloat64);
  const auto o = model::expert_order(torch::randint(0, E, {N * k}, torch::kInt64), k, E);
  auto ys = torch::randn({N * k, d}, opt), gamma = torch::rand({N, k}, opt);
  auto add = torch::randn({N, d}, opt).requires_grad_(true);
  auto y = model::combine_weighted(ys, o, gamma, add);
  EXPECT_LT(max_abs_diff(y, add.detach() + model::combine_weighted(ys, o, gamma)), 1e-14);
  auto dy = torch::randn({N, d}, opt);
  y.backward(dy);
  EXPECT_EQ(max_abs_diff(add.grad(), dy), 0.0);
  EXPECT_THROW(model::combine_weighted(ys, o, gamma, torch::zeros({N, d + 1}, opt)), c10::Error);
}

// The MoE input's two-step fan-out (model/moe_dispatch.h) by its ATen path: the router gets u
// itself, the shared expert u in the experts' dtype, the routed experts u's k copies a token in
// expert order (exact: one rounding, then copies); u's gradient is the three gradients' sum in
// fp32. A fill for another token count is refused.
TEST(Moe, InputsFanOutAndTheirGradientsSum) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 29);
  const int64_t N = 17, k = 3, d = 10, E = 5;
  const auto o = model::expert_order(torch::randint(0, E, {N * k}, torch::kInt64), k, E);
  auto u = torch::randn({N, d}).requires_grad_(true);
  auto in = model::moe_inputs_open(u, k, torch::kBFloat16, /*with_experts=*/true);
  model::moe_inputs_fill(in, u, o);
  const auto cast = u.detach().to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(in.router, u.detach()));
  EXPECT_TRUE(torch::equal(in.experts, cast));
  ASSERT_EQ(in.rows.sizes(), torch::IntArrayRef({N * k, d}));
  auto inv = o.inverse.accessor<int64_t, 1>();
  for (int64_t pair = 0; pair < N * k; ++pair)
    EXPECT_TRUE(torch::equal(in.rows[inv[pair]], cast[pair / k])) << "pair " << pair;

  auto g_router = torch::randn({N, d});
  auto g_experts = torch::randn({N, d}).to(torch::kBFloat16);
  auto g_rows = torch::randn({N * k, d}).to(torch::kBFloat16);
  torch::autograd::backward({in.router, in.experts, in.rows}, {g_router, g_experts, g_rows});
  auto want = g_router.to(torch::kFloat64) + g_experts.to(torch::kFloat64);
  for (int64_t pair = 0; pair < N * k; ++pair) want[pair / k] += g_rows[inv[pair]].to(torch::kFloat64);
  ASSERT_EQ(u.grad().scalar_type(), torch::kFloat32);
  EXPECT_LT(max_abs_diff(u.grad(), want), 1e-5);  // five fp32 terms a value, each O(1)

  // Without the shared expert: no cast, and only the router's and the rows' gradients.
  auto u2 = u.detach().clone().requires_grad_(true);
  auto lone = model::moe_inputs_open(u2, k, torch::kBFloat16, /*with_experts=*/false);
  EXPECT_FALSE(lone.experts.defined());
  model::moe_inputs_fill(lone, u2, o);
  torch::autograd::backward({lone.rows}, {g_rows});
  EXPECT_LT(max_abs_diff(u2.grad(), want - g_router.to(torch::kFloat64) - g_experts.to(torch::kFloat64)), 1e-5);

  const auto other = model::expert_order(torch::randint(0, E, {(N + 1) * k}, torch::kInt64), k, E);
  auto in3 = model::moe_inputs_open(u, k, torch::kBFloat16, true);
  EXPECT_THROW(model::moe_inputs_fill(in3, u, other), c10::Error);
}

// The plain combine (γ already applied by the experts' SwiGLU) is the weighted one with γ = 1, and
// its gradient is dy gathered to each expert row.
TEST(Moe, PlainCombineSumsTheSlots) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 31);
  const int64_t N = 12, k = 3, d = 7, E = 5;
  auto opt = torch::TensorOptions().dtype(torch::kFloat64);
  const auto o = model::expert_order(torch::randint(0, E, {N * k}, torch::kInt64), k, E);
  auto ys = torch::randn({N * k, d}, opt).requires_grad_(true);
  auto add = torch::randn({N, d}, opt);
  auto y = model::combine_sum(ys, o, k, add);
  EXPECT_LT(max_abs_diff(y, model::combine_weighted(ys.detach(), o, torch::ones({N, k}, opt), add)), 1e-14);
  auto dy = torch::randn({N, d}, opt);
  y.backward(dy);
  EXPECT_TRUE(torch::equal(ys.grad(), dy.index_select(0, o.token)));
  EXPECT_THROW(model::combine_sum(ys.detach(), o, k, torch::zeros({N + 1, d}, opt)), c10::Error);
}

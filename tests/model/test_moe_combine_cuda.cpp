// The MoE combine and dispatch kernels (kernels/moe_combine.*, kernels/moe_routing.*, through
// model/moe_dispatch.h) against the fp64 ATen formulas on the same inputs: the γ-weighted combine
// (output, and the gradients of ys and γ; also with the shared expert's output added), the
// dispatch's gather (exactly) and its backward (each token's k rows summed); the MoE input's fan-out
// (exactly) and fan-in (kernels/moe_fan.*). fp32 and 16-bit, vector and scalar row widths, k from 1
// to the kernels' largest, one token. Fresh random inputs each run, seeded from GoogleTest's seed.
// Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/moe_combine.h"
#include "kernels/moe_fan.h"
#include "model/moe_dispatch.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::rel_norm_diff;

}  // namespace

TEST(MoECombineCuda, WeightedCombineAndDispatchBackwardMatchTheFormulas) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 5150);
  struct Case {
    int64_t N, k, d, E;
  };
  const Case cases[] = {{300, 6, 1024, 64}, {37, 2, 36, 5},  {1, 1, 8, 1},
                        {129, kernels::MOE_COMBINE_MAX_K, 40, 20}, {50, 3, 37, 7}};
  double worst[2] = {0, 0};
  for (const auto dt : {torch::kFloat32, torch::kBFloat16}) {
    // fp32: summation order. bf16: the kernel sums in fp32 and rounds once; the fp64 formula on the
    // same bf16 inputs differs by that one rounding (2⁻⁸ relative).
    const double tol = dt == torch::kFloat32 ? 1e-6 : 6e-3;
    for (const Case& c : cases) {
      auto opt = torch::TensorOptions().device(torch::kCUDA);
      auto flat = torch::randint(c.E, {c.N * c.k}, opt.dtype(torch::kInt64));
      const auto o = model::expert_order(flat, c.k, c.E);  // the counting-sort kernel (test_moe_routing_cuda)
      auto ys0 = torch::randn({c.N * c.k, c.d}, opt.dtype(dt));
      auto gamma0 = torch::rand({c.N, c.k}, opt.dtype(torch::kFloat32));
      auto dy = torch::randn({c.N, c.d}, opt.dtype(dt));

      auto ys = ys0.clone().requires_grad_(true), gamma = gamma0.clone().requires_grad_(true);
      auto y = model::combine_weighted(ys, o, gamma);
      y.backward(dy);
      // The formula in fp64: y[t] = Σ_j γ[t,j] ys[inverse[t·k+j]].
      auto ys64 = ys0.to(torch::kFloat64).requires_grad_(true), g64 = gamma0.to(torch::kFloat64).requires_grad_(true);
      auto y64 = (ys64.index_select(0, o.inverse).view({c.N, c.k, c.d}) * g64.unsqueeze(-1)).sum(1);
      y64.backward(dy.to(torch::kFloat64));
      // dγ[t, j] is one dot product of d terms, which can cancel to near 0: its error is measured
      // against the sum of the terms' magnitudes, Σ_c |dy[t, c] · ys[slot, c]|. Both dtypes sum
      // fp32-exact products in fp32, about √d · 2⁻²⁴ of that scale (≤ 2e-6 at d = 1024); 1e-5 leaves
      // margin and still catches a wrong term.
      auto terms = (ys64.detach().index_select(0, o.inverse).view({c.N, c.k, c.d}) *
                    dy.to(torch::kFloat64).unsqueeze(1)).abs().sum(-1);
      const double e_y = rel_norm_diff(y, y64), e_dys = rel_norm_diff(ys.grad(), ys64.grad());
      const double e_dg =
          ((gamma.grad().to(torch::kFloat64) - g64.grad()).abs() / terms.clamp_min(1e-300)).max().item<double>();
      EXPECT_EQ(y.scalar_type(), dt);
      EXPECT_LT(e_y, tol) << "N=" << c.N << " k=" << c.k << " d=" << c.d;
      EXPECT_LT(e_dys, tol) << "N=" << c.N << " k=" << c.k << " d=" << c.d;
      EXPECT_LT(e_dg, 1e-5) << "N=" << c.N << " k=" << c.k << " d=" << c.d;
      const int i = dt == torch::kFloat32 ? 0 : 1;
      worst[i] = std::max({worst[i], e_y, e_dys, e_dg});

      // With the shared expert's output added in the same pass: y + add, rounded once; add's
      // gradient is y's, exactly.
      auto add = torch::randn({c.N, c.d}, opt.dtype(dt)).requires_grad_(true);
      auto ya = model::combine_weighted(ys0, o, gamma0, add);
      ya.backward(dy);
      EXPECT_LT(rel_norm_diff(ya, y64.detach() + add.detach().to(torch::kFloat64)), tol)
          << "N=" << c.N << " k=" << c.k << " d=" << c.d;
      EXPECT_TRUE(torch::equal(add.grad(), dy)) << "N=" << c.N << " k=" << c.k << " d=" << c.d;

      // The dispatch's backward: each token's k expert-order rows summed.
      auto x = torch::randn({c.N, c.d}, opt.dtype(dt)).requires_grad_(true);
      auto xs = model::dispatch_rows(x, o, c.k);
      auto g = torch::randn_like(xs);
      xs.backward(g);
      auto dx64 = g.to(torch::kFloat64).index_select(0, o.inverse).view({c.N, c.k, c.d}).sum(1);
      EXPECT_TRUE(torch::equal(xs, x.detach().index_select(0, o.token)));
      EXPECT_LT(rel_norm_diff(x.grad(), dx64), tol) << "N=" << c.N << " k=" << c.k << " d=" << c.d;
    }
  }
  std::printf("moe combine vs fp64: worst fp32 %.2e, bf16 %.2e\n", worst[0], worst[1]);
}

// The MoE input's fan-out and fan-in kernels (kernels/moe_fan.*, through model::moe_inputs_open and
// _fill): the experts' copies equal the cast and the gathered cast bit for bit, and u's gradient is
// the fp64 sum of the router's (fp32), the shared expert's and the k rows' (16-bit) within fp32
// summation (at most 18 terms a value, each O(1)). bf16 and fp16 rows, vector and scalar widths,
// k from 1 to the kernels' largest, with and without the shared expert's and the router's
// gradients.
TEST(MoECombineCuda, InputsFanOutAndFanInMatchTheFormulas) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 5151);
  struct Case {
    int64_t N, k, d, E;
  };
  const Case cases[] = {{300, 6, 1024, 64}, {37, 2, 36, 5}, {1, 1, 8, 1}, {129, kernels::MOE_FAN_MAX_K, 40, 20},
                        {50, 3, 37, 7}, {64, 9, 264, 12}};
  auto opt = torch::TensorOptions().device(torch::kCUDA);
  double worst = 0;
  for (const auto dt : {torch::kBFloat16, torch::kFloat16}) {
    for (const Case& c : cases) {
      for (const bool with_experts : {true, false}) {
        const std::string what = "N=" + std::to_string(c.N) + " k=" + std::to_string(c.k) +
                                 " d=" + std::to_string(c.d) + (with_experts ? " shared" : " no shared");
        const auto o = model::expert_order(torch::randint(c.E, {c.N * c.k}, opt.dtype(torch::kInt64)), c.k, c.E);
        auto u = torch::randn({c.N, c.d}, opt.dtype(torch::kFloat32)).requires_grad_(true);
        ASSERT_TRUE(model::moe_inputs_fused(u, c.k, dt)) << what;
        auto in = model::moe_inputs_open(u, c.k, dt, with_experts);
        model::moe_inputs_fill(in, u, o);
        const auto cast = u.detach().to(dt);
        EXPECT_TRUE(torch::equal(in.rows, cast.index_select(0, o.token))) << what;
        if (with_experts) {
          EXPECT_TRUE(torch::equal(in.experts, cast)) << what;
        }

        auto g_router = torch::randn({c.N, c.d}, opt.dtype(torch::kFloat32));
        auto g_experts = torch::randn({c.N, c.d}, opt.dtype(dt));
        auto g_rows = torch::randn({c.N * c.k, c.d}, opt.dtype(dt));
        auto rows_sum = g_rows.to(torch::kFloat64).index_select(0, o.inverse).view({c.N, c.k, c.d}).sum(1);
        // With the router's gradient (and the shared expert's), then with the rows' alone.
        std::vector<torch::Tensor> outs = {in.router, in.rows}, grads = {g_router, g_rows};
        auto want = rows_sum + g_router.to(torch::kFloat64);
        if (with_experts) {
          outs.push_back(in.experts);
          grads.push_back(g_experts);
          want = want + g_experts.to(torch::kFloat64);
        }
        torch::autograd::backward(outs, grads);
        ASSERT_EQ(u.grad().scalar_type(), torch::kFloat32);
        const double e = rel_norm_diff(u.grad(), want);
        EXPECT_LT(e, 1e-6) << what;
        worst = std::max(worst, e);

        auto u2 = u.detach().clone().requires_grad_(true);
        auto lone = model::moe_inputs_open(u2, c.k, dt, false);
        model::moe_inputs_fill(lone, u2, o);
        lone.rows.backward(g_rows);
        EXPECT_LT(rel_norm_diff(u2.grad(), rows_sum), 1e-6) << what;
      }
    }
  }
  // What the kernels do not take goes the separate way.
  auto u = torch::randn({4, 8}, opt.dtype(torch::kFloat32));
  EXPECT_FALSE(model::moe_inputs_fused(u, kernels::MOE_FAN_MAX_K + 1, torch::kBFloat16));
  EXPECT_FALSE(model::moe_inputs_fused(u.to(torch::kBFloat16), 2, torch::kBFloat16));
  EXPECT_FALSE(model::moe_inputs_fused(u, 2, torch::kFloat32));
  std::printf("moe inputs' fan-in vs fp64: worst %.2e\n", worst);
}

// The plain combine (model::combine_sum, the router weights already applied in the experts'
// SwiGLU): y = add + Σ_j ys[inverse[t·k + j]] against fp64, its backward the fan-out of dy (each
// expert row gets its token's gradient, exactly) and add's gradient dy itself.
TEST(MoECombineCuda, PlainCombineSumsAndItsBackwardGathers) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 5152);
  struct Case {
    int64_t N, k, d, E;
  };
  const Case cases[] = {{300, 6, 1024, 64}, {37, 2, 36, 5}, {1, 1, 8, 1}, {129, kernels::MOE_FAN_MAX_K, 40, 20},
                        {50, 3, 37, 7}};
  auto opt = torch::TensorOptions().device(torch::kCUDA);
  for (const auto dt : {torch::kFloat32, torch::kBFloat16}) {
    const double tol = dt == torch::kFloat32 ? 1e-6 : 6e-3;  // one rounding of an fp32 sum
    for (const Case& c : cases) {
      for (const bool with_add : {true, false}) {
        const std::string what = "N=" + std::to_string(c.N) + " k=" + std::to_string(c.k) + " d=" + std::to_string(c.d);
        const auto o = model::expert_order(torch::randint(c.E, {c.N * c.k}, opt.dtype(torch::kInt64)), c.k, c.E);
        auto ys = torch::randn({c.N * c.k, c.d}, opt.dtype(dt)).requires_grad_(true);
        auto add = torch::randn({c.N, c.d}, opt.dtype(dt)).requires_grad_(true);
        auto y = model::combine_sum(ys, o, c.k, with_add ? add : torch::Tensor());
        auto want = ys.detach().to(torch::kFloat64).index_select(0, o.inverse).view({c.N, c.k, c.d}).sum(1);
        if (with_add) want = want + add.detach().to(torch::kFloat64);
        EXPECT_EQ(y.scalar_type(), dt);
        EXPECT_LT(rel_norm_diff(y, want), tol) << what;
        auto dy = torch::randn({c.N, c.d}, opt.dtype(dt));
        y.backward(dy);
        EXPECT_TRUE(torch::equal(ys.grad(), dy.index_select(0, o.token))) << what;
        if (with_add) {
          EXPECT_TRUE(torch::equal(add.grad(), dy)) << what;
        }
      }
    }
  }
}

// The MoE routing kernels (kernels/moe_routing.*, through model/moe_router.h and
// model/moe_dispatch.h) against their ATen references on the same inputs: the router's softmax and
// top-k (outputs and the logits' gradient, with and without renormalisation, with the aux loss's
// gradient through the mean over tokens, a random one, or none), and the pairs' order by expert
// (every field exactly, for even, skewed and single-expert assignments, sizes around the kernel's
// chunk). Fresh random inputs each run, seeded from GoogleTest's seed. Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "kernels/moe_routing.h"
#include "model/moe_dispatch.h"
#include "model/moe_router.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;

uint64_t test_seed(uint64_t salt) {
  return static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + salt;
}

}  // namespace

TEST(MoERoutingCuda, RouterTopKMatchesTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(test_seed(6101));
  struct Case {
    int64_t N, E, k;
  };
  // 16384 tokens: more than one wave of the forward's blocks, so its warps take several tokens each.
  const Case cases[] = {{16384, 64, 6}, {4096, 64, 6}, {300, 37, 3}, {129, 256, 16}, {77, 200, 8}, {5, 1, 1}, {9, 16, 16}, {1, 33, 2}};
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  double worst_fwd = 0, worst_bwd = 0;
  for (const Case& c : cases) {
    for (const bool norm : {true, false}) {
      // 0: dw only; 1: dw and the aux loss's mean over tokens (mean_probs); 2: dw and a random dprobs;
      // 3: all three.
      for (int grads = 0; grads < 4; ++grads) {
        const std::string what = "N=" + std::to_string(c.N) + " E=" + std::to_string(c.E) +
                                  " k=" + std::to_string(c.k) + " norm=" + std::to_string(norm) +
                                  " grads=" + std::to_string(grads);
        auto logits0 = torch::randn({c.N, c.E}, opt) * 2.0;
        auto dw = torch::randn({c.N, c.k}, opt);
        auto coef = torch::randn({c.E}, opt);
        auto dprobs = torch::randn({c.N, c.E}, opt);
        auto run = [&](bool kernel, torch::Tensor& dlogits) {
          auto logits = logits0.clone().requires_grad_(true);
          auto r = kernel ? model::router_topk(logits, c.k, norm) : model::router_topk_reference(logits, c.k, norm);
          auto loss = (r.w * dw).sum();
          if (grads == 1) loss = loss + (r.mean_probs * coef).sum();
          if (grads == 2) loss = loss + (r.probs * dprobs).sum();
          if (grads == 3) loss = loss + (r.mean_probs * coef).sum() + (r.probs * dprobs).sum();
          loss.backward();
          dlogits = logits.grad();
          return r;
        };
        torch::Tensor dk, dr;
        const auto got = run(true, dk);
        const auto want = run(false, dr);
        // The picks equal the reference's, in order, wherever the k + 1 largest probabilities are
        // apart by more than rounding (equal ones may come in either order: at 16k tokens of 64
        // random logits, some row holds two equal ones now and then).
        auto sorted = std::get<0>(torch::sort(want.probs, -1, /*descending=*/true));
        const int64_t ranked = std::min(c.k + 1, c.E);
        auto gap = ranked > 1 ? std::get<0>((sorted.narrow(1, 0, ranked - 1) - sorted.narrow(1, 1, ranked - 1)).min(1))
                              : torch::ones({c.N}, opt);
        auto clear = gap > 1e-6;
        auto same = (got.idx == want.idx).all(1);
        EXPECT_TRUE((same | ~clear).all().item<bool>()) << what;
        ASSERT_GT(clear.sum().item<int64_t>(), c.N / 2) << what;
        auto rows = clear.nonzero().squeeze(1);
        const double e_p = max_abs_diff(got.probs, want.probs);
        // The mean over tokens from the kernel's block sums: fp32 sums in another order.
        EXPECT_LT(max_abs_diff(got.mean_probs, want.mean_probs), 1e-6) << what;
        const double e_w = max_abs_diff(got.w.index_select(0, rows), want.w.index_select(0, rows));
        const double e_d = max_abs_diff(dk.index_select(0, rows), dr.index_select(0, rows)) /
                           std::max(dr.abs().max().item<double>(), 1e-30);
        // fp32 softmax and sums in another order: a few ulps of values ≤ 1.
        EXPECT_LT(e_p, 1e-6) << what;
        EXPECT_LT(e_w, 2e-6) << what;
        EXPECT_LT(e_d, 1e-5) << what;
        worst_fwd = std::max({worst_fwd, e_p, e_w});
        worst_bwd = std::max(worst_bwd, e_d);
        // Every row's picks are k distinct experts in range, in descending probability.
        auto picked = got.probs.gather(1, got.idx);
        EXPECT_TRUE((picked.narrow(1, 0, c.k - 1) >= picked.narrow(1, 1, c.k - 1)).all().item<bool>()) << what;
        EXPECT_TRUE(((got.idx >= 0) & (got.idx < c.E)).all().item<bool>()) << what;
        auto srt = std::get<0>(torch::sort(got.idx, -1));
        if (c.k > 1) {
          EXPECT_TRUE((srt.narrow(1, 1, c.k - 1) != srt.narrow(1, 0, c.k - 1)).all().item<bool>()) << what;
        }
      }
    }
  }
  // NaN logits still give k distinct experts in range (the layer's counting sort relies on it).
  auto bad = torch::full({3, 64}, std::numeric_limits<float>::quiet_NaN(), opt);
  auto r = model::router_topk(bad, 6, true);
  EXPECT_TRUE(((r.idx >= 0) & (r.idx < 64)).all().item<bool>());
  auto srt = std::get<0>(torch::sort(r.idx, -1));
  EXPECT_TRUE((srt.narrow(1, 1, 5) != srt.narrow(1, 0, 5)).all().item<bool>());
  std::printf("router top-k vs ATen: worst forward %.2e, backward %.2e (relative)\n", worst_fwd, worst_bwd);
}

TEST(MoERoutingCuda, ExpertOrderMatchesTheStableSort) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(test_seed(6102));
  struct Case {
    int64_t N, k, E;
    int skew;  // 0: uniform; 1: most pairs on one expert; 2: every pair on one expert
  };
  const Case cases[] = {{16384, 6, 64, 0}, {16384, 6, 64, 1}, {171, 6, 64, 1}, {1000, 1, 1024, 0},
                        {5, 3, 7, 0},      {2048, 2, 8, 2},   {1, 1, 1, 0},    {683, 3, 300, 1}};
  auto i64 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt64);
  for (const Case& c : cases) {
    const std::string what = "N=" + std::to_string(c.N) + " k=" + std::to_string(c.k) + " E=" + std::to_string(c.E) +
                             " skew=" + std::to_string(c.skew);
    auto flat = torch::randint(c.E, {c.N * c.k}, i64);
    if (c.skew == 1) flat = torch::where(torch::rand({c.N * c.k}, i64.dtype(torch::kFloat32)) < 0.7,
                                         torch::full_like(flat, c.E / 2), flat);
    if (c.skew == 2) flat.fill_(c.E - 1);
    const auto got = model::expert_order(flat, c.k, c.E);
    const auto want = model::expert_order_reference(flat, c.k, c.E);
    EXPECT_TRUE(torch::equal(got.order, want.order)) << what;
    EXPECT_TRUE(torch::equal(got.inverse, want.inverse)) << what;
    EXPECT_TRUE(torch::equal(got.token, want.token)) << what;
    EXPECT_TRUE(torch::equal(got.sorted, want.sorted)) << what;
    EXPECT_TRUE(torch::equal(got.counts, want.counts)) << what;
    EXPECT_TRUE(torch::equal(got.ends, want.ends)) << what;
    EXPECT_EQ(got.ends.scalar_type(), torch::kInt32) << what;
  }
}

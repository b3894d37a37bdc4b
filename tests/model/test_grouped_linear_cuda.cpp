// The MoE grouped linear (model/grouped_linear.h): the cuBLAS grouped GEMM path against the
// per-group matmul reference on the same GPU, output and both gradients, in fp32 and bf16, with
// groups of zero rows, odd sizes and a group holding most rows (skewed routing). Fresh random
// inputs each run, seeded from GoogleTest's seed. Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "model/grouped_linear.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::rel_norm_diff;

}  // namespace

TEST(GroupedLinearCuda, GroupedGemmMatchesPerGroupMatmuls) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 919);
  struct Case {
    std::vector<int64_t> rows;
    int64_t N, K;
  };
  const Case cases[] = {{{5, 0, 17, 1, 0, 40}, 24, 40},
                        {{300, 2, 0, 1}, 513, 130},
                        {{0, 0, 7}, 8, 8},
                        {{1000, 64, 64, 64, 64, 64, 64, 64}, 256, 96}};
  for (const auto dt : {torch::kFloat32, torch::kBFloat16}) {
    // fp32: summation order only. bf16: outputs are rounded to bf16 from fp32 sums on both sides.
    const double tol = dt == torch::kFloat32 ? 1e-5 : 8e-3;
    for (const Case& c : cases) {
      const int64_t M = std::accumulate(c.rows.begin(), c.rows.end(), int64_t{0});
      const int64_t E = static_cast<int64_t>(c.rows.size());
      auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      auto x0 = torch::randn({M, c.K}, opt), w0 = torch::randn({E, c.N, c.K}, opt) / 8;
      auto dy = torch::randn({M, c.N}, opt);
      auto run = [&](bool grouped) {
        auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
        auto y = grouped ? model::grouped_linear(x, w, c.rows) : model::grouped_linear_reference(x, w, c.rows);
        y.backward(dy);
        return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
      };
      const auto want = run(false), got = run(true);
      std::string what = std::string(dt == torch::kFloat32 ? "f32" : "bf16") + " N=" + std::to_string(c.N) +
                         " K=" + std::to_string(c.K) + " rows";
      for (const int64_t r : c.rows) what += " " + std::to_string(r);
      const char* names[] = {"y", "dx", "dw"};
      for (size_t i = 0; i < 3; ++i) {
        const double e = rel_norm_diff(got[i], want[i]);
        EXPECT_LT(e, tol) << what << ": " << names[i];
        std::printf("[grouped_linear] %s %s: %.1e\n", what.c_str(), names[i], e);
      }
      // Experts without rows get an exactly zero weight gradient.
      for (int64_t e = 0; e < E; ++e) {
        if (c.rows[static_cast<size_t>(e)] == 0) EXPECT_EQ(got[2][e].abs().max().item<float>(), 0.f) << what;
      }
    }
  }
}

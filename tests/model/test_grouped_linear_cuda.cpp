// The MoE grouped linear (model/grouped_linear.h): the cuBLAS grouped GEMM path (host counts) and
// the device-offset path (bf16, sm90/sm100) against the per-group matmul reference on the same GPU,
// output and both gradients, with groups of zero rows, odd sizes and a group holding most rows
// (skewed routing); and the MoE layer in bf16 making no host sync. Fresh random inputs each run,
// seeded from GoogleTest's seed. Skips without a GPU.
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "model/grouped_linear.h"
#include "model/model_config.h"
#include "model/moe.h"
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
        if (c.rows[static_cast<size_t>(e)] == 0) {
          EXPECT_EQ(got[2][e].abs().max().item<float>(), 0.f) << what;
        }
      }
    }
  }
}

TEST(GroupedLinearCuda, DeviceOffsetsMatchPerGroupMatmuls) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the device-offset grouped GEMM needs sm90/sm100";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 921);
  struct Case {
    std::vector<int64_t> rows;
    int64_t N, K;
  };
  // Empty groups first, inside and last; a one-row group; one group holding most rows.
  const Case cases[] = {{{0, 5, 0, 17, 1, 0, 40, 0}, 24, 40},
                        {{300, 2, 0, 1}, 512, 136},
                        {{1000, 64, 64, 64, 64, 64, 64, 3}, 256, 96}};
  for (const Case& c : cases) {
    const int64_t M = std::accumulate(c.rows.begin(), c.rows.end(), int64_t{0});
    const int64_t E = static_cast<int64_t>(c.rows.size());
    auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    auto x0 = torch::randn({M, c.K}, opt), w0 = torch::randn({E, c.N, c.K}, opt) / 8;
    auto dy = torch::randn({M, c.N}, opt);
    auto offsets = torch::tensor(c.rows, torch::kInt64).cumsum(0).to(torch::kInt32).to(torch::kCUDA);
    ASSERT_TRUE(model::grouped_linear_offsets_supported(x0, w0));
    auto run = [&](bool grouped) {
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      auto y = grouped ? model::grouped_linear_offsets(x, w, offsets) : model::grouped_linear_reference(x, w, c.rows);
      y.backward(dy);
      return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
    };
    const auto want = run(false), got = run(true);
    std::string what = "N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " rows";
    for (const int64_t r : c.rows) what += " " + std::to_string(r);
    const char* names[] = {"y", "dx", "dw"};
    for (size_t i = 0; i < 3; ++i) {
      // Both sides sum in fp32 and round once to bf16.
      const double e = rel_norm_diff(got[i], want[i]);
      EXPECT_LT(e, 8e-3) << what << ": " << names[i];
      std::printf("[grouped_linear offsets] %s %s: %.1e\n", what.c_str(), names[i], e);
    }
    for (int64_t e = 0; e < E; ++e) {
      if (c.rows[static_cast<size_t>(e)] == 0) {
        EXPECT_EQ(got[2][e].abs().max().item<float>(), 0.f) << what;
      }
    }
  }
  // Operands it does not take get a clear error.
  auto x = torch::randn({8, 12}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
  auto w = torch::randn({2, 16, 12}, x.options());
  auto offs = torch::tensor({4, 8}, torch::TensorOptions().dtype(torch::kInt32).device(torch::kCUDA));
  EXPECT_FALSE(model::grouped_linear_offsets_supported(x, w));
  EXPECT_THROW(model::grouped_linear_offsets(x, w, offs), c10::Error);
}

// The MoE layer in bf16 on a GPU that takes device offsets: forward and backward with the CUDA
// sync debug mode set to error (any device-to-host read throws), and the result against the
// per-expert reference of the same layer.
TEST(GroupedLinearCuda, MoeBf16MakesNoHostSync) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the device-offset grouped GEMM needs sm90/sm100";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 923);
  auto c = *model::make_preset("tiny-moe", model::Family::Hybrid);
  model::MoE m(c);
  m->to(torch::kCUDA);
  auto u0 = torch::randn({2, 96, c.d}, torch::TensorOptions().device(torch::kCUDA));
  auto R = torch::randn({2, 96, c.d}, u0.options());
  auto run = [&](bool fast) {
    m->zero_grad();
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    auto u = u0.clone().requires_grad_(true);
    if (fast) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    bool threw = false;
    std::string why;
    torch::Tensor y;
    try {
      auto out = fast ? m->forward(u) : m->forward_reference(u);
      (out.y.to(torch::kFloat32) * R).sum().add(out.aux_loss).backward();
      y = out.y.detach().to(torch::kFloat32);
    } catch (const c10::Error& e) {
      threw = true;
      why = e.what_without_backtrace();
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    EXPECT_FALSE(threw) << (fast ? "fast" : "reference") << " path: " << why;
    std::vector<torch::Tensor> g = {y, u.grad().defined() ? u.grad().clone() : torch::Tensor()};
    for (auto& p : m->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return g;
  };
  const auto fast = run(true), ref = run(false);
  ASSERT_TRUE(fast[0].defined() && fast[1].defined());
  for (size_t i = 0; i < fast.size(); ++i) {
    // bf16 products on both sides, summed in different orders and rounded at different points.
    const double e = rel_norm_diff(fast[i], ref[i]);
    EXPECT_LT(e, 2e-2) << "output/grad " << i;
    std::printf("[moe bf16 no-sync vs reference] tensor %zu: %.1e\n", i, e);
  }
}

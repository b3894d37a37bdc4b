// model::mixed_linear on the GPU: the weight-cast kernel bit for bit against torch::cat(...).to();
// the product's weight gradients accumulated in fp32 against fp64 (where autocast's path rounds
// them to bf16 first); and the Linear layers taking it inside a WeightGradInPlaceScope under
// autocast, with the same results as outside it. Fresh random inputs each run, odd sizes
// included. Skips without a GPU.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "model/linear.h"
#include "model/mixed_linear.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::rel_norm_diff;

#define DD_REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine"

void seed(uint64_t salt) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + salt);
}

// CUDA autocast to `dtype` while alive.
struct CudaAutocast {
  explicit CudaAutocast(at::ScalarType dtype) {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
    at::autocast::increment_nesting();
  }
  ~CudaAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, false);
  }
};

}  // namespace

TEST(MixedLinearCuda, WeightCastMatchesCatAndCastBitForBit) {
  DD_REQUIRE_GPU();
  seed(91);
  const std::vector<std::vector<int64_t>> row_sets = {{768}, {768, 256, 256}, {7, 5}, {3, 1, 4, 1}, {2, 2, 2, 2, 2}};
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t cols : {768, 37, 4}) {
      for (const auto& rows : row_sets) {
        std::vector<torch::Tensor> w;
        for (int64_t r : rows) w.push_back(torch::randn({r, cols}, torch::kCUDA) * 3);
        auto got = model::cast_weight_blocks(w, dtype);
        auto want = torch::cat(w, 0).to(dtype);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_TRUE(torch::equal(got, want)) << "cols " << cols << ", " << rows.size() << " blocks";
      }
    }
  }
  // A block that is a row slice of a wider matrix (not 16-byte aligned): the scalar path.
  auto big = torch::randn({9, 12}, torch::kCUDA);
  std::vector<torch::Tensor> w = {big.narrow(0, 1, 3), big.narrow(0, 5, 4)};
  EXPECT_TRUE(torch::equal(model::cast_weight_blocks(w, at::kBFloat16), torch::cat(w, 0).to(at::kBFloat16)));
}

TEST(MixedLinearCuda, WeightGradientsAccumulateInFp32) {
  DD_REQUIRE_GPU();
  seed(92);
  const int64_t in = 96;
  const std::vector<int64_t> rows = {64, 32, 33};
  std::vector<torch::Tensor> w;
  for (int64_t r : rows) w.push_back((torch::randn({r, in}, torch::kCUDA) * 0.1).requires_grad_(true));
  std::vector<torch::Tensor> want(w.size());
  for (size_t i = 0; i < w.size(); ++i) want[i] = torch::zeros({rows[i], in}, torch::dtype(torch::kFloat64).device(torch::kCUDA));
  auto wc = torch::cat(w, 0).detach().to(at::kBFloat16).to(torch::kFloat64);
  double worst_dx = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto x = torch::randn({3, 301, in}, torch::kCUDA).to(at::kBFloat16).requires_grad_(true);
    auto g = torch::randn({3, 301, 129}, torch::kCUDA).to(at::kBFloat16);
    model::mixed_linear(x, w, at::kBFloat16).backward(g);
    auto x2 = x.detach().to(torch::kFloat64).reshape({-1, in});
    auto g2 = g.to(torch::kFloat64).reshape({-1, 129});
    int64_t col = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      want[i] += g2.narrow(1, col, rows[i]).t().mm(x2);
      col += rows[i];
    }
    worst_dx = std::max(worst_dx, rel_norm_diff(x.grad().reshape({-1, in}), g2.mm(wc)));
  }
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(w[i].grad().scalar_type(), torch::kFloat32);
    worst = std::max(worst, rel_norm_diff(w[i].grad(), want[i]));
  }
  // Exact bf16 products summed in fp32 over 903 tokens and 3 backwards: ~1e-6. A gradient that had
  // passed through bf16 (autocast's path) would be off by ~2^-9.
  EXPECT_LT(worst, 2e-5);
  EXPECT_LT(worst_dx, 8e-3);
  std::printf("[measured] mixed_linear weight gradients vs fp64 after 3 backwards: %.3g; x gradient %.3g\n", worst,
              worst_dx);
}

TEST(MixedLinearCuda, LinearLayersTakeItInsideTheScope) {
  DD_REQUIRE_GPU();
  seed(93);
  const int64_t d = 64;
  model::Linear q(d, 96), k(d, 32), v(d, 32), o(96, d);
  for (auto* l : {&q, &k, &v, &o}) (*l)->to(torch::kCUDA);
  auto x0 = torch::randn({2, 17, d}, torch::kCUDA);
  auto g0 = torch::randn({2, 17, d}, torch::kCUDA);
  // The same forward and backward with the scope on (mixed_linear) and off (autocast's products).
  auto run = [&](bool in_place) {
    for (auto* l : {&q, &k, &v, &o}) (*l)->weight.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope(in_place);
      EXPECT_EQ(model::mixed_linear_applies(x, q->weight), in_place);
      auto qkv = model::linear_cat(x, {q, k, v});
      y = o(qkv.narrow(-1, 0, 96) * qkv.narrow(-1, 96, 32).repeat({1, 1, 3}));
    }
    y.backward(g0.to(y.scalar_type()));
    std::vector<torch::Tensor> out = {y.detach().clone(), x.grad().clone()};
    for (auto* l : {&q, &k, &v, &o}) out.push_back((*l)->weight.grad().clone());
    if (in_place) {
      // The fused q|k|v product's gradients are row blocks of one buffer.
      EXPECT_TRUE(q->weight.grad().storage().is_alias_of(v->weight.grad().storage()));
    }
    return out;
  };
  const auto a = run(true), b = run(false);
  const char* names[] = {"y", "dx", "dwq", "dwk", "dwv", "dwo"};
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].scalar_type(), b[i].scalar_type()) << names[i];
    // Both sides round bf16 products; the in-place weight gradients skip one bf16 rounding.
    EXPECT_LT(rel_norm_diff(a[i], b[i]), 1e-2) << names[i];
  }
}

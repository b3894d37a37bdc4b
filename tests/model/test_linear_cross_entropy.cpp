// The chunked linear + cross-entropy against the plain head (whole logits, then cross_entropy):
// loss and both gradients, on random inputs drawn fresh each run, with chunks that do not divide
// the rows, ignored targets and a softcap.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/linear_cross_entropy.h"

namespace {

struct Case {
  int64_t N, d, V, chunk;
  double softcap;
};

struct Result {
  torch::Tensor loss, dh, dw;
};

Result run(const torch::Tensor& h0, const torch::Tensor& w0, const torch::Tensor& t, bool chunked,
           const model::LinearCrossEntropyOptions& o) {
  auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  auto loss = chunked ? model::linear_cross_entropy(h, w, t, o) : model::linear_cross_entropy_reference(h, w, t, o.softcap);
  (loss * 1.7).backward();  // an incoming gradient other than 1
  return {loss.detach(), h.grad(), w.grad()};
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm().clamp_min(1e-30))
      .item<double>();
}

torch::Tensor random_targets(int64_t N, int64_t V) {
  auto t = torch::randint(0, V, {N}, torch::kInt64);
  t.index_put_({torch::rand({N}) < 0.2}, -1);  // about a fifth ignored
  return t;
}

}  // namespace

TEST(LinearCrossEntropy, MatchesThePlainHeadInFp32) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 21);
  for (const Case c : {Case{37, 16, 101, 8, 0}, Case{64, 32, 257, 64, 0}, Case{50, 24, 77, 13, 15.0}, Case{5, 8, 33, 0, 0}}) {
    auto h = torch::randn({c.N, c.d}), w = torch::randn({c.V, c.d}) * 0.3, t = random_targets(c.N, c.V);
    model::LinearCrossEntropyOptions o;
    o.chunk_rows = c.chunk;
    o.softcap = c.softcap;
    auto a = run(h, w, t, true, o), b = run(h, w, t, false, o);
    const std::string what = "N=" + std::to_string(c.N) + " V=" + std::to_string(c.V) + " chunk=" +
                             std::to_string(c.chunk) + " softcap=" + std::to_string(c.softcap);
    EXPECT_LT(rel(a.loss, b.loss), 1e-6) << what;
    EXPECT_LT(rel(a.dh, b.dh), 1e-5) << what;
    EXPECT_LT(rel(a.dw, b.dw), 1e-5) << what;
    // Evaluation (no grad) gives the same loss through the loss-only path.
    torch::NoGradGuard no_grad;
    EXPECT_LT(rel(model::linear_cross_entropy(h, w, t, o), b.loss), 1e-6) << what;
  }
}

// Under bf16 autocast both paths round the logits to bf16 and keep every statistic in fp32; the
// chunked one also accumulates dW over chunks in fp32, so they agree to bf16 rounding.
TEST(LinearCrossEntropy, MatchesThePlainHeadUnderBf16Autocast) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 22);
  auto h = torch::randn({45, 32}), w = torch::randn({131, 32}) * 0.2, t = random_targets(45, 131);
  model::LinearCrossEntropyOptions o;
  o.chunk_rows = 16;
  Result a, b;
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    a = run(h, w, t, true, o);
    b = run(h, w, t, false, o);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  EXPECT_EQ(a.loss.scalar_type(), torch::kFloat32);
  EXPECT_LT(rel(a.loss, b.loss), 1e-3);
  EXPECT_LT(rel(a.dh, b.dh), 2e-2);
  EXPECT_LT(rel(a.dw, b.dw), 2e-2);
}

TEST(LinearCrossEntropy, AllTargetsIgnoredGivesZeroLossAndGradients) {
  auto h = torch::randn({6, 4}), w = torch::randn({9, 4}), t = torch::full({6}, -1, torch::kInt64);
  auto a = run(h, w, t, true, {});
  EXPECT_EQ(a.loss.item<double>(), 0.0);
  EXPECT_EQ(a.dh.abs().max().item<double>(), 0.0);
  EXPECT_EQ(a.dw.abs().max().item<double>(), 0.0);
}

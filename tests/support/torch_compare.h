// What the model tests share: parameter counts, the largest and the relative difference of two
// tensors in fp64,
// and a single-threaded ATen for test binaries of tiny shapes.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

namespace testing_support {

// Σ numel over a module's parameters.
inline int64_t numel_sum(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// max |a − b| computed in fp64 on the CPU (0 for empty tensors); the shapes must match.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kCPU, torch::kFloat64) - b.to(torch::kCPU, torch::kFloat64)).abs().max().item<double>();
}

// ‖a − b‖ / ‖b‖ computed in fp64 on the CPU (an all-zero b compares absolutely); shapes must match.
inline double rel_norm_diff(const torch::Tensor& a, const torch::Tensor& b) {
  auto a64 = a.detach().to(torch::kCPU, torch::kFloat64), b64 = b.detach().to(torch::kCPU, torch::kFloat64);
  EXPECT_EQ(a64.sizes(), b64.sizes());
  return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item<double>();
}

// Tiny shapes gain nothing from ATen's intra-op threads and lose a lot to contention on a loaded
// 2-core machine (15-20x slower), so such binaries register this once.
class SingleThreadEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { at::set_num_threads(1); }
};

}  // namespace testing_support

// What the model tests share: parameter counts, the largest and the relative difference of two
// tensors in fp64, a single-threaded ATen for test binaries of tiny shapes, and for the GPU tests
// a skip without a GPU, seeds drawn from GoogleTest's random seed and a CUDA autocast scope.
#pragma once

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

// Skips the test where no GPU is present.
#define DD_REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine"

namespace testing_support {

// Seeds torch from GoogleTest's random seed (printed with every run, so --gtest_random_seed repeats
// a failing one) plus a per-test salt.
inline void seed_from_gtest(uint64_t salt) {
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
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;
};

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

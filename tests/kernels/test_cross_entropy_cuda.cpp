// The fused cross-entropy + gradient kernel against its double-precision reference, on random
// logits drawn fresh each run, fp32 and bf16 rows, odd vocabularies and ignored targets, each of
// the kernel's row paths (shared memory, registers, two passes).
#include <gtest/gtest.h>
#include <torch/torch.h>

#ifdef DD_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cross_entropy.h"

namespace {

void check(int64_t N, int64_t V, torch::ScalarType dtype, double tol_loss, double tol_grad) {
  auto z = torch::randn({N, V}) * 3.0;
  auto t = torch::randint(0, V, {N}, torch::kInt64);
  t.index_put_({torch::rand({N}) < 0.15}, -1);
  // The reference sees exactly the values the kernel reads (rounded to dtype).
  auto zq = z.to(dtype).to(torch::kFloat32).contiguous();
  auto ref = zq.clone();
  auto ref_loss = torch::empty({N});
  const double scale = 0.37;
  kernels::cross_entropy_grad_inplace_ref(ref.data_ptr<float>(), ref_loss.data_ptr<float>(), t.data_ptr<int64_t>(), N, V,
                                          scale);
  const torch::Device dev(torch::kCUDA, c10::cuda::current_device());
  auto zd = z.to(dtype).to(dev).contiguous();
  auto td = t.to(dev);
  auto loss = torch::empty({N}, torch::TensorOptions().device(dev));
  ASSERT_EQ(kernels::cross_entropy_grad_inplace(zd.data_ptr(), dtype == torch::kBFloat16, V, loss.data_ptr<float>(),
                                                td.data_ptr<int64_t>(), N, V, static_cast<float>(scale),
                                                c10::cuda::getCurrentCUDAStream().stream()),
            0);
  const double loss_err = (loss.cpu() - ref_loss).abs().max().item<double>();
  const double grad_err = (zd.cpu().to(torch::kFloat32) - ref).abs().max().item<double>();
  std::printf("N=%lld V=%lld %s: max |loss - ref| %.3g, max |grad - ref| %.3g\n", static_cast<long long>(N),
              static_cast<long long>(V), dtype == torch::kBFloat16 ? "bf16" : "fp32", loss_err, grad_err);
  EXPECT_LT(loss_err, tol_loss);
  EXPECT_LT(grad_err, tol_grad);
}

}  // namespace

#endif

TEST(CrossEntropyCuda, MatchesReference) {
#ifndef DD_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 31);
  // fp32: the kernel's fast exp against doubles; gradients are ≤ scale in size.
  check(33, 37, torch::kFloat32, 1e-4, 1e-6);
  check(64, 1000, torch::kFloat32, 1e-4, 1e-6);
  check(17, 50304, torch::kFloat32, 1e-4, 1e-6);
  // bf16: the gradient is stored in bf16 (8 bits of mantissa) — relative 2^-8 of ≤ scale. Rows up
  // to 57344 wide are staged in shared memory by default, or kept in registers (the switch off, and
  // 60000 either way); 321 (not a multiple of 8) and 131072 take the two-pass kernel.
  for (const bool staged : {true, false}) {
    kernels::cross_entropy_staged_rows(staged);
    std::printf("bf16 rows %s:\n", staged ? "staged in shared memory where they fit" : "in registers");
    check(41, 50304, torch::kBFloat16, 1e-4, 0.37 / 256);
    check(300, 1000, torch::kBFloat16, 1e-4, 0.37 / 256);
    check(9, 321, torch::kBFloat16, 1e-4, 0.37 / 256);
  }
  kernels::cross_entropy_staged_rows(true);
  check(5, 60000, torch::kBFloat16, 1e-4, 0.37 / 256);
  check(3, 131072, torch::kBFloat16, 1e-4, 0.37 / 256);
  // Every GPU of the process (the trainer drives them from threads of one process): the staged
  // rows' shared-memory opt-in is per device, so a second GPU must get its own.
  for (int d = 1; d < static_cast<int>(torch::cuda::device_count()); ++d) {
    c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(d));
    std::printf("GPU %d:\n", d);
    check(41, 50304, torch::kBFloat16, 1e-4, 0.37 / 256);
  }
#endif
}

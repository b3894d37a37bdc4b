// The CUDA RMSNorm kernel against its plain reference, on fresh random inputs of awkward sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/rmsnorm.h"

TEST(RmsNormCuda, MatchesReference) {
#ifndef DD_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  for (auto [N, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 60}, {63, 768}, {1000, 4097}, {7, 2048}}) {
    auto x = torch::randn({N, C});
    auto w = torch::rand({C}) + 0.5;
    auto ref = torch::full({N, C}, NAN);
    kernels::rmsnorm_forward_ref(ref.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), N, C, 1e-6);
    auto xd = x.cuda(), wd = w.cuda();
    auto out = torch::full({N, C}, NAN, xd.options());
    ASSERT_EQ(kernels::rmsnorm_forward(out.data_ptr<float>(), xd.data_ptr<float>(), wd.data_ptr<float>(), N, C, 1e-6f,
                                       nullptr),
              0);
    const double err = (out.cpu() - ref).abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << "N=" << N << " C=" << C;
    // Weight-free form.
    ASSERT_EQ(kernels::rmsnorm_forward(out.data_ptr<float>(), xd.data_ptr<float>(), nullptr, N, C, 1e-6f, nullptr), 0);
    kernels::rmsnorm_forward_ref(ref.data_ptr<float>(), x.data_ptr<float>(), nullptr, N, C, 1e-6);
    EXPECT_LE((out.cpu() - ref).abs().max().item<double>(), 1e-5);
  }
#endif
}

// The delta rule backward's products with the chunk states (model/gdr_state_grads.h) on the CPU,
// where they are the reference's batched products and row dot: against fp64 with fp32 and with
// bf16 states, the output gradient read directly and through a row map with zero rows, and the
// errors for inputs of the wrong shape.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "model/gdr_state_grads.h"
#include "tests/support/gdr_state_grads_truth.h"

namespace {

double max_rel(const torch::Tensor& x, const torch::Tensor& ref) {
  auto r = ref.to(torch::kFloat64);
  return (x.to(torch::kFloat64) - r).abs().max().item<double>() / r.abs().max().item<double>();
}

}  // namespace

TEST(GdrStateGrads, ReferenceMatchesFp64) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 31);
  const int64_t R = 3, C = 8, dk = 6, dv = 5;
  for (const bool bf16_states : {false, true}) {
    for (const bool row_map : {false, true}) {
      const auto states = torch::TensorOptions().dtype(bf16_states ? torch::kBFloat16 : torch::kFloat32);
      auto h_in = torch::randn({R, dk, dv}, states), dh_next = torch::randn({R, dk, dv}, states);
      auto v_new = torch::randn({R, C, dv}, states);
      auto dU = torch::randn({R, C, dv});
      torch::Tensor dO_src = torch::randn({R * C + 4, dv}), dO_rows;
      if (row_map) {
        auto map = torch::randperm(R * C + 4).narrow(0, 0, R * C);
        map.index_put_({torch::arange(0, R * C, 5)}, -1);
        dO_rows = map.to(torch::kInt32);
      } else {
        dO_src = dO_src.narrow(0, 0, R * C).contiguous();
      }
      const auto got = model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, 0.3);
      const auto t = testing_support::gdr_state_grads_fp64(dO_src, dO_rows, dU, h_in, dh_next, v_new, 0.3);
      const std::string what = std::string(bf16_states ? "bf16" : "fp32") + (row_map ? ", row map" : "");
      EXPECT_LT(max_rel(got.dP_raw, t.dP_raw), 1e-6) << what;
      EXPECT_LT(max_rel(got.dQg, t.dQg), 1e-6) << what;
      EXPECT_LT(max_rel(got.dW, t.dW), 1e-6) << what;
      EXPECT_LT(max_rel(got.dKd, t.dKd), 1e-6) << what;
      // ddecay sums dk·dv = 30 products a row, which can cancel: against the largest row's sum its
      // fp32 error reached 1.04e-6 (inputs fresh each run), so 4e-6.
      EXPECT_LT(max_rel(got.ddecay, t.ddecay), 4e-6) << what;
      if (row_map) {
        EXPECT_EQ(got.dQg.view({R * C, dk})[5].abs().max().item<float>(), 0.f) << "a −1 entry gives a zero row";
      }
    }
  }
}

TEST(GdrStateGrads, WrongShapesNameWhatIsWrong) {
  const auto h = torch::randn({2, 4, 3}), vn = torch::randn({2, 8, 3}), dU = torch::randn({2, 8, 3});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { model::gdr_state_grads(torch::randn({16, 4}), {}, dU, h, h, vn, 1.0); }).find("dO rows"),
            std::string::npos);
  EXPECT_NE(message([&] { model::gdr_state_grads(torch::randn({15, 3}), {}, dU, h, h, vn, 1.0); }).find("no row map"),
            std::string::npos);
  EXPECT_NE(message([&] {
              model::gdr_state_grads(torch::randn({20, 3}), torch::zeros({7}, torch::kInt32), dU, h, h, vn, 1.0);
            }).find("row map has 7 entries"),
            std::string::npos);
  EXPECT_NE(message([&] { model::gdr_state_grads(torch::randn({16, 3}), {}, dU, h, torch::randn({2, 5, 3}), vn, 1.0); })
                .find("dh_next"),
            std::string::npos);
}

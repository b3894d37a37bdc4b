// The MoE grouped linear (model/grouped_linear.h): the cuBLAS grouped GEMM path (host counts) and
// the device-offset path (bf16, sm90/sm100) against the per-group matmul reference on the same GPU,
// output and both gradients, with groups of zero rows, odd sizes and a group holding most rows
// (skewed routing); and the MoE layer in bf16 making no host sync. Fresh random inputs each run,
// seeded from GoogleTest's seed. Skips without a GPU.
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/block_grads.h"
#include "kernels/expert_grad_pieces.h"
#include "model/expert_grads_in_pieces.h"
#include "model/expert_product.h"
#include "model/grad_square_sums.h"
#include "model/grouped_linear.h"
#include "model/kernel_dtype.h"
#include "model/mixed_linear.h"
#include "model/model_config.h"
#include "model/moe.h"
#include "model/weight_shadow.h"
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
  auto run = [&](bool fast, bool in_place) {
    m->zero_grad();
    model::WeightGradInPlaceScope scope(in_place);
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
  model::clear_weight_shadows();
  const auto ref = run(false, false);
  // Through autograd, then with the experts' weight shadows and in-place gradients
  // (model/expert_product.h): twice, the second reusing the shadows the first made.
  for (const bool in_place : {false, true, true}) {
    const auto fast = run(true, in_place);
    ASSERT_TRUE(fast[0].defined() && fast[1].defined());
    for (size_t i = 0; i < fast.size(); ++i) {
      // bf16 products on both sides, summed in different orders and rounded at different points.
      const double e = rel_norm_diff(fast[i], ref[i]);
      EXPECT_LT(e, 2e-2) << (in_place ? "in place: " : "autograd: ") << "output/grad " << i;
      std::printf("[moe bf16 no-sync vs reference, %s] tensor %zu: %.1e\n", in_place ? "in place" : "autograd", i, e);
    }
  }
  EXPECT_TRUE(model::weight_shadow_of(m->gate).defined()) << "the in-place path kept no shadow of the experts' gate";
  EXPECT_TRUE(model::weight_shadow_of(m->down).defined()) << "the in-place path kept no shadow of the experts' down";
  model::clear_weight_shadows();
}

// expert_product (model/expert_product.h) against the same product through autograd: bf16 x, fp32
// stacked weights cast to bf16 and concatenated, grouped_linear_offsets. y and dx come from the
// same GEMMs on the same bf16 values; each weight's fp32 .grad from one bf16 weight-gradient GEMM
// on both sides (their kernels may sum in other orders): written the first time, added the second.
// Empty experts (first, inside, last) get exactly zero gradients. The weights' bf16 shadow is
// the stacked cast, bit for bit.
TEST(GroupedLinearCuda, ExpertProductMatchesTheAutogradPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the device-offset grouped GEMM needs sm90/sm100";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 927);
  struct Case {
    std::vector<int64_t> rows;
    std::vector<int64_t> n;  // each weight's rows per expert
    int64_t K;
  };
  const Case cases[] = {{{0, 5, 0, 17, 1, 0, 40, 0}, {24, 16}, 40},
                        {{300, 2, 0, 1}, {512}, 136},
                        {{1000, 64, 64, 64, 64, 64, 64, 3}, {96, 96, 32}, 256}};
  model::clear_weight_shadows();
  for (const Case& c : cases) {
    const int64_t M = std::accumulate(c.rows.begin(), c.rows.end(), int64_t{0});
    const int64_t E = static_cast<int64_t>(c.rows.size());
    auto f32 = torch::TensorOptions().device(torch::kCUDA);
    auto x0 = torch::randn({M, c.K}, f32.dtype(torch::kBFloat16));
    std::vector<torch::Tensor> w0;
    int64_t N = 0;
    for (const int64_t n : c.n) {
      w0.push_back(torch::randn({E, n, c.K}, f32) / 8);
      N += n;
    }
    auto offsets = torch::tensor(c.rows, torch::kInt64).cumsum(0).to(torch::kInt32).to(torch::kCUDA);
    std::string what = "N=" + std::to_string(N) + " K=" + std::to_string(c.K) + " rows";
    for (const int64_t r : c.rows) what += " " + std::to_string(r);
    // Autograd's path; ours on its own copies of the weights. Two backwards each, dy then dy2.
    auto dy = torch::randn({M, N}, x0.options()), dy2 = torch::randn({M, N}, x0.options());
    auto run = [&](bool ours) {
      std::vector<torch::Tensor> w;
      for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
      auto x = x0.clone().requires_grad_(true);
      std::vector<torch::Tensor> out;
      for (const auto& g : {dy, dy2}) {
        torch::Tensor y;
        if (ours) {
          model::WeightGradInPlaceScope scope;
          EXPECT_TRUE(model::expert_product_applies(x, w, torch::kBFloat16)) << what;
          y = model::expert_product(x, w, offsets, torch::kBFloat16);
        } else {
          std::vector<torch::Tensor> cast;
          for (const auto& t : w) cast.push_back(t.to(torch::kBFloat16));
          y = model::grouped_linear_offsets(x, torch::cat(cast, 1), offsets);
        }
        y.backward(g);
        out.push_back(y.detach());
        out.push_back(x.grad().clone());
        for (const auto& t : w) out.push_back(t.grad().clone());
      }
      if (ours) {
        // The shadow: the stacked weights' cast, each weight's block of it.
        auto shadow = model::shadowed_expert_blocks(w, torch::kBFloat16);
        std::vector<torch::Tensor> cast;
        for (const auto& t : w) cast.push_back(t.detach().to(torch::kBFloat16));
        EXPECT_TRUE(torch::equal(shadow, torch::cat(cast, 1))) << what;
        for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(torch::equal(model::weight_shadow_of(w[i]), cast[i])) << what;
      }
      return out;
    };
    const auto want = run(false);
    // The weight gradients unsplit (0), in pieces of 7 and 16 rows (experts of 17 to 1000 rows cut
    // into up to 143 pieces, an uneven last piece), and by the default rule.
    for (const int64_t piece : {int64_t{0}, int64_t{7}, int64_t{16}, int64_t{-1}}) {
      model::expert_grad_piece_rows(piece);
      const auto got = run(true);
      const std::string at = what + " pieces " + std::to_string(piece);
      ASSERT_EQ(want.size(), got.size());
      const size_t per = 2 + w0.size();
      for (size_t i = 0; i < got.size(); ++i) {
        const size_t j = i % per;
        const std::string name = (i < per ? "first " : "second ") + std::string(j == 0 ? "y" : j == 1 ? "dx" : "dw") +
                                 (j >= 2 ? std::to_string(j - 2) : "");
        const double e = rel_norm_diff(got[i], want[i]);
        // y and dx: the same GEMM on the same values. dw: one bf16 rounding of fp32 sums, either
        // order (in pieces: each piece's partial sum rounded once, the pieces summed in fp32).
        EXPECT_LT(e, j < 2 ? 1e-6 : 8e-3) << at << ": " << name;
        std::printf("[expert_product] %s %s: %.1e\n", at.c_str(), name.c_str(), e);
        if (j >= 2) {
          for (int64_t e2 = 0; e2 < E; ++e2) {
            if (c.rows[static_cast<size_t>(e2)] == 0) {
              EXPECT_EQ(got[i][e2].abs().max().item<float>(), 0.f) << at << " " << name;
            }
          }
        }
      }
    }
    model::expert_grad_piece_rows(-1);
  }
  model::clear_weight_shadows();
}

// While a step collects them (model/grad_square_sums.h), the experts' backward records each weight's
// ‖grad‖² as its scatter wrote it: within 1e-6 of the fp64 sum after the first backward and after a
// second that adds into .grad (grad accumulation), in pieces and unsplit; nothing outside a scope.
TEST(GroupedLinearCuda, ExpertProductRecordsItsGradientsSquareSums) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the device-offset grouped GEMM needs sm90/sm100";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 933);
  const std::vector<int64_t> rows = {300, 0, 41, 1000, 64, 7};
  const int64_t E = static_cast<int64_t>(rows.size()), K = 256, M = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const at::Device gpu(torch::kCUDA, 0);
  auto offsets = torch::tensor(rows, torch::kInt64).cumsum(0).to(torch::kInt32).to(gpu);
  auto x = torch::randn({M, K}, torch::TensorOptions().device(gpu).dtype(torch::kBFloat16));
  model::clear_weight_shadows();
  for (const int64_t piece : {int64_t{0}, int64_t{-1}}) {
    model::expert_grad_piece_rows(piece);
    std::vector<torch::Tensor> w = {(torch::randn({E, 96, K}, gpu) / 8).requires_grad_(true),
                                    (torch::randn({E, 32, K}, gpu) / 8).requires_grad_(true)};
    auto backward = [&] {
      model::WeightGradInPlaceScope scope;
      ASSERT_TRUE(model::expert_product_applies(x, w, torch::kBFloat16));
      model::expert_product(x, w, offsets, torch::kBFloat16).backward(torch::randn({M, 128}, x.options()));
    };
    {
      model::GradSquareSumsScope collect(gpu, true);
      for (int pass = 0; pass < 2; ++pass) {
        backward();
        for (size_t i = 0; i < w.size(); ++i) {
          const auto got = model::recorded_grad_square_sum(w[i]);
          ASSERT_TRUE(got.defined()) << "piece " << piece << " pass " << pass << " weight " << i;
          const double want = w[i].grad().to(torch::kFloat64).pow(2).sum().item<double>();
          EXPECT_NEAR(got.item<double>(), want, 1e-6 * want) << "piece " << piece << " pass " << pass << " weight " << i;
        }
      }
    }
    EXPECT_FALSE(model::recorded_grad_square_sum(w[0]).defined());
    backward();  // outside a scope: nothing recorded
    EXPECT_FALSE(model::recorded_grad_square_sum(w[0]).defined());
  }
  model::expert_grad_piece_rows(-1);
  model::clear_weight_shadows();
}

// Inside an ExpertGradsInPiecesScope the experts' backward leaves .grad undefined and records its
// pieces (model/expert_grads_in_pieces.h): written out they are the .grad the backward writes outside
// the scope, bit for bit; a second backward in the scope writes the first's pieces out and adds to
// them, as two backwards outside would; the recorded sums of squares are within 1e-6 of fp64; the
// scope's end forgets what is left. Unsplit, in pieces of 7 rows and by the default rule.
TEST(GroupedLinearCuda, ExpertGradsLeftInPiecesMatchTheScatteredGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the device-offset grouped GEMM needs sm90/sm100";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 935);
  const std::vector<int64_t> rows = {300, 0, 41, 1000, 64, 7};
  const int64_t E = static_cast<int64_t>(rows.size()), K = 256, M = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const at::Device gpu(torch::kCUDA, 0);
  auto offsets = torch::tensor(rows, torch::kInt64).cumsum(0).to(torch::kInt32).to(gpu);
  auto x = torch::randn({M, K}, torch::TensorOptions().device(gpu).dtype(torch::kBFloat16));
  const std::vector<torch::Tensor> w0 = {torch::randn({E, 96, K}, gpu) / 8, torch::randn({E, 32, K}, gpu) / 8};
  const auto dy1 = torch::randn({M, 128}, x.options()), dy2 = torch::randn({M, 128}, x.options());
  model::clear_weight_shadows();
  for (const int64_t piece : {int64_t{0}, int64_t{7}, int64_t{-1}}) {
    model::expert_grad_piece_rows(piece);
    const std::string at = "piece " + std::to_string(piece);
    auto fresh = [&] {
      std::vector<torch::Tensor> w;
      for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
      return w;
    };
    auto backward = [&](std::vector<torch::Tensor>& w, const torch::Tensor& dy) {
      model::WeightGradInPlaceScope scope;
      ASSERT_TRUE(model::expert_product_applies(x, w, torch::kBFloat16));
      model::expert_product(x, w, offsets, torch::kBFloat16).backward(dy);
    };
    // Outside the scope: .grad after one backward and after two.
    auto ref = fresh();
    backward(ref, dy1);
    std::vector<torch::Tensor> once;
    for (const auto& t : ref) once.push_back(t.grad().clone());
    backward(ref, dy2);

    auto w = fresh();
    {
      model::ExpertGradsInPiecesScope scope(gpu, true);
      model::GradSquareSumsScope sums(gpu, true);
      ASSERT_TRUE(model::expert_grads_in_pieces(gpu));
      backward(w, dy1);
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_FALSE(w[i].grad().defined()) << at << " weight " << i;
        const auto* gp = model::expert_grad_pieces_of(w[i]);
        ASSERT_NE(gp, nullptr) << at << " weight " << i;
        EXPECT_EQ(gp->rows, w[i].size(1));
        const double want = once[i].to(torch::kFloat64).pow(2).sum().item<double>();
        const auto got = model::recorded_grad_square_sum(w[i]);
        ASSERT_TRUE(got.defined()) << at;
        EXPECT_NEAR(got.item<double>(), want, 1e-6 * want) << at << " weight " << i;
      }
      EXPECT_EQ(model::materialize_expert_grad_pieces(), 2) << at;
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_EQ(model::expert_grad_pieces_of(w[i]), nullptr) << at;
        ASSERT_TRUE(w[i].grad().defined()) << at;
        EXPECT_TRUE(torch::equal(w[i].grad(), once[i])) << at << " weight " << i << ": written out";
      }
      // Again from the start, now with a second backward in the scope.
      for (auto& t : w) t.mutable_grad() = torch::Tensor();
      backward(w, dy1);
      backward(w, dy2);
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_EQ(model::expert_grad_pieces_of(w[i]), nullptr) << at;
        ASSERT_TRUE(w[i].grad().defined()) << at;
        EXPECT_TRUE(torch::equal(w[i].grad(), ref[i].grad())) << at << " weight " << i << ": two backwards";
      }
      for (auto& t : w) t.mutable_grad() = torch::Tensor();
      backward(w, dy1);  // left in pieces when the scope ends
    }
    EXPECT_FALSE(model::expert_grads_in_pieces(gpu));
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(model::expert_grad_pieces_of(w[i]), nullptr) << at << ": kept after the scope";
      EXPECT_FALSE(w[i].grad().defined()) << at;
    }
  }
  model::expert_grad_piece_rows(-1);
  model::clear_weight_shadows();
}

// The pieces of the experts' rows (kernels/expert_grad_pieces.h) against the same cut on the host:
// experts without rows (first, inside, last), rows that are and are not multiples of the piece, one
// expert holding most rows, and the empty groups after the last piece ending where it ends.
TEST(GroupedLinearCuda, ExpertGradPiecesCutEachExpertsRows) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 933);
  std::vector<std::vector<int64_t>> cases = {{0, 5, 0, 17, 1, 0, 40, 0}, {64, 64, 64, 64}, {3}};
  std::vector<int64_t> skewed(300);  // more experts than one warp; one takes most rows
  for (auto& r : skewed) r = torch::randint(0, 40, {1}).item<int64_t>();
  skewed[7] = 5000;
  cases.push_back(skewed);
  for (const auto& rows : cases) {
    for (const int64_t piece : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{10000}}) {
      const int64_t E = static_cast<int64_t>(rows.size());
      const int64_t R = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      const int64_t G = kernels::expert_pieces_bound(E, R, piece);
      std::vector<int32_t> want_ends, want_first, want_count;
      int64_t start = 0;
      for (const int64_t n : rows) {
        want_first.push_back(static_cast<int32_t>(want_ends.size()));
        want_count.push_back(static_cast<int32_t>((n + piece - 1) / piece));
        for (int64_t done = piece; done - piece < n; done += piece)
          want_ends.push_back(static_cast<int32_t>(start + std::min(done, n)));
        start += n;
      }
      ASSERT_LE(static_cast<int64_t>(want_ends.size()), G);
      want_ends.resize(static_cast<size_t>(G), static_cast<int32_t>(R));
      auto ends = torch::tensor(rows, torch::kInt64).cumsum(0).to(torch::kInt32).to(torch::kCUDA);
      auto out = torch::full({G + 2 * E}, -7, ends.options());
      model::check_kernel_launch(
          kernels::expert_grad_pieces(ends.data_ptr<int32_t>(), E, piece, G, out.data_ptr<int32_t>(),
                                      out.data_ptr<int32_t>() + G, out.data_ptr<int32_t>() + G + E, model::stream_of(ends)),
          "expert_grad_pieces");
      auto host = out.cpu();
      const int32_t* h = host.data_ptr<int32_t>();
      const std::string what = "E=" + std::to_string(E) + " piece=" + std::to_string(piece);
      EXPECT_EQ(std::vector<int32_t>(h, h + G), want_ends) << what;
      EXPECT_EQ(std::vector<int32_t>(h + G, h + G + E), want_first) << what;
      EXPECT_EQ(std::vector<int32_t>(h + G + E, h + G + 2 * E), want_count) << what;
    }
  }
}

// The gradient scatter kernel (kernels/block_grads.h) against narrow + cast (+ add) per block:
// 16-byte runs and element by element (odd widths), written and added, several experts. Its square
// partials: every row written, and the column sums within 1e-6 of each block's fp64 ‖grad‖² as
// written (one case fills the 4096-block grid, so threads take more than one run).
TEST(GroupedLinearCuda, BlockGradScatterMatchesNarrowAndCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 929);
  struct Case {
    int64_t E;
    std::vector<int64_t> rows;
    int64_t C;
  };
  const Case cases[] = {{4, {24, 16}, 40}, {1, {7}, 13}, {3, {5, 1, 9, 2}, 8}, {64, {64, 64}, 128}, {16, {512, 512}, 640}};
  // Partials [grid, n] for b, filled with NaN so a row the kernel skips shows.
  auto square_partials_for = [](kernels::GradBlocks& b) {
    auto p = torch::full({kernels::scatter_block_grads_grid(b), b.n}, NAN,
                         torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat64));
    b.square_partials = p.data_ptr<double>();
    return p;
  };
  auto expect_square_sums = [](const torch::Tensor& partials, const std::vector<torch::Tensor>& written,
                               const std::string& what) {
    EXPECT_TRUE(torch::isfinite(partials).all().item<bool>()) << what << ": a row of partials was not written";
    const auto sums = partials.sum(0).cpu();
    for (size_t i = 0; i < written.size(); ++i) {
      const double want = written[i].to(torch::kFloat64).pow(2).sum().item<double>();
      EXPECT_NEAR(sums[static_cast<int64_t>(i)].item<double>(), want, 1e-6 * want) << what << " block " << i;
    }
  };
  for (const auto dt : {torch::kBFloat16, torch::kHalf}) {
    for (const Case& c : cases) {
      int64_t N = 0;
      for (const int64_t r : c.rows) N += r;
      auto src = torch::randn({c.E, N, c.C}, torch::TensorOptions().device(torch::kCUDA).dtype(dt));
      kernels::GradBlocks b;
      b.n = static_cast<int>(c.rows.size());
      b.cols = c.C;
      b.experts = c.E;
      std::vector<torch::Tensor> got, want;
      int64_t col = 0;
      for (int i = 0; i < b.n; ++i) {
        const int64_t r = c.rows[static_cast<size_t>(i)];
        auto before = torch::randn({c.E, r, c.C}, src.options().dtype(torch::kFloat));
        const bool add = i % 2 == 1;
        got.push_back(before.clone());
        want.push_back(add ? before + src.narrow(1, col, r).to(torch::kFloat) : src.narrow(1, col, r).to(torch::kFloat));
        b.dst[i] = got.back().data_ptr<float>();
        b.rows[i] = r;
        b.add[i] = add;
        col += r;
      }
      auto partials = square_partials_for(b);
      model::check_kernel_launch(kernels::scatter_block_grads(src.data_ptr(), dt == torch::kHalf ? kernels::DType::F16 : kernels::DType::BF16, b,
                                                              model::stream_of(src)),
                                 "scatter_block_grads");
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(torch::equal(got[i], want[i])) << "E=" << c.E << " C=" << c.C << " block " << i;
      expect_square_sums(partials, want, "E=" + std::to_string(c.E) + " C=" + std::to_string(c.C));
      {
        // No destinations: the squares of the source's blocks alone, nothing written.
        kernels::GradBlocks m = b;
        std::vector<torch::Tensor> blocks;
        int64_t at = 0;
        for (int i = 0; i < m.n; ++i) {
          m.dst[i] = nullptr;
          blocks.push_back(src.narrow(1, at, c.rows[static_cast<size_t>(i)]).to(torch::kFloat));
          at += c.rows[static_cast<size_t>(i)];
        }
        auto measured = square_partials_for(m);
        model::check_kernel_launch(kernels::scatter_block_grads(src.data_ptr(), dt == torch::kHalf ? kernels::DType::F16 : kernels::DType::BF16,
                                                                m, model::stream_of(src)),
                                   "scatter_block_grads, squares only");
        expect_square_sums(measured, blocks, "squares only E=" + std::to_string(c.E) + " C=" + std::to_string(c.C));
        for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "squares only wrote block " << i;
        m.square_partials = nullptr;
        EXPECT_NE(kernels::scatter_block_grads(src.data_ptr(), kernels::DType::BF16, m, model::stream_of(src)), 0)
            << "no destinations and no partials must be refused";
        if (m.n > 1) {
          // Some destinations null, some not: neither a scatter nor a squares-only pass.
          kernels::GradBlocks mixed = b;
          mixed.dst[1] = nullptr;
          auto mixed_partials = square_partials_for(mixed);
          EXPECT_NE(kernels::scatter_block_grads(src.data_ptr(), kernels::DType::BF16, mixed, model::stream_of(src)), 0)
              << "a launch with some destinations null must be refused";
          for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << "a refused launch wrote block " << i;
          torch::cuda::synchronize();
          EXPECT_TRUE(torch::isnan(mixed_partials).all().item<bool>()) << "a refused launch wrote square partials";
        }
      }

      // From pieces: expert e sums pieces first[e] .. first[e] + count[e] − 1 of a [G, N, C] source
      // in fp32 (none: zero). Pieces are visited in order, as the sum on the host adds them.
      std::vector<int32_t> first, count;
      int32_t g = 0;
      for (int64_t e = 0; e < c.E; ++e) {
        first.push_back(g);
        count.push_back(static_cast<int32_t>(e % 3));
        g += count.back();
      }
      auto pieces = torch::randn({g + 2, N, c.C}, src.options());  // two unused pieces at the end
      auto meta = torch::tensor(first, torch::kInt32).to(torch::kCUDA);
      auto meta_count = torch::tensor(count, torch::kInt32).to(torch::kCUDA);
      b.piece_first = meta.data_ptr<int32_t>();
      b.piece_count = meta_count.data_ptr<int32_t>();
      auto summed = torch::zeros({c.E, N, c.C}, src.options().dtype(torch::kFloat));
      for (int64_t e = 0; e < c.E; ++e)
        for (int32_t p = 0; p < count[static_cast<size_t>(e)]; ++p) summed[e] += pieces[first[static_cast<size_t>(e)] + p].to(torch::kFloat);
      col = 0;
      for (int i = 0; i < b.n; ++i) {
        const int64_t r = c.rows[static_cast<size_t>(i)];
        auto before = torch::randn({c.E, r, c.C}, src.options().dtype(torch::kFloat));
        const bool add = i % 2 == 0;
        got[static_cast<size_t>(i)] = before.clone();
        want[static_cast<size_t>(i)] = add ? before + summed.narrow(1, col, r) : summed.narrow(1, col, r).contiguous();
        b.dst[i] = got[static_cast<size_t>(i)].data_ptr<float>();
        b.add[i] = add;
        col += r;
      }
      partials = square_partials_for(b);
      model::check_kernel_launch(kernels::scatter_block_grads(pieces.data_ptr(), dt == torch::kHalf ? kernels::DType::F16 : kernels::DType::BF16, b,
                                                              model::stream_of(src)),
                                 "scatter_block_grads from pieces");
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-6, 1e-6)) << "pieces E=" << c.E << " C=" << c.C << " block " << i;
      expect_square_sums(partials, got, "pieces E=" + std::to_string(c.E) + " C=" + std::to_string(c.C));
    }
  }
}

// Stacked experts' weights cast in one launch (kernels/weight_cast.h with experts > 1): the
// per-expert concatenation's cast, bit for bit, for vector and element-by-element widths.
TEST(GroupedLinearCuda, StackedWeightCastMatchesCatAndCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 931);
  for (const int64_t C : {int64_t{40}, int64_t{13}}) {
    std::vector<torch::Tensor> w = {torch::randn({6, 24, C}, torch::kCUDA), torch::randn({6, 8, C}, torch::kCUDA),
                                    torch::randn({6, 1, C}, torch::kCUDA)};
    EXPECT_TRUE(torch::equal(model::cast_weight_blocks(w, torch::kBFloat16), torch::cat(w, 1).to(torch::kBFloat16)))
        << "C=" << C;
  }
}

// The in-place weight gradients on the GPU: mixed_linear's weight-cast kernel bit for bit against
// torch::cat(...).to(); its weight gradients accumulated in fp32 against fp64 (where autocast's
// path rounds them to bf16 first); the Linear layers taking it inside a WeightGradInPlaceScope
// under autocast, with the same results as outside it; the embedding's backward kernel against
// ATen's (and the same bits on a rerun); linear_cross_entropy writing and adding its weight
// gradient in place. Fresh random inputs each run, odd sizes included. Skips without a GPU.
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "kernels/column_blocks.h"
#include "model/fused_embedding.h"
#include "model/linear.h"
#include "model/linear_cross_entropy.h"
#include "model/mixed_linear.h"
#include "model/weight_shadow.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::CudaAutocast;
using testing_support::rel_norm_diff;
using testing_support::seed_from_gtest;

}  // namespace

TEST(MixedLinearCuda, WeightCastMatchesCatAndCastBitForBit) {
  DD_REQUIRE_GPU();
  seed_from_gtest(91);
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
  seed_from_gtest(92);
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

// A width that is not a multiple of 8 (the a|b projection's 12) runs its GEMMs padded with zeros
// (model/mixed_linear.cpp, aligned_columns), on every plan of the weights' gradients: a frozen
// weight beside one whose gradient is new (a product per weight), a bf16 gradient already there
// (added cast), and the products on the weight-gradient stream. Against fp64: fp32 gradients
// within 2e-5, the bf16 one within its own rounding (8e-3), the output and x's gradient within
// 8e-3; the frozen weight gets no gradient.
TEST(MixedLinearCuda, UnalignedWidthsTakeEveryGradientPlan) {
  DD_REQUIRE_GPU();
  seed_from_gtest(93);
  const int64_t in = 64;
  for (const bool aside : {false, true}) {
    auto w0 = (torch::randn({6, in}, torch::kCUDA) * 0.1).requires_grad_(false);  // frozen
    auto w1 = (torch::randn({6, in}, torch::kCUDA) * 0.1).requires_grad_(true);
    auto w2 = (torch::randn({5, in}, torch::kCUDA) * 0.1).requires_grad_(true);
    w2.mutable_grad() = (torch::randn({5, in}, torch::kCUDA) * 0.1).to(at::kBFloat16);  // cast and added
    const auto w2_grad0 = w2.grad().to(torch::kFloat64);
    auto x = torch::randn({2, 77, in}, torch::kCUDA).to(at::kBFloat16).requires_grad_(true);
    auto g = torch::randn({2, 77, 17}, torch::kCUDA).to(at::kBFloat16);
    torch::Tensor y;
    {
      const model::WeightGradInPlaceScope scope(true, /*grad_stream=*/aside);
      y = model::mixed_linear(x, {w0, w1, w2}, at::kBFloat16);
      y.backward(g);
    }
    model::join_weight_grad_stream(x.device());
    const auto f64 = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat64); };
    const auto wc = f64(torch::cat({w0, w1, w2}, 0).to(at::kBFloat16));
    const auto x2 = f64(x).reshape({-1, in}), g2 = f64(g).reshape({-1, 17});
    const std::string what = aside ? "on the weight-gradient stream" : "in line";
    EXPECT_LT(rel_norm_diff(y.reshape({-1, 17}), x2.mm(wc.t())), 8e-3) << what << ": output";
    EXPECT_LT(rel_norm_diff(x.grad().reshape({-1, in}), g2.mm(wc)), 8e-3) << what << ": x gradient";
    EXPECT_FALSE(w0.grad().defined()) << what << ": the frozen weight got a gradient";
    ASSERT_TRUE(w1.grad().defined() && w1.grad().scalar_type() == torch::kFloat32) << what;
    EXPECT_LT(rel_norm_diff(w1.grad(), g2.narrow(1, 6, 6).t().mm(x2)), 2e-5) << what << ": new fp32 gradient";
    ASSERT_EQ(w2.grad().scalar_type(), at::kBFloat16) << what;
    EXPECT_LT(rel_norm_diff(w2.grad(), w2_grad0 + g2.narrow(1, 12, 5).t().mm(x2)), 8e-3) << what << ": added bf16";
  }
}

// The split product at an unaligned width (11 columns, run at 16: the Gated DeltaNet's q|k|v|g|a|b)
// with new gradients, in line and on the weight-gradient stream: the weights' shadow carries the
// zero rows to 16 (no padded copy a forward), and the GEMM writes the whole padded gradient into
// one buffer whose first rows are the weights' .grad (no copy out of a temporary). Against fp64:
// the outputs and x's gradient within 8e-3, the weight gradients within 2e-5.
TEST(MixedLinearCuda, UnalignedSplitReadsPaddedShadowAndWritesPaddedGradients) {
  DD_REQUIRE_GPU();
  seed_from_gtest(94);
  const int64_t in = 64;
  for (const bool aside : {false, true}) {
    model::clear_weight_shadows();
    auto w1 = (torch::randn({6, in}, torch::kCUDA) * 0.1).requires_grad_(true);
    auto w2 = (torch::randn({5, in}, torch::kCUDA) * 0.1).requires_grad_(true);
    auto x = torch::randn({2, 77, in}, torch::kCUDA).to(at::kBFloat16).requires_grad_(true);
    auto g1 = torch::randn({2, 77, 6}, torch::kCUDA).to(at::kBFloat16);
    auto g2 = torch::randn({2, 77, 5}, torch::kCUDA).to(at::kBFloat16);
    std::vector<torch::Tensor> ys;
    {
      const model::WeightGradInPlaceScope scope(true, /*grad_stream=*/aside);
      ys = model::mixed_linear_split(x, {w1, w2}, {6, 5}, at::kBFloat16);
      torch::autograd::backward({ys[0], ys[1]}, {g1, g2});
    }
    model::join_weight_grad_stream(x.device());
    const std::string what = aside ? "on the weight-gradient stream" : "in line";
    const auto shadow = model::shadowed_weight_blocks({w1, w2}, at::kBFloat16, 16);
    ASSERT_EQ(shadow.size(0), 16) << what;
    EXPECT_TRUE(torch::equal(shadow.narrow(0, 11, 5), torch::zeros({5, in}, shadow.options()))) << what;
    ASSERT_TRUE(w1.grad().defined() && w2.grad().defined()) << what;
    EXPECT_EQ(w1.grad().storage().nbytes(), static_cast<size_t>(16 * in * 4)) << what << ": one padded buffer";
    EXPECT_TRUE(w2.grad().storage().is_alias_of(w1.grad().storage())) << what;
    const auto f64 = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat64); };
    const auto wc = f64(torch::cat({w1, w2}, 0).to(at::kBFloat16));
    const auto x2 = f64(x).reshape({-1, in}), gc = torch::cat({f64(g1), f64(g2)}, 2).reshape({-1, 11});
    EXPECT_LT(rel_norm_diff(torch::cat({ys[0], ys[1]}, 2).reshape({-1, 11}), x2.mm(wc.t())), 8e-3) << what;
    EXPECT_LT(rel_norm_diff(x.grad().reshape({-1, in}), gc.mm(wc)), 8e-3) << what << ": x gradient";
    EXPECT_LT(rel_norm_diff(w1.grad(), gc.narrow(1, 0, 6).t().mm(x2)), 2e-5) << what << ": w1";
    EXPECT_LT(rel_norm_diff(w2.grad(), gc.narrow(1, 6, 5).t().mm(x2)), 2e-5) << what << ": w2";
  }
  model::clear_weight_shadows();
}

// Two groups over one x on the GPU (the Gated DeltaNet layer's q|k|v|gate and a|b products), with
// and without cuBLAS's workspace: the outputs and weight gradients equal separate calls' bit for
// bit, and x's gradient, summed by the second GEMM, is within bf16's rounding of the fp64 sum.
TEST(MixedLinearCuda, GroupsSumTheInputGradientInTheirGemms) {
  DD_REQUIRE_GPU();
  seed_from_gtest(99);
  const int64_t in = 96;
  auto x0 = torch::randn({2, 301, in}, torch::kCUDA).to(at::kBFloat16);
  auto g_a = torch::randn({2, 301, 136}, torch::kCUDA).to(at::kBFloat16);
  auto g_b = torch::randn({2, 301, 12}, torch::kCUDA).to(at::kBFloat16);
  std::vector<torch::Tensor> w0;
  for (int64_t r : {64, 72, 6, 6}) w0.push_back(torch::randn({r, in}, torch::kCUDA) * 0.1);
  for (const bool no_workspace : {false, true}) {
    auto fresh = [&] {
      std::vector<torch::Tensor> w;
      for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
      return w;
    };
    auto w = fresh(), ws = fresh();
    auto x = x0.clone().requires_grad_(true), xs = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> ys;
    torch::Tensor ya, yb;
    {
      model::WeightGradInPlaceScope scope(true, false, no_workspace);
      ys = model::mixed_linear_groups(x, w, {2, 2}, at::kBFloat16);
      ya = model::mixed_linear(xs, {ws[0], ws[1]}, at::kBFloat16);
      yb = model::mixed_linear(xs, {ws[2], ws[3]}, at::kBFloat16);
    }
    torch::autograd::backward({ys[0], ys[1]}, {g_a, g_b});
    torch::autograd::backward({ya, yb}, {g_a, g_b});
    const std::string what = no_workspace ? "without workspace" : "with workspace";
    EXPECT_TRUE(torch::equal(ys[0], ya)) << what;
    EXPECT_TRUE(torch::equal(ys[1], yb)) << what;
    for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(torch::equal(w[i].grad(), ws[i].grad())) << what << " weight " << i;
    const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
    auto wa = f64(torch::cat({w0[0], w0[1]}, 0).to(at::kBFloat16)), wb = f64(torch::cat({w0[2], w0[3]}, 0).to(at::kBFloat16));
    auto want = f64(g_a).reshape({-1, 136}).mm(wa) + f64(g_b).reshape({-1, 12}).mm(wb);
    const double e_groups = rel_norm_diff(x.grad().reshape({-1, in}), want);
    const double e_separate = rel_norm_diff(xs.grad().reshape({-1, in}), want);
    EXPECT_LT(e_groups, 4e-3) << what;
    std::printf("[measured] mixed_linear_groups x gradient vs fp64 (%s): %.3g; separate calls: %.3g\n", what.c_str(),
                e_groups, e_separate);
  }
}

TEST(MixedLinearCuda, LinearLayersTakeItInsideTheScope) {
  DD_REQUIRE_GPU();
  seed_from_gtest(93);
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

// linear_cat_columns inside the trainer's scope (MLA's first products: a 384-row group, and a
// 288-row one cut into 256 and 32): one product, counted, each output a view of its columns at the
// product's row stride; its outputs within a bf16 rounding of the groups' products split (other
// GEMM kernels), and x's and the weights' gradients within bf16's rounding of those of one GEMM a
// group (whose second GEMM adds x's gradient into the first's).
TEST(MixedLinearCuda, ColumnSplitsOfGroupsTakeOneProduct) {
  DD_REQUIRE_GPU();
  seed_from_gtest(103);
  const int64_t d = 128;
  model::Linear a(d, 384), b(d, 288);
  for (auto* l : {&a, &b}) (*l)->to(torch::kCUDA);
  auto x0 = torch::randn({2, 150, d}, torch::kCUDA);
  const std::vector<torch::Tensor> g = {torch::randn({2, 150, 384}, torch::kCUDA),
                                        torch::randn({2, 150, 256}, torch::kCUDA),
                                        torch::randn({2, 150, 32}, torch::kCUDA)};
  auto run = [&](bool columns) {
    for (auto* l : {&a, &b}) (*l)->weight.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> parts;
    const int64_t products = model::mixed_linear_split_products();
    {
      CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope(true);
      if (columns) {
        parts = model::linear_cat_columns(x, {{a}, {b}}, {384, 256, 32});
      } else {
        auto groups = model::linear_cat_groups(x, {{a}, {b}});
        auto kv = groups[1].split_with_sizes({256, 32}, -1);
        parts = {groups[0], kv[0], kv[1]};
      }
    }
    EXPECT_EQ(model::mixed_linear_split_products() - products, columns ? 1 : 0) << "one product";
    if (columns) {
      for (const auto& p : parts) EXPECT_EQ(p.stride(1), 672) << "a view at the product's row stride";
      EXPECT_EQ(static_cast<const char*>(parts[2].data_ptr()) - static_cast<const char*>(parts[0].data_ptr()),
                640 * 2);
    }
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < g.size(); ++i) grads.push_back(g[i].to(parts[i].scalar_type()));
    torch::autograd::backward(parts, grads);
    std::vector<torch::Tensor> out;
    for (const auto& p : parts) out.push_back(p.detach().clone());
    out.push_back(x.grad().clone());
    for (auto* l : {&a, &b}) out.push_back((*l)->weight.grad().clone());
    return out;
  };
  const auto one = run(true), groups = run(false);
  const char* names[] = {"q latent", "kv latent", "rope key", "dx", "dwa", "dwb"};
  for (size_t i = 0; i < one.size(); ++i) {
    const double e = rel_norm_diff(one[i], groups[i]);
    EXPECT_LT(e, i < 3 ? 4e-3 : 1e-2) << names[i];  // other GEMM kernels, bf16 outputs
    EXPECT_GT(groups[i].abs().max().item<double>(), 0.0) << names[i] << ": nothing to compare";
    std::printf("%s %s %.1e", i == 0 ? "[measured] linear_cat_columns vs one GEMM a group:" : ",", names[i], e);
  }
  std::printf("\n");
}

// kernels::fill_column_blocks_16bit against copy_ and zero_ into each block's columns (its
// reference), bit for bit, in bf16 and fp16: 16-byte blocks (MLA's 384 | 256 | 32 in rows of 672),
// element-by-element ones (12 columns at an odd offset, one column, sources at row strides that
// are not a multiple of 8), sources that are column slices of wider rows, zero blocks, columns no
// block names left as they were, odd row counts; more than kMaxColumnBlocks blocks is refused.
TEST(MixedLinearCuda, ColumnBlocksKernelMatchesCopies) {
  DD_REQUIRE_GPU();
  seed_from_gtest(101);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto opt = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
    struct Case {
      int64_t N, ld;
      std::vector<std::pair<int64_t, int64_t>> cols;  // (col, width) of each block
      std::vector<int64_t> src_extra;                 // each source's extra row width (-1: a zero block)
    };
    const std::vector<Case> cases = {
        {300, 672, {{0, 384}, {384, 256}, {640, 32}}, {0, 0, 0}},
        {301, 3472, {{3456, 12}, {3468, 4}}, {0, -1}},
        {77, 40, {{3, 1}, {8, 16}, {24, 13}}, {5, 8, 3}},
        {1, 24, {{0, 8}, {16, 8}}, {-1, 0}},
    };
    for (const auto& c : cases) {
      auto before = torch::randn({c.N, c.ld}, opt);
      auto want = before.clone(), got = before.clone();
      std::vector<torch::Tensor> srcs;
      std::vector<kernels::ColumnBlock> blocks;
      for (size_t i = 0; i < c.cols.size(); ++i) {
        const auto [col, width] = c.cols[i];
        if (c.src_extra[i] < 0) {
          want.narrow(1, col, width).zero_();
          blocks.push_back({nullptr, 0, col, width});
          continue;
        }
        // A column slice of wider rows, so the source's row stride is not its width.
        auto wide = torch::randn({c.N, width + c.src_extra[i]}, opt);
        auto src = wide.narrow(1, c.src_extra[i], width);
        srcs.push_back(wide);
        want.narrow(1, col, width).copy_(src);
        blocks.push_back({src.data_ptr(), src.stride(0), col, width});
      }
      ASSERT_EQ(kernels::fill_column_blocks_16bit(got.data_ptr(), c.N, c.ld, blocks.data(), static_cast<int>(blocks.size()),
                                                  at::cuda::getCurrentCUDAStream().stream()),
                0);
      EXPECT_TRUE(torch::equal(got, want)) << "N " << c.N << " ld " << c.ld << " " << dtype;
    }
    std::vector<kernels::ColumnBlock> too_many(kernels::kMaxColumnBlocks + 1);
    EXPECT_NE(kernels::fill_column_blocks_16bit(nullptr, 4, 8, too_many.data(), static_cast<int>(too_many.size()),
                                                at::cuda::getCurrentCUDAStream().stream()),
              0);
  }
}

// mixed_linear_split's backward with its parts' gradients written by the kernel against copy_ a
// part (model::split_gradient_columns_kernel): the same gradients bit for bit, with one part's
// gradient missing (zeros), the padding columns zeroed (12 + 5 rows padded to 24), and the kernel's
// launch counted only when on.
TEST(MixedLinearCuda, SplitGradientColumnsByKernelMatchCopies) {
  DD_REQUIRE_GPU();
  seed_from_gtest(102);
  const int64_t in = 64;
  auto x0 = torch::randn({2, 99, in}, torch::kCUDA).to(at::kBFloat16);
  std::vector<torch::Tensor> w0;
  for (int64_t r : {8, 4, 5}) w0.push_back(torch::randn({r, in}, torch::kCUDA) * 0.1);
  const auto g0 = torch::randn({2, 99, 12}, torch::kCUDA).to(at::kBFloat16);
  for (const bool second_used : {true, false}) {
    auto run = [&](bool kernel) {
      model::split_gradient_columns_kernel(kernel);
      std::vector<torch::Tensor> w;
      for (const auto& t : w0) w.push_back(t.clone().requires_grad_(true));
      auto x = x0.clone().requires_grad_(true);
      std::vector<torch::Tensor> ys;
      {
        model::WeightGradInPlaceScope scope(true);
        ys = model::mixed_linear_split(x, w, {12, 5}, at::kBFloat16);
      }
      const int64_t launches = model::split_gradient_columns_kernel_launches();
      if (second_used) torch::autograd::backward({ys[0], ys[1]}, {g0, (ys[1].to(torch::kFloat32) * 3).to(at::kBFloat16)});
      else ys[0].backward(g0);
      EXPECT_EQ(model::split_gradient_columns_kernel_launches() - launches, kernel ? 1 : 0);
      std::vector<torch::Tensor> out = {x.grad().clone()};
      for (const auto& t : w) out.push_back(t.grad().clone());
      return out;
    };
    const auto by_kernel = run(true), by_copies = run(false);
    model::split_gradient_columns_kernel(true);
    for (size_t i = 0; i < by_kernel.size(); ++i)
      EXPECT_TRUE(torch::equal(by_kernel[i], by_copies[i])) << "tensor " << i << (second_used ? "" : ", second unused");
  }
}

TEST(MixedLinearCuda, EmbeddingBackwardMatchesAtenAndRepeatsBitForBit) {
  DD_REQUIRE_GPU();
  seed_from_gtest(94);
  // C 768 takes 16-byte vectors, C 37 single columns.
  for (const int64_t C : {768, 37}) {
    const int64_t V = 1000;
    // Skewed tokens: a few very frequent ones, as in text, and absent ones.
    auto tokens = (torch::randn({4, 1500}, torch::kCUDA).abs() * 60).to(torch::kInt64).clamp_max(V - 1);
    auto dy = torch::randn({4, 1500, C}, torch::kCUDA);
    auto w0 = torch::randn({V, C}, torch::kCUDA);
    auto existing = torch::randn({V, C}, torch::kCUDA);
    auto ref = at::embedding_dense_backward(dy.reshape({-1, C}), tokens.reshape({-1}), V, -1, false) + existing;
    std::vector<torch::Tensor> runs;
    for (int rep = 0; rep < 2; ++rep) {
      auto w = w0.clone().requires_grad_(true);
      w.mutable_grad() = existing.clone();
      model::WeightGradInPlaceScope scope;
      ASSERT_TRUE(model::embedding_in_place_applies(w, tokens));
      auto y = model::embedding_in_place(w, tokens);
      EXPECT_TRUE(torch::equal(y.detach(), torch::embedding(w0, tokens)));
      y.backward(dy);
      runs.push_back(w.grad().clone());
    }
    EXPECT_LT(rel_norm_diff(runs[0], ref), 1e-6) << "C=" << C;
    EXPECT_TRUE(torch::equal(runs[0], runs[1])) << "C=" << C << ": not deterministic";
  }
  // Without a gradient there yet: zeros, then the rows.
  const int64_t V = 300, C = 64;
  auto tokens = torch::randint(0, V, {2000}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA));
  auto dy = torch::randn({2000, C}, torch::kCUDA);
  auto w = torch::randn({V, C}, torch::kCUDA).requires_grad_(true);
  {
    model::WeightGradInPlaceScope scope;
    model::embedding_in_place(w, tokens).backward(dy);
  }
  EXPECT_LT(rel_norm_diff(w.grad(), at::embedding_dense_backward(dy, tokens, V, -1, false)), 1e-6);
}

TEST(MixedLinearCuda, CrossEntropyWritesAndAddsItsWeightGradientInPlace) {
  DD_REQUIRE_GPU();
  seed_from_gtest(95);
  const int64_t N = 777, d = 64, V = 1003;
  auto h0 = torch::randn({N, d}, torch::kCUDA);
  auto w0 = torch::randn({V, d}, torch::kCUDA) * 0.2;
  auto t = torch::randint(0, V, {N}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA));
  auto run = [&](bool in_place, const torch::Tensor& existing, bool no_workspace = false) {
    auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    if (existing.defined()) w.mutable_grad() = existing.clone();
    torch::Tensor loss;
    {
      CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope(in_place, false, no_workspace);
      model::LinearCrossEntropyOptions o;
      o.chunk_rows = 200;
      loss = model::linear_cross_entropy(h, w, t, o);
    }
    (loss * 0.37).backward();
    return std::make_pair(h.grad(), w.grad());
  };
  for (const bool with_existing : {false, true}) {
    auto existing = with_existing ? torch::randn({V, d}, torch::kCUDA) : torch::Tensor();
    auto a = run(true, existing), b = run(false, existing);
    EXPECT_LT(rel_norm_diff(a.first, b.first), 1e-6) << "dh, existing " << with_existing;
    EXPECT_LT(rel_norm_diff(a.second, b.second), 1e-6) << "dw, existing " << with_existing;
    // A CUDA-graph step's scope: the chunks' GEMMs without cuBLAS's workspace (other kernels, so
    // the bf16 logits may round differently).
    auto c = run(true, existing, true);
    EXPECT_LT(rel_norm_diff(c.first, b.first), 8e-3) << "dh without workspace, existing " << with_existing;
    EXPECT_LT(rel_norm_diff(c.second, b.second), 8e-3) << "dw without workspace, existing " << with_existing;
  }
  // Inside the scope the product reads the weight's bf16 shadow (model/weight_shadow.h), which then
  // holds the weight's rounded values; outside it, none is made.
  auto w = w0.clone().requires_grad_(true), w_out = w0.clone().requires_grad_(true);
  {
    CudaAutocast autocast(at::kBFloat16);
    model::LinearCrossEntropyOptions o;
    o.chunk_rows = 200;
    {
      model::WeightGradInPlaceScope scope;
      model::linear_cross_entropy(h0, w, t, o);
    }
    model::linear_cross_entropy(h0, w_out, t, o);
  }
  const auto shadow = model::weight_shadow_of(w);
  ASSERT_TRUE(shadow.defined()) << "the head's product made no shadow";
  EXPECT_TRUE(torch::equal(shadow, w.detach().to(at::kBFloat16)));
  EXPECT_FALSE(model::weight_shadow_of(w_out).defined());
}

// The weight-gradient GEMMs on the device's second stream (a scope with grad_stream) give the same
// gradients as on the backward's own stream, once joined; over two backwards (written, then added).
TEST(MixedLinearCuda, WeightGradStreamGivesTheSameGradients) {
  DD_REQUIRE_GPU();
  seed_from_gtest(96);
  const int64_t d = 128;
  model::Linear a(d, 384), b(d, 256);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  auto x0 = torch::randn({4, 257, d}, torch::kCUDA);
  auto run = [&](bool aside) {
    for (auto* l : {&a, &b}) (*l)->weight.mutable_grad() = torch::Tensor();
    for (int rep = 0; rep < 2; ++rep) {
      auto x = (x0 * (rep + 1)).requires_grad_(true);
      torch::Tensor y;
      {
        CudaAutocast autocast(at::kBFloat16);
        model::WeightGradInPlaceScope scope(true, aside);
        y = b(model::linear_cat(x, {a}).narrow(-1, 0, d) * 2);
      }
      y.to(torch::kFloat).pow(2).sum().backward();
    }
    model::join_weight_grad_stream(torch::Device(torch::kCUDA, 0));
    return std::vector<torch::Tensor>{a->weight.grad().clone(), b->weight.grad().clone()};
  };
  const auto same = run(false), aside = run(true);
  for (size_t i = 0; i < same.size(); ++i) EXPECT_LT(rel_norm_diff(aside[i], same[i]), 1e-6) << "weight " << i;
}

// A product inside WeightGradsOnCallerStreamScope, within a scope that puts the others' weight
// gradients on the second stream, gives the same gradients as with every GEMM on the backward's own
// stream (the Gated DeltaNet's output projection, model::gdn_output_weight_grad_on_caller_stream),
// and only the other product's GEMM goes to the second stream (counted).
TEST(MixedLinearCuda, CallerStreamScopeGivesTheSameGradients) {
  DD_REQUIRE_GPU();
  seed_from_gtest(97);
  const int64_t d = 128;
  model::Linear a(d, 384), b(d, 256);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  auto x0 = torch::randn({4, 257, d}, torch::kCUDA);
  auto run = [&](bool aside, bool b_here) {
    for (auto* l : {&a, &b}) (*l)->weight.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope(true, aside);
      const auto h = model::linear_cat(x, {a}).narrow(-1, 0, d) * 2;
      std::optional<model::WeightGradsOnCallerStreamScope> here;
      if (b_here) here.emplace();
      y = b(h);
    }
    y.to(torch::kFloat).pow(2).sum().backward();
    model::join_weight_grad_stream(torch::Device(torch::kCUDA, 0));
    return std::vector<torch::Tensor>{a->weight.grad().clone(), b->weight.grad().clone()};
  };
  const int64_t aside_before = model::weight_grads_run_aside();
  const auto same = run(false, false);
  EXPECT_EQ(model::weight_grads_run_aside() - aside_before, 0);
  const auto both_aside = run(true, false);
  EXPECT_EQ(model::weight_grads_run_aside() - aside_before, 2) << "both products' GEMMs on the second stream";
  const auto b_here = run(true, true);
  EXPECT_EQ(model::weight_grads_run_aside() - aside_before, 3) << "only a's GEMM on the second stream";
  for (size_t i = 0; i < same.size(); ++i) {
    EXPECT_LT(rel_norm_diff(both_aside[i], same[i]), 1e-6) << "weight " << i;
    EXPECT_LT(rel_norm_diff(b_here[i], same[i]), 1e-6) << "weight " << i;
  }
  EXPECT_GT(same[1].abs().max().item<float>(), 0.f);
}

// A product inside WeightGradsDeferredScope queues its weight-gradient GEMM in backward; the GEMM
// runs on the second stream when run_deferred_weight_grads starts it (after the point marked), or at
// join_weight_grad_stream, with an SM count target or without: the same gradients as every GEMM on
// the backward's own stream (the Gated DeltaNet's output projection beside the reverse scan,
// model::gdn_output_weight_grad_beside_scan). Counted; outside a scope with the second stream
// nothing is put off.
TEST(MixedLinearCuda, DeferredWeightGradsGiveTheSameGradients) {
  DD_REQUIRE_GPU();
  seed_from_gtest(98);
  const int64_t d = 128;
  model::Linear a(d, 384), b(d, 256);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  auto x0 = torch::randn({4, 257, d}, torch::kCUDA);
  const torch::Device dev(torch::kCUDA, 0);
  // how: 0 every GEMM on the backward's stream; −1 b inside the deferring scope, but without the
  // second stream; 1 b's deferred, started at the join; 2 and 3 b's started by
  // run_deferred_weight_grads after a marked point, without and with an SM target.
  auto run = [&](int how) {
    for (auto* l : {&a, &b}) (*l)->weight.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope(true, how > 0);
      const auto h = model::linear_cat(x, {a}).narrow(-1, 0, d) * 2;
      std::optional<model::WeightGradsDeferredScope> deferred;
      if (how != 0) deferred.emplace();
      y = b(h);
    }
    y.to(torch::kFloat).pow(2).sum().backward();
    if (how >= 2) {
      model::deferred_weight_grads_ready_here(dev);
      model::run_deferred_weight_grads(dev, how == 3 ? 36 : 0);
    }
    model::join_weight_grad_stream(dev);
    return std::vector<torch::Tensor>{a->weight.grad().clone(), b->weight.grad().clone()};
  };
  const int64_t deferred_before = model::weight_grads_deferred();
  const auto same = run(0);
  EXPECT_EQ(model::weight_grads_deferred() - deferred_before, 0);
  {  // the deferring scope inside one without the second stream: b's GEMM runs in its backward
    const auto got = run(-1);
    EXPECT_EQ(model::weight_grads_deferred() - deferred_before, 0) << "put off without the second stream";
    EXPECT_LT(rel_norm_diff(got[1], same[1]), 1e-6);
  }
  for (int how = 1; how <= 3; ++how) {
    const int64_t before = model::weight_grads_deferred(), aside_before = model::weight_grads_run_aside();
    const auto got = run(how);
    EXPECT_EQ(model::weight_grads_deferred() - before, 1) << "how " << how;
    EXPECT_EQ(model::weight_grads_run_aside() - aside_before, 2) << "how " << how;
    for (size_t i = 0; i < same.size(); ++i) EXPECT_LT(rel_norm_diff(got[i], same[i]), 1e-6) << "how " << how << ", weight " << i;
  }
  EXPECT_GT(same[1].abs().max().item<float>(), 0.f);
}

// The products without cuBLAS's workspace (model/linear.h product, at_b_into_ with no_workspace,
// the scope's no_workspace) against torch::mm and fp64: the same products through other kernels.
TEST(MixedLinearCuda, GemmsWithoutWorkspaceMatch) {
  DD_REQUIRE_GPU();
  seed_from_gtest(97);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    auto a = torch::randn({333, 96}, torch::kCUDA).to(dtype);
    auto b_nk = torch::randn({130, 96}, torch::kCUDA).to(dtype);
    auto b_kn = torch::randn({96, 130}, torch::kCUDA).to(dtype);
    const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
    EXPECT_LT(rel_norm_diff(model::product(a, b_nk, true, true), f64(a).mm(f64(b_nk).t())), 4e-3);
    EXPECT_LT(rel_norm_diff(model::product(a, b_kn, false, true), f64(a).mm(f64(b_kn))), 4e-3);
    // Into a row block and a column block of larger matrices (c's row stride is not N).
    auto big = torch::zeros({400, 150}, torch::kCUDA).to(dtype);
    auto rows_block = big.narrow(0, 50, 333).narrow(1, 0, 130);
    model::product_into(rows_block, a, b_nk, true, true);
    EXPECT_LT(rel_norm_diff(rows_block, f64(a).mm(f64(b_nk).t())), 4e-3);
    auto cols_block = big.narrow(0, 0, 333).narrow(1, 20, 130);
    model::product_into(cols_block, a, b_kn, false, true);
    EXPECT_LT(rel_norm_diff(cols_block, f64(a).mm(f64(b_kn))), 4e-3);
    EXPECT_EQ(big.narrow(0, 383, 17).abs().sum().item<double>(), 0.0) << "wrote outside c";
    // Added into c (beta = 1): c0 + a · bᵀ, rounded once.
    auto acc = torch::randn({333, 130}, torch::kCUDA).to(dtype);
    const auto acc0 = f64(acc);
    model::product_into(acc, a, b_nk, true, true, /*accumulate=*/true);
    EXPECT_LT(rel_norm_diff(acc, acc0 + f64(a).mm(f64(b_nk).t())), 4e-3);
    auto c = torch::randn({96, 130}, torch::kCUDA);
    auto g = torch::randn({333, 130}, torch::kCUDA).to(dtype);
    auto c0 = c.clone();
    model::at_b_into_(c, a, g, /*accumulate=*/true, /*no_workspace=*/true);
    EXPECT_LT(rel_norm_diff(c, f64(c0) + f64(a).t().mm(f64(g))), 1e-5);
  }
  // A linear layer's gradients with and without the workspace.
  model::Linear l(64, 160);
  l->to(torch::kCUDA);
  auto x0 = torch::randn({3, 77, 64}, torch::kCUDA);
  auto run = [&](bool no_workspace) {
    l->weight.mutable_grad() = torch::Tensor();
    auto x = x0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope(true, false, no_workspace);
      y = l(x);
    }
    y.to(torch::kFloat).pow(2).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), l->weight.grad()};
  };
  const auto a = run(true), b = run(false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(rel_norm_diff(a[i], b[i]), 8e-3) << "output " << i;
}

// A group's bf16 shadow (model/weight_shadow.h): kept and reused while its weights are unchanged,
// recast when a weight changes through ATen (its version), is swapped (set_data, as EMA does) or
// the shadows are invalidated; refresh_weight_shadows recasts only stale ones. Every value it
// hands out equals a fresh cast bit for bit.
TEST(MixedLinearCuda, WeightShadowIsReusedAndRecastWhenAWeightChanges) {
  DD_REQUIRE_GPU();
  seed_from_gtest(98);
  model::clear_weight_shadows();
  auto a = torch::randn({96, 64}, torch::kCUDA), b = torch::randn({33, 64}, torch::kCUDA);
  std::vector<torch::Tensor> group = {a, b};
  auto fresh = [&] { return model::cast_weight_blocks(group, at::kBFloat16); };
  const int64_t casts0 = model::weight_shadow_casts();
  auto s1 = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_TRUE(torch::equal(s1, fresh()));
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 1);
  EXPECT_EQ(model::weight_shadow_groups(), 1);
  auto s2 = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_EQ(s2.data_ptr(), s1.data_ptr()) << "the kept buffer";
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 1) << "an unchanged group was recast";
  // Each weight's shadow is its row block of the group's.
  EXPECT_EQ(model::weight_shadow_of(b).data_ptr(), s1.narrow(0, 96, 33).data_ptr());
  EXPECT_FALSE(model::weight_shadow_of(torch::randn({4, 64}, torch::kCUDA)).defined());

  {
    torch::NoGradGuard no_grad;
    b.mul_(0.5);  // through ATen: the version goes up
  }
  auto s3 = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 2);
  EXPECT_TRUE(torch::equal(s3, fresh()));

  auto other = torch::randn({96, 64}, torch::kCUDA);
  a.set_data(other);  // a swap of storage (EMA's) keeps the version: the data pointer tells
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(group, at::kBFloat16), fresh()));
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 3);

  model::invalidate_weight_shadows();
  model::refresh_weight_shadows();
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 4);
  model::refresh_weight_shadows();
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 4) << "refresh recast a current shadow";
  {
    torch::NoGradGuard no_grad;
    a.add_(1.0);
  }
  model::refresh_weight_shadows();
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 5);
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(group, at::kBFloat16), fresh()));

  // b in another grouping: no second shadow of it (AdamW writes one per weight), a plain cast.
  std::vector<torch::Tensor> b_alone = {b};
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(b_alone, at::kBFloat16), b.to(at::kBFloat16)));
  EXPECT_EQ(model::weight_shadow_groups(), 1);

  model::weight_shadows(false);
  auto off = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_NE(off.data_ptr(), s1.data_ptr()) << "switched off, a fresh cast";
  EXPECT_FALSE(model::weight_shadow_of(a).defined());
  model::weight_shadows(true);
  model::release_weight_shadows({b});  // a run's end: the groups of its weights go
  EXPECT_EQ(model::weight_shadow_groups(), 0);
  EXPECT_FALSE(model::weight_shadow_of(a).defined());
}

// model::mixed_linear and model::embedding_in_place on the CPU (their ATen paths, the logic the
// GPU shares): the product and x's gradient against fp64 products of the same rounded operands,
// the weights' gradients written into one fp32 buffer on the first backward and added on later
// ones, frozen weights, an empty batch, and when the layers take it; the embedding's gradient
// against autograd's; the bf16 weight shadows' bookkeeping (model/weight_shadow.h). Random inputs
// drawn fresh each run. The GPU kernels and the fp32 accumulation are tested in
// test_mixed_linear_cuda.cpp, AdamW writing the shadows in test_trainer_cuda.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "model/fused_embedding.h"
#include "model/linear.h"
#include "model/mixed_linear.h"
#include "model/weight_shadow.h"

namespace {

void seed(int salt) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + salt);
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm().clamp_min(1e-30))
      .item<double>();
}

std::vector<torch::Tensor> make_weights(const std::vector<int64_t>& rows, int64_t in) {
  std::vector<torch::Tensor> w;
  for (int64_t r : rows) w.push_back((torch::randn({r, in}) * 0.2).requires_grad_(true));
  return w;
}

// The exact products of the operands as the product sees them (rounded to `dtype`), in fp64.
struct Truth {
  torch::Tensor y, dx;
  std::vector<torch::Tensor> dw;
};
Truth truth(const torch::Tensor& x, const std::vector<torch::Tensor>& w, const torch::Tensor& g, at::ScalarType dtype) {
  const int64_t in = x.size(-1);
  auto x2 = x.detach().to(dtype).to(torch::kFloat64).reshape({-1, in});
  auto wc = torch::cat(w, 0).detach().to(dtype).to(torch::kFloat64);
  auto g2 = g.to(dtype).to(torch::kFloat64).reshape({-1, wc.size(0)});
  Truth t;
  t.y = x2.mm(wc.t());
  t.dx = g2.mm(wc);
  int64_t col = 0;
  for (const auto& wi : w) {
    t.dw.push_back(g2.narrow(1, col, wi.size(0)).t().mm(x2));
    col += wi.size(0);
  }
  return t;
}

// The CPU's bf16/fp16 products round their outputs, so each result is within a few units of the
// format's precision of the truth (bf16: 2^-8 relative).
double tolerance(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 1e-2 : 2e-3; }

}  // namespace

TEST(MixedLinear, ProductAndGradientsMatchFp64) {
  seed(31);
  struct Case {
    std::vector<int64_t> x_shape;
    at::ScalarType x_dtype, dtype;
    std::vector<int64_t> rows;
  };
  const std::vector<Case> cases = {
      {{3, 5, 24}, at::kFloat, at::kBFloat16, {8}},
      {{7, 16}, at::kBFloat16, at::kBFloat16, {8, 4, 4}},
      {{2, 9, 13}, at::kFloat, at::kHalf, {5, 3}},
      {{11, 32}, at::kHalf, at::kHalf, {6, 2, 2, 4}},
  };
  for (const auto& c : cases) {
    const int64_t in = c.x_shape.back();
    auto x = torch::randn(c.x_shape).to(c.x_dtype).requires_grad_(true);
    auto w = make_weights(c.rows, in);
    auto y = model::mixed_linear(x, w, c.dtype);
    int64_t out = 0;
    for (int64_t r : c.rows) out += r;
    auto shape = c.x_shape;
    shape.back() = out;
    ASSERT_EQ(y.sizes().vec(), shape);
    EXPECT_EQ(y.scalar_type(), c.dtype);
    auto g = torch::randn(shape).to(c.dtype);
    y.backward(g);
    const Truth t = truth(x, w, g, c.dtype);
    const double tol = tolerance(c.dtype);
    EXPECT_LT(rel(y.reshape({-1, out}), t.y), tol);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().scalar_type(), c.x_dtype);
    EXPECT_EQ(x.grad().sizes(), x.sizes());
    EXPECT_LT(rel(x.grad().reshape({-1, in}), t.dx), tol);
    int64_t offset = w[0].grad().storage_offset();
    for (size_t i = 0; i < w.size(); ++i) {
      const auto& dw = w[i].grad();
      ASSERT_TRUE(dw.defined()) << "block " << i;
      EXPECT_EQ(dw.scalar_type(), torch::kFloat32);
      EXPECT_EQ(dw.sizes(), w[i].sizes());
      EXPECT_LT(rel(dw, t.dw[i]), tol) << "block " << i;
      // The first backward leaves every block's gradient in one buffer, in order.
      EXPECT_TRUE(dw.storage().is_alias_of(w[0].grad().storage())) << "block " << i;
      EXPECT_EQ(dw.storage_offset(), offset) << "block " << i;
      offset += dw.numel();
    }
  }
}

TEST(MixedLinear, LaterBackwardsAddToTheGradients) {
  seed(32);
  const int64_t in = 20;
  auto w = make_weights({6, 10}, in);
  auto x1 = torch::randn({4, 7, in}), x2 = torch::randn({4, 7, in});
  auto g1 = torch::randn({4, 7, 16}), g2 = torch::randn({4, 7, 16});
  model::mixed_linear(x1, w, at::kBFloat16).backward(g1);
  model::mixed_linear(x2, w, at::kBFloat16).backward(g2);  // the one-buffer path: one product added
  const Truth t1 = truth(x1, w, g1, at::kBFloat16), t2 = truth(x2, w, g2, at::kBFloat16);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_LT(rel(w[i].grad(), t1.dw[i] + t2.dw[i]), 1e-2) << "block " << i;

  // Gradients that are not one buffer (set by someone else): each block added on its own.
  auto w2 = make_weights({6, 10}, in);
  w2[0].mutable_grad() = torch::full({6, in}, 0.5);
  w2[1].mutable_grad() = torch::full({10, in}, -0.25);
  model::mixed_linear(x1, w2, at::kBFloat16).backward(g1);
  const Truth t3 = truth(x1, w2, g1, at::kBFloat16);
  EXPECT_LT(rel(w2[0].grad(), t3.dw[0] + 0.5), 1e-2);
  EXPECT_LT(rel(w2[1].grad(), t3.dw[1] - 0.25), 1e-2);

  // One block with a gradient, one without: the missing one is written, the other added to.
  auto w3 = make_weights({6, 10}, in);
  w3[1].mutable_grad() = torch::ones({10, in});
  model::mixed_linear(x1, w3, at::kBFloat16).backward(g1);
  const Truth t4 = truth(x1, w3, g1, at::kBFloat16);
  EXPECT_LT(rel(w3[0].grad(), t4.dw[0]), 1e-2);
  EXPECT_LT(rel(w3[1].grad(), t4.dw[1] + 1.0), 1e-2);
}

TEST(MixedLinear, FrozenWeightsAndEmptyBatches) {
  seed(33);
  const int64_t in = 12;
  auto w = make_weights({4, 4}, in);
  w[1].requires_grad_(false);
  auto x = torch::randn({5, in}, torch::requires_grad());
  auto g = torch::randn({5, 8});
  model::mixed_linear(x, w, at::kBFloat16).backward(g);
  EXPECT_FALSE(w[1].grad().defined());
  EXPECT_LT(rel(w[0].grad(), truth(x, w, g, at::kBFloat16).dw[0]), 1e-2);

  // No tokens: the gradients are zeros, as autograd leaves them.
  auto we = make_weights({3, 5}, in);
  auto xe = torch::randn({0, in}, torch::requires_grad());
  model::mixed_linear(xe, we, at::kBFloat16).sum().backward();
  for (const auto& wi : we) {
    ASSERT_TRUE(wi.grad().defined());
    EXPECT_EQ(wi.grad().abs().max().item<float>(), 0.f);
  }
  EXPECT_THROW(model::mixed_linear(x, {torch::randn({4, in + 1}, torch::requires_grad())}, at::kBFloat16),
               c10::Error);
  EXPECT_THROW(model::mixed_linear(x, w, at::kFloat), c10::Error);
}

// Groups of weights over one x: each output is the group's own mixed_linear product, bit for bit,
// the weights' gradients are the same as from separate calls, and x's one gradient is the sum of
// the groups' products (within bf16's rounding of the fp64 sum). An output that gets no gradient
// adds nothing and leaves its weights without one.
TEST(MixedLinear, GroupsShareOneInputGradient) {
  seed(35);
  const int64_t in = 24;
  const std::vector<int64_t> sizes = {2, 1};
  auto x0 = torch::randn({3, 7, in});
  auto g_a = torch::randn({3, 7, 12}).to(at::kBFloat16), g_b = torch::randn({3, 7, 5}).to(at::kBFloat16);
  auto w = make_weights({8, 4, 5}, in);
  auto x = x0.clone().requires_grad_(true);
  auto ys = model::mixed_linear_groups(x, w, sizes, at::kBFloat16);
  ASSERT_EQ(ys.size(), 2u);
  torch::autograd::backward({ys[0], ys[1]}, {g_a, g_b});

  // The same products as two separate calls (autograd adds their x gradients).
  auto ws = make_weights({8, 4, 5}, in);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < w.size(); ++i) ws[i].copy_(w[i]);
  }
  auto xs = x0.clone().requires_grad_(true);
  auto ya = model::mixed_linear(xs, {ws[0], ws[1]}, at::kBFloat16);
  auto yb = model::mixed_linear(xs, {ws[2]}, at::kBFloat16);
  torch::autograd::backward({ya, yb}, {g_a, g_b});
  EXPECT_TRUE(torch::equal(ys[0], ya));
  EXPECT_TRUE(torch::equal(ys[1], yb));
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(torch::equal(w[i].grad(), ws[i].grad())) << "weight " << i;
  const auto want_dx = truth(x, {w[0], w[1]}, g_a, at::kBFloat16).dx + truth(x, {w[2]}, g_b, at::kBFloat16).dx;
  EXPECT_EQ(x.grad().scalar_type(), torch::kFloat32);
  EXPECT_LT(rel(x.grad().reshape({-1, in}), want_dx), tolerance(at::kBFloat16));

  // Only the second output used: x's gradient is its product alone; the first group's weights get none.
  auto w2 = make_weights({8, 4, 5}, in);
  auto x2 = x0.clone().requires_grad_(true);
  auto ys2 = model::mixed_linear_groups(x2, w2, sizes, at::kBFloat16);
  ys2[1].backward(g_b);
  EXPECT_FALSE(w2[0].grad().defined());
  EXPECT_FALSE(w2[1].grad().defined());
  ASSERT_TRUE(w2[2].grad().defined());
  EXPECT_LT(rel(x2.grad().reshape({-1, in}), truth(x2, {w2[2]}, g_b, at::kBFloat16).dx), tolerance(at::kBFloat16));

  EXPECT_THROW(model::mixed_linear_groups(x, w, {2, 2}, at::kBFloat16), c10::Error);
  EXPECT_THROW(model::mixed_linear_groups(x, w, {3, 0}, at::kBFloat16), c10::Error);
}

// One product handed out in column splits (mixed_linear_split): each output a view of its columns
// in the product's rows (one row stride, the second split right after the first), the product,
// x's gradient and every weight's gradient within bf16's rounding of the fp64 products over the
// splits' gradients side by side. An output that gets no gradient counts as zeros: x's gradient is
// the other's alone, and its weights' gradients are zero.
TEST(MixedLinear, SplitOutputsShareOneProduct) {
  seed(36);
  const int64_t in = 24;
  auto x0 = torch::randn({3, 7, in});
  auto g_a = torch::randn({3, 7, 12}).to(at::kBFloat16), g_b = torch::randn({3, 7, 5}).to(at::kBFloat16);
  auto w = make_weights({8, 4, 5}, in);
  auto x = x0.clone().requires_grad_(true);
  auto ys = model::mixed_linear_split(x, w, {12, 5}, at::kBFloat16);
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_EQ(ys[0].sizes(), (std::vector<int64_t>{3, 7, 12}));
  EXPECT_EQ(ys[1].sizes(), (std::vector<int64_t>{3, 7, 5}));
  EXPECT_EQ(ys[0].stride(1), 17);
  EXPECT_EQ(ys[1].stride(1), 17);
  EXPECT_EQ(static_cast<const char*>(ys[1].data_ptr()) - static_cast<const char*>(ys[0].data_ptr()), 12 * 2);
  torch::autograd::backward({ys[0], ys[1]}, {g_a, g_b});
  const auto want = truth(x, w, torch::cat({g_a, g_b}, -1), at::kBFloat16);
  EXPECT_LT(rel(torch::cat({ys[0], ys[1]}, -1).reshape({-1, 17}), want.y), tolerance(at::kBFloat16));
  EXPECT_LT(rel(x.grad().reshape({-1, in}), want.dx), tolerance(at::kBFloat16));
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_TRUE(w[i].grad().defined()) << "weight " << i;
    EXPECT_EQ(w[i].grad().scalar_type(), torch::kFloat32);
    EXPECT_LT(rel(w[i].grad(), want.dw[i]), tolerance(at::kBFloat16)) << "weight " << i;
  }

  // Only the second output used.
  auto w2 = make_weights({8, 4, 5}, in);
  auto x2 = x0.clone().requires_grad_(true);
  auto ys2 = model::mixed_linear_split(x2, w2, {12, 5}, at::kBFloat16);
  ys2[1].backward(g_b);
  EXPECT_LT(rel(x2.grad().reshape({-1, in}), truth(x2, {w2[2]}, g_b, at::kBFloat16).dx), tolerance(at::kBFloat16));
  EXPECT_EQ(w2[0].grad().abs().max().item<float>(), 0.f);
  EXPECT_EQ(w2[1].grad().abs().max().item<float>(), 0.f);
  EXPECT_LT(rel(w2[2].grad(), truth(x2, {w2[2]}, g_b, at::kBFloat16).dw[0]), tolerance(at::kBFloat16));

  // The first output's gradient laid out in rows of the product's width, in a buffer nothing else
  // holds (as the Gated DeltaNet's conv backward hands it over): the backward takes those rows in
  // place, copies the second output's gradient into their other columns, and gives the same
  // gradients as from a gradient of its own.
  auto w3 = make_weights({8, 4, 5}, in);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < w.size(); ++i) w3[i].copy_(w[i]);
  }
  auto x3 = x0.clone().requires_grad_(true);
  auto ys3 = model::mixed_linear_split(x3, w3, {12, 5}, at::kBFloat16);
  torch::Tensor g_rows;
  {
    const auto storage = torch::empty({3 * 7 * 17}, g_a.options()).storage();
    g_rows = torch::empty({0}, g_a.options()).set_(storage, 0, {3, 7, 12}, {7 * 17, 17, 1});
  }
  g_rows.copy_(g_a);
  const int64_t in_place = model::mixed_linear_split_gradients_in_place();
  torch::autograd::backward({ys3[0], ys3[1]}, {g_rows, g_b});
  EXPECT_EQ(model::mixed_linear_split_gradients_in_place(), in_place + 1) << "the rows were not taken in place";
  EXPECT_TRUE(torch::equal(x3.grad(), x.grad()));
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(torch::equal(w3[i].grad(), w[i].grad())) << "weight " << i;

  EXPECT_THROW(model::mixed_linear_split(x, w, {12, 4}, at::kBFloat16), c10::Error);
  EXPECT_THROW(model::mixed_linear_split(x, w, {17, 0}, at::kBFloat16), c10::Error);
}

// linear_cat_columns outside the trainer's scope (the CPU): each group's product (linear_cat_groups)
// cut at the split sizes, the same values and gradients as the groups' outputs split by hand; split
// sizes off the groups' boundaries, past their rows or empty are errors that name the sizes.
TEST(MixedLinear, ColumnSplitsOfGroupsMatchTheGroupsSplit) {
  seed(37);
  const int64_t in = 16;
  auto x0 = torch::randn({2, 5, in});
  model::Linear a(in, 6), b(in, 7), a2(in, 6), b2(in, 7);
  {
    torch::NoGradGuard no_grad;
    a2->weight.copy_(a->weight);
    b2->weight.copy_(b->weight);
  }
  auto x = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
  const auto parts = model::linear_cat_columns(x, {{a}, {b}}, {6, 4, 3});
  ASSERT_EQ(parts.size(), 3u);
  const auto groups = model::linear_cat_groups(x2, {{a2}, {b2}});
  const auto b_parts = groups[1].split_with_sizes({4, 3}, -1);
  EXPECT_TRUE(torch::equal(parts[0], groups[0]));
  EXPECT_TRUE(torch::equal(parts[1], b_parts[0]));
  EXPECT_TRUE(torch::equal(parts[2], b_parts[1]));
  auto g0 = torch::randn({2, 5, 6}), g1 = torch::randn({2, 5, 4}), g2 = torch::randn({2, 5, 3});
  torch::autograd::backward({parts[0], parts[1], parts[2]}, {g0, g1, g2});
  torch::autograd::backward({groups[0], b_parts[0], b_parts[1]}, {g0, g1, g2});
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(a->weight.grad(), a2->weight.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(b->weight.grad(), b2->weight.grad(), 1e-5, 1e-6));

  const auto message = [&](const std::vector<int64_t>& sizes) {
    try {
      model::linear_cat_columns(x0, {{a}, {b}}, sizes);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({4, 9}).find("do not fall on the groups' boundaries"), std::string::npos) << message({4, 9});
  EXPECT_NE(message({6, 7, 2}).find("go past the groups' rows"), std::string::npos) << message({6, 7, 2});
  EXPECT_NE(message({6, 0, 7}).find("every split needs a column"), std::string::npos) << message({6, 0, 7});
  EXPECT_NE(message({6}).find("do not fall on the groups' boundaries"), std::string::npos) << message({6});
}

TEST(MixedLinear, LayersTakeItOnlyInsideAnActiveScopeOnAGpu) {
  auto x = torch::randn({2, 8});
  auto w = torch::randn({4, 8}, torch::requires_grad());
  EXPECT_FALSE(model::WeightGradInPlaceScope::active());
  {
    model::WeightGradInPlaceScope on;
    EXPECT_TRUE(model::WeightGradInPlaceScope::active());
    // The CPU keeps autocast's plain product.
    EXPECT_FALSE(model::mixed_linear_applies(x, w));
    {
      model::WeightGradInPlaceScope off(false);
      EXPECT_FALSE(model::WeightGradInPlaceScope::active());
    }
    EXPECT_TRUE(model::WeightGradInPlaceScope::active());
  }
  EXPECT_FALSE(model::WeightGradInPlaceScope::active());
  // The process-wide switch keeps every scope inactive.
  model::weight_grads_in_place(false);
  {
    model::WeightGradInPlaceScope on;
    EXPECT_FALSE(model::WeightGradInPlaceScope::active());
  }
  model::weight_grads_in_place(true);
}

TEST(EmbeddingInPlace, GradientMatchesAutogradAndAddsToAnExistingOne) {
  seed(34);
  const int64_t V = 50, C = 12;
  auto w0 = torch::randn({V, C});
  auto tokens = torch::randint(0, V, {3, 40}, torch::kInt64);
  tokens.index_put_({0, torch::indexing::Slice(0, 10)}, 7);  // a token repeated many times
  auto dy = torch::randn({3, 40, C});
  auto ref = w0.clone().requires_grad_(true);
  torch::embedding(ref, tokens).backward(dy);
  auto w = w0.clone().requires_grad_(true);
  auto y = model::embedding_in_place(w, tokens);
  EXPECT_TRUE(torch::equal(y.detach(), torch::embedding(w0, tokens)));
  y.backward(dy);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_LT(rel(w.grad(), ref.grad()), 1e-6);
  // A second backward adds to the gradient there.
  model::embedding_in_place(w, tokens).backward(dy);
  EXPECT_LT(rel(w.grad(), 2 * ref.grad()), 1e-6);
  EXPECT_FALSE(model::embedding_in_place_applies(w, tokens));  // the CPU, and no scope
}

// A group's shadow is kept while its weights are unchanged and recast when one changes through
// ATen (version), is swapped (set_data, as EMA does) or all are invalidated; refresh recasts only
// stale groups; a weight gets one shadow; releasing a run's weights drops their groups. Every
// value handed out equals a fresh cast bit for bit.
TEST(WeightShadow, KeptWhileCurrentRecastWhenAWeightChanges) {
  seed(9);
  model::clear_weight_shadows();
  auto a = torch::randn({12, 8}), b = torch::randn({5, 8});
  std::vector<torch::Tensor> group = {a, b};
  auto fresh = [&] { return model::cast_weight_blocks(group, at::kBFloat16); };
  const int64_t casts0 = model::weight_shadow_casts();
  auto s1 = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_TRUE(torch::equal(s1, fresh()));
  EXPECT_EQ(model::weight_shadow_groups(), 1);
  auto s2 = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_EQ(s2.data_ptr(), s1.data_ptr());
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 1) << "an unchanged group was recast";
  EXPECT_EQ(model::weight_shadow_of(b).data_ptr(), s1.narrow(0, 12, 5).data_ptr());

  {
    torch::NoGradGuard no_grad;
    b.mul_(0.5);
  }
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(group, at::kBFloat16), fresh()));
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 2);

  a.set_data(torch::randn({12, 8}));  // the version stays, the data pointer moves
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(group, at::kBFloat16), fresh()));
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 3);

  model::invalidate_weight_shadows();
  model::refresh_weight_shadows();
  model::refresh_weight_shadows();
  EXPECT_EQ(model::weight_shadow_casts(), casts0 + 4) << "refresh recast a current group";

  std::vector<torch::Tensor> b_alone = {b};
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(b_alone, at::kBFloat16), b.to(at::kBFloat16)));
  EXPECT_EQ(model::weight_shadow_groups(), 1) << "b got a second shadow";

  model::weight_shadows(false);
  EXPECT_NE(model::shadowed_weight_blocks(group, at::kBFloat16).data_ptr(), s1.data_ptr());
  EXPECT_FALSE(model::weight_shadow_of(a).defined());
  model::weight_shadows(true);
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(group, at::kBFloat16), fresh()))
      << "switched back on, the shadow must be recast (nothing kept it current meanwhile)";

  model::release_weight_shadows({a});
  EXPECT_EQ(model::weight_shadow_groups(), 0);
  EXPECT_FALSE(model::weight_shadow_of(b).defined());
}

// A shadow made with padded rows (a product at an aligned width): the weights' rows are the cast,
// the rows past them zero and left so through recasts; each weight's shadow is its block; a call
// at the weights' own width gets a view of their rows; a group made unpadded stays so.
TEST(WeightShadow, PaddedRowsStayZeroThroughRecasts) {
  seed(11);
  model::clear_weight_shadows();
  auto a = torch::randn({12, 8}), b = torch::randn({5, 8});
  std::vector<torch::Tensor> group = {a, b};
  auto fresh = [&] { return model::cast_weight_blocks(group, at::kBFloat16); };
  auto s1 = model::shadowed_weight_blocks(group, at::kBFloat16, 24);
  ASSERT_EQ(s1.sizes(), (std::vector<int64_t>{24, 8}));
  EXPECT_TRUE(torch::equal(s1.narrow(0, 0, 17), fresh()));
  EXPECT_TRUE(torch::equal(s1.narrow(0, 17, 7), torch::zeros({7, 8}, s1.options()))) << "padding rows";
  EXPECT_EQ(model::weight_shadow_of(b).data_ptr(), s1.narrow(0, 12, 5).data_ptr());
  auto unpadded = model::shadowed_weight_blocks(group, at::kBFloat16);
  EXPECT_EQ(unpadded.sizes(), (std::vector<int64_t>{17, 8}));
  EXPECT_EQ(unpadded.data_ptr(), s1.data_ptr());
  {
    torch::NoGradGuard no_grad;
    b.mul_(-3.0);
  }
  auto s2 = model::shadowed_weight_blocks(group, at::kBFloat16, 24);
  EXPECT_EQ(s2.data_ptr(), s1.data_ptr()) << "the kept buffer";
  EXPECT_TRUE(torch::equal(s2.narrow(0, 0, 17), fresh())) << "recast";
  EXPECT_TRUE(torch::equal(s2.narrow(0, 17, 7), torch::zeros({7, 8}, s2.options()))) << "padding after the recast";

  auto c = torch::randn({3, 8});
  std::vector<torch::Tensor> narrow_first = {c};
  EXPECT_EQ(model::shadowed_weight_blocks(narrow_first, at::kBFloat16).size(0), 3);
  EXPECT_EQ(model::shadowed_weight_blocks(narrow_first, at::kBFloat16, 8).size(0), 3)
      << "a group made at its own width has no padding rows to hand out";
  model::clear_weight_shadows();
}

// A group whose weights are gone is pruned when the next group is made: its buffer goes with it.
TEST(WeightShadow, GroupsOfDroppedWeightsArePruned) {
  seed(10);
  model::clear_weight_shadows();
  {
    std::vector<torch::Tensor> gone = {torch::randn({4, 8})};
    model::shadowed_weight_blocks(gone, at::kBFloat16);
  }
  EXPECT_EQ(model::weight_shadow_groups(), 1);
  std::vector<torch::Tensor> kept = {torch::randn({6, 8})};
  model::shadowed_weight_blocks(kept, at::kBFloat16);
  EXPECT_EQ(model::weight_shadow_groups(), 1);
  model::clear_weight_shadows();

  // A group keyed by a live first weight whose partner is gone gives way to the new grouping of
  // that weight (it used to block it: the new partner got a plain cast and no shadow).
  auto a = torch::randn({4, 8}), c = torch::randn({3, 8});
  {
    std::vector<torch::Tensor> with_b = {a, torch::randn({2, 8})};
    model::shadowed_weight_blocks(with_b, at::kBFloat16);
  }
  std::vector<torch::Tensor> with_c = {a, c};
  EXPECT_TRUE(torch::equal(model::shadowed_weight_blocks(with_c, at::kBFloat16), torch::cat(with_c).to(at::kBFloat16)));
  EXPECT_TRUE(model::weight_shadow_of(c).defined()) << "the dropped partner's group kept c from its shadow";
  EXPECT_EQ(model::weight_shadow_groups(), 1);
  model::clear_weight_shadows();
}

// Stacked experts' weights [E, n_i, K] share one shadow [E, Σ n_i, K]: the per-expert
// concatenation's cast; each weight's shadow is its block, strided across the experts.
TEST(WeightShadow, StackedExpertsShareOneShadow) {
  seed(11);
  model::clear_weight_shadows();
  auto gate = torch::randn({5, 6, 8}), up = torch::randn({5, 6, 8});
  std::vector<torch::Tensor> group = {gate, up};
  auto s = model::shadowed_expert_blocks(group, at::kBFloat16);
  EXPECT_TRUE(torch::equal(s, torch::cat(group, 1).to(at::kBFloat16)));
  EXPECT_EQ(model::shadowed_expert_blocks(group, at::kBFloat16).data_ptr(), s.data_ptr()) << "recast while current";
  auto su = model::weight_shadow_of(up);
  EXPECT_TRUE(torch::equal(su, up.to(at::kBFloat16)));
  EXPECT_EQ(su.strides(), (std::vector<int64_t>{12 * 8, 8, 1}));
  // Weights of different expert counts do not stack: a plain cast's error, no shadow.
  EXPECT_THROW(model::shadowed_expert_blocks({gate, torch::randn({4, 6, 8})}, at::kBFloat16), c10::Error);
  model::clear_weight_shadows();
}

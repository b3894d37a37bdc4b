// The batched fp32 products' host side (model/bmm_fp32.h): operands in bf16, as the delta rule's
// intermediates are under 16-bit training, on the ATen path every machine runs
// (the GPU kernel against fp64 is in test_bmm_fp32_cuda.cpp), and the kernel's rules for which
// bf16 operands and gathered rows it takes (kernels::gemm_tf32x3_supports, pure host arithmetic).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm_tf32x3.h"
#include "model/bmm_fp32.h"

namespace {

torch::Tensor f64(const torch::Tensor& x) { return x.to(torch::kFloat64); }

}  // namespace

// A bf16 operand is widened exactly, so the fp32 result equals the fp32 product of the widened
// values; the result is fp32 whichever operand is bf16.
TEST(BmmFp32, Bf16OperandIsWidenedExactly) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4246);
  auto a = torch::randn({3, 5, 8}), b = torch::randn({3, 8, 6});
  auto ab = a.to(torch::kBFloat16), bb = b.to(torch::kBFloat16);
  const auto wa = ab.to(torch::kFloat32), wb = bb.to(torch::kFloat32);
  auto r1 = model::bmm_fp32(ab, b, 0.5);
  ASSERT_EQ(r1.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(r1, torch::bmm(wa, b) * 0.5, 1e-6, 1e-6));
  auto r2 = model::bmm_fp32(a, bb.transpose(1, 2).contiguous().transpose(1, 2));
  ASSERT_EQ(r2.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(r2, torch::bmm(a, wb), 1e-6, 1e-6));
  // The one-pass sum with both right operands in bf16, and accumulating into an fp32 out.
  auto a2 = torch::randn({3, 5, 4}), b2 = torch::randn({3, 4, 6}).to(torch::kBFloat16);
  auto sum = model::bmm_fp32_sum(a, bb, a2, b2, 2.0);
  EXPECT_TRUE(torch::allclose(sum, (torch::bmm(a, wb) + torch::bmm(a2, b2.to(torch::kFloat32))) * 2.0, 1e-5, 1e-5));
  auto out = torch::randn({3, 5, 6});
  const auto want = torch::bmm(wa, b) * -1.0 + out * 0.25;
  model::bmm_fp32_accumulate(out, ab, b, -1.0, 0.25);
  EXPECT_TRUE(torch::allclose(out, want, 1e-5, 1e-5));
  // Two bf16 operands (the delta rule's chunk products under 16-bit training), in the one-pass sum too.
  auto r3 = model::bmm_fp32(ab, bb, 0.25);
  ASSERT_EQ(r3.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(r3, torch::bmm(wa, wb) * 0.25, 1e-6, 1e-6));
  auto a2b = a2.to(torch::kBFloat16);
  auto sum2 = model::bmm_fp32_sum(ab, bb, a2b, b2, 1.0);
  EXPECT_TRUE(torch::allclose(sum2, torch::bmm(wa, wb) + torch::bmm(a2b.to(torch::kFloat32), b2.to(torch::kFloat32)),
                              1e-5, 1e-5));
  // The row dot products with bf16 rows.
  auto x = torch::randn({4, 3, 7}).to(torch::kBFloat16), y = torch::randn({4, 3, 7});
  auto dots = model::row_dot_fp32(x, y);
  ASSERT_EQ(dots.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(f64(dots), (f64(x) * f64(y)).sum({1, 2}), 1e-5, 1e-5));
  // Both bf16, and an fp32 a beside a bf16 b (the dot is symmetric: taken as b · a).
  const auto yb = y.to(torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(f64(model::row_dot_fp32(x, yb)), (f64(x) * f64(yb)).sum({1, 2}), 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(model::row_dot_fp32(y, x), model::row_dot_fp32(x, y)));
}

TEST(BmmFp32, MismatchedOperandTypesAreRefusedByName) {
  auto a = torch::randn({2, 4, 4}), b = torch::randn({2, 4, 4});
  // bf16 beside fp64, fp16 beside bf16, fp32 beside fp64: each refused, naming the dtypes.
  try {
    model::bmm_fp32(a.to(torch::kBFloat16), b.to(torch::kFloat64));
    ADD_FAILURE() << "bf16 beside fp64 was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 beside fp32 or bf16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Double"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::bmm_fp32(a.to(torch::kHalf), b.to(torch::kBFloat16)), c10::Error);
  EXPECT_THROW(model::bmm_fp32(a, b.to(torch::kFloat64)), c10::Error);
  auto out_bf16 = torch::zeros({2, 4, 4}, torch::kBFloat16);
  EXPECT_THROW(model::bmm_fp32_accumulate(out_bf16, a.to(torch::kBFloat16), b, 1.0, 0.0), c10::Error);
}

// A bf16 output (GemmTf32x3Args::out_bf16): taken with beta 0, even strides and a 4-byte aligned
// out (column pairs are stored as one word), refused otherwise.
TEST(BmmFp32, KernelTakesABf16OutputOnItsConditions) {
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{4096});
  kernels::GemmTf32x3Args g;
  g.batch = 8, g.M = 64, g.N = 128, g.K = 64;
  g.a = {aligned, 64 * 64, 64, 1, true};
  g.b = {aligned, 64 * 128, 128, 1, true};
  g.out = reinterpret_cast<void*>(uintptr_t{8192});
  g.out_batch = 64 * 128, g.out_row = 128;
  g.out_bf16 = true;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.beta = 1.0f;  // a bf16 out is never read
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.beta = 0.0f;
  g.out_row = 129;
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.out_row = 128, g.out_batch = 64 * 128 + 1;
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.out_batch = 64 * 128, g.out = reinterpret_cast<void*>(uintptr_t{8194});
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.out_bf16 = false;  // an fp32 out takes any of these but the alignment (one float at a time)
  g.out = reinterpret_cast<void*>(uintptr_t{8192}), g.out_row = 129, g.beta = 1.0f;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
}

// Which bf16 operands the kernel takes: A in either layout, B only beside a K-contiguous A (so
// both together with a K-contiguous A), and 16-byte aligned pieces (8 bf16 elements) along the
// contiguous dimension.
TEST(BmmFp32, KernelTakesBf16OperandsByTheirLayouts) {
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{4096});
  kernels::GemmTf32x3Args g;
  g.batch = 8, g.M = 64, g.N = 128, g.K = 64;
  g.a = {aligned, 64 * 64, 64, 1};
  g.b = {aligned, 64 * 128, 128, 1, true};
  g.out = reinterpret_cast<float*>(uintptr_t{8192});
  g.out_batch = 64 * 128, g.out_row = 128;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b = {aligned, 64 * 128, 1, 64, true};  // K-contiguous bf16 B
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b.col = 68;  // rows of 68 bf16 (136 bytes) are not 16-byte aligned, though 68 fp32 would be
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.b.bf16 = false;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b = {aligned, 64 * 128, 128, 1};
  g.a = {aligned, 64 * 64, 64, 1, true};  // bf16 A, fp32 B
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b.bf16 = true;  // both bf16 beside a K-contiguous A
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.a = {aligned, 64 * 64, 1, 64, true};  // M-contiguous bf16 A beside a bf16 B
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.b.bf16 = false;  // ... beside an fp32 B
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.a.col = 60;  // M-contiguous bf16 A with columns 120 bytes apart
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.a = {aligned, 64 * 64, 1, 64};  // M-contiguous fp32 A beside a bf16 B
  g.b.bf16 = true;
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  // The second pair must be typed as the first.
  g.a = {aligned, 64 * 64, 64, 1};
  g.b = {aligned, 64 * 128, 128, 1, true};
  g.K2 = 128;
  g.a2 = {aligned, 64 * 128, 128, 1};
  g.b2 = {aligned, 128 * 128, 128, 1, true};
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b2.bf16 = false;
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.b2.bf16 = true;
  g.a.bf16 = g.a2.bf16 = true;  // the delta rule's output: every operand bf16
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
}

// Gathered rows (GatheredRows): row r of item i is src's row map[i · rows + r], and a zero row where
// the map says −1; the products with a gathered a or b equal the products of that batch, built
// here row by row. Bad maps are refused by name. On this path (ATen) the gathered copy is made.
TEST(BmmFp32, GatheredRowsAreTheMappedRowsOfSrc) {
  const int64_t R = 3, rows = 5, D = 4, n_src = 20;
  const auto src = torch::randn({n_src, D});
  const std::vector<int32_t> entries = {7, -1, 0, 19, 3, 4, 4, -1, 11, 2, -1, -1, 1, 18, 5};
  const auto map = torch::tensor(entries, torch::kInt32);
  const model::GatheredRows x{src, map, R, rows};
  auto want = torch::zeros({R, rows, D});
  for (int64_t e = 0; e < R * rows; ++e) {
    if (entries[static_cast<size_t>(e)] >= 0) want[e / rows][e % rows] = src[entries[static_cast<size_t>(e)]];
  }
  EXPECT_TRUE(torch::equal(model::gathered(x), want));
  const auto b = torch::randn({R, D, 6});
  EXPECT_TRUE(torch::allclose(model::bmm_fp32(x, b, 0.5), torch::bmm(want, b) * 0.5, 1e-6, 1e-6));
  const model::GatheredRows xb{src, map, R, rows};  // as b: [R, K = rows, N = D]
  const auto a = torch::randn({R, 2, rows});
  EXPECT_TRUE(torch::allclose(model::bmm_fp32(a, xb), torch::bmm(a, want), 1e-6, 1e-6));
  // A bf16 source is widened exactly, as a bf16 operand is.
  const model::GatheredRows x16{src.to(torch::kBFloat16), map, R, rows};
  EXPECT_TRUE(torch::equal(model::bmm_fp32(x16, b), torch::bmm(model::gathered(x16).to(torch::kFloat32), b)));
  // A map of the wrong length or dtype, and mismatched shapes, are refused naming what is wrong.
  try {
    model::gathered(model::GatheredRows{src, map.narrow(0, 0, 14), R, rows});
    ADD_FAILURE() << "a short map was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row map int32 [15]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::gathered(model::GatheredRows{src, map.to(torch::kInt64), R, rows}), c10::Error);
  EXPECT_THROW(model::bmm_fp32(x, torch::randn({R, D + 1, 6})), c10::Error);
  EXPECT_THROW(model::bmm_fp32(torch::randn({R, 2, rows + 1}), xb), c10::Error);
}

// Where the kernel takes gathered rows: a K-contiguous a, an N-contiguous b of at most
// kGemmMappedRowsMax rows of K, batch stride 0, and not on the second pair.
TEST(BmmFp32, KernelTakesGatheredRowsByTheirLayouts) {
  alignas(16) static float buf[64];
  static const int32_t map[1] = {0};
  kernels::GemmTf32x3Args g;
  g.batch = 4, g.M = 64, g.N = 128, g.K = 64;
  g.a = {buf, 0, 64, 1};
  g.a.rows = map;
  g.b = {buf, 64 * 128, 128, 1};
  g.out = buf;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.a.batch = 64 * 64;  // a gathered operand has no batch stride
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.a = {buf, 0, 1, 64};  // M-contiguous: not gathered
  g.a.rows = map;
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.a = {buf, 64 * 64, 1, 64};  // b gathered beside an M-contiguous a (the delta rule's Pᵀ dO)
  g.b = {buf, 0, 128, 1};
  g.b.rows = map;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.K = kernels::kGemmMappedRowsMax + 8;  // more rows of K than the block's map holds
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.K = 64;
  g.b = {buf, 0, 1, 64};  // K-contiguous b: not gathered
  g.b.rows = map;
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
}

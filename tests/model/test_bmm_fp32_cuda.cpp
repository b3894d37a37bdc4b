// The 3×TF32 batched product (model/bmm_fp32.h, kernels/gemm_tf32x3.*) against an fp64 product of
// the same fp32 inputs: every pairing of the operand layouts it takes (a K- or M-contiguous, b N- or
// K-contiguous, the latter two as transposed views), odd extents in the strided dimensions, partial
// tiles, alpha and in-place beta, a batch of one and the ATen fallback for layouts it refuses. Fresh
// random inputs each run, seeded from GoogleTest's seed. Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm_tf32x3.h"
#include "model/bmm_fp32.h"

namespace {

// max |x − ref| / max |ref|, in fp64.
double max_rel(const torch::Tensor& x, const torch::Tensor& ref) {
  auto r = ref.to(torch::kCPU, torch::kFloat64);
  return (x.to(torch::kCPU, torch::kFloat64) - r).abs().max().item<double>() / r.abs().max().item<double>();
}

// a [R, M, K]: contiguous, or the transposed view of a contiguous [R, K, M] (M-contiguous).
torch::Tensor make_operand(int64_t R, int64_t rows, int64_t cols, bool transposed) {
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  return transposed ? torch::randn({R, cols, rows}, opt).transpose(1, 2) : torch::randn({R, rows, cols}, opt);
}

}  // namespace

TEST(BmmFp32Cuda, SplitTf32ProductsHaveFp32Accuracy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4242);
  struct Case {
    int64_t R, M, N, K;
  };
  // The delta rule's shapes (chunk 64, head dims 128; hybrid base's dk 96, dv 192; moe-1b's dv
  // 256, so every block width 64 to 192 runs), and partial tiles in M, N and K. M = 37 is taken
  // only K-contiguous (the M-contiguous layout of it falls back to ATen). Each case in the block
  // width N picks and in 64-column blocks.
  const Case cases[] = {{64, 128, 64, 128}, {96, 64, 128, 64}, {3, 64, 128, 128}, {5, 37, 20, 44},
                        {2, 132, 68, 96},   {1, 4, 8, 4},       {7, 100, 4, 260}, {6, 64, 192, 96},
                        {5, 96, 192, 64},   {4, 64, 96, 192},   {3, 64, 160, 36}, {2, 72, 256, 64},
                        {3, 40, 140, 24}};
  double worst = 0, worst_cublas = 0;
  for (const Case& c : cases) {
    for (int layout = 0; layout < 8; ++layout) {
      model::bmm_fp32_wide_tiles(layout < 4);
      const bool a_t = layout & 1, b_t = layout & 2, wide = layout < 4;
      auto a = make_operand(c.R, c.M, c.K, a_t);
      auto b = make_operand(c.R, c.K, c.N, b_t);
      auto ref = torch::bmm(a.to(torch::kFloat64), b.to(torch::kFloat64));
      auto got = model::bmm_fp32(a, b);
      const double err = max_rel(got, ref);
      const double err_cublas = max_rel(model::bmm_fp32_reference(a, b), ref);
      worst = std::max(worst, err);
      worst_cublas = std::max(worst_cublas, err_cublas);
      // Each split product carries about 2⁻²¹ relative error (the remainders' own TF32 rounding):
      // measured ≤ 2.3e-6 here, against 8e-7 for cuBLAS's fp32 SIMT GEMM and ~1e-3 for plain TF32.
      EXPECT_LT(err, 5e-6) << "R=" << c.R << " M=" << c.M << " N=" << c.N << " K=" << c.K << " a_t=" << a_t
                           << " b_t=" << b_t << " wide=" << wide;
      // alpha, then in place: out = 0.5 · a b − 2 · out.
      auto scaled = model::bmm_fp32(a, b, -0.25);
      EXPECT_LT(max_rel(scaled, ref * -0.25), 5e-6);
      auto out0 = torch::randn({c.R, c.M, c.N}, a.options());
      auto out = out0.clone();
      model::bmm_fp32_accumulate(out, a, b, 0.5, -2.0);
      EXPECT_LT(max_rel(out, ref * 0.5 - 2.0 * out0.to(torch::kFloat64)), 5e-6);
    }
  }
  model::bmm_fp32_wide_tiles(true);
  std::printf("3xTF32 bmm vs fp64: worst %.2e (cuBLAS fp32: %.2e)\n", worst, worst_cublas);
}

// alpha · (a b + a2 b2) in one pass (the delta rule's output O = s (P Vn + Qg h_in)): both pairs in
// each layout the kernel takes, K and K2 with partial slices, and pairs of different layouts, which
// the kernel refuses and the two-launch fallback takes.
TEST(BmmFp32Cuda, SumOfTwoProductsMatchesFp64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4244);
  struct Case {
    int64_t R, M, N, K, K2;
  };
  const Case cases[] = {{64, 64, 128, 64, 128}, {12, 64, 192, 64, 96}, {5, 37, 20, 44, 20}, {3, 64, 68, 36, 100}};
  for (const Case& c : cases) {
    for (int layout = 0; layout < 16; ++layout) {
      const bool a_t = layout & 1, b_t = layout & 2, a2_t = layout & 4, b2_t = layout & 8;
      if (c.M % 4 != 0 && (a_t || a2_t)) continue;  // an M-contiguous [37, K] falls back; covered above
      auto a = make_operand(c.R, c.M, c.K, a_t), b = make_operand(c.R, c.K, c.N, b_t);
      auto a2 = make_operand(c.R, c.M, c.K2, a2_t), b2 = make_operand(c.R, c.K2, c.N, b2_t);
      const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kFloat64); };
      auto ref = (torch::bmm(f64(a), f64(b)) + torch::bmm(f64(a2), f64(b2))) * 0.375;
      EXPECT_LT(max_rel(model::bmm_fp32_sum(a, b, a2, b2, 0.375), ref), 5e-6)
          << "R=" << c.R << " M=" << c.M << " N=" << c.N << " K=" << c.K << " K2=" << c.K2 << " layout=" << layout;
    }
  }
  // The delta rule's output shape takes the one-pass kernel (not the fallback).
  kernels::GemmTf32x3Args g;
  auto P = make_operand(8, 64, 64, false), Vn = make_operand(8, 64, 128, false);
  auto Qg = make_operand(8, 64, 128, false), h = make_operand(8, 128, 128, false);
  auto out = torch::empty({8, 64, 128}, P.options());
  g.batch = 8, g.M = 64, g.N = 128, g.K = 64, g.K2 = 128;
  g.a = {P.data_ptr<float>(), 64 * 64, 64, 1};
  g.b = {Vn.data_ptr<float>(), 64 * 128, 128, 1};
  g.a2 = {Qg.data_ptr<float>(), 64 * 128, 128, 1};
  g.b2 = {h.data_ptr<float>(), 128 * 128, 128, 1};
  g.out = out.data_ptr<float>();
  g.out_batch = 64 * 128, g.out_row = 128;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.a2.col = 64, g.a2.row = 1;  // a2 M-contiguous while a is K-contiguous: refused
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
}

TEST(BmmFp32Cuda, LayoutsTheKernelRefusesFallBackToAten) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4243);
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  // K = 6 is contiguous in a and not a multiple of 4; a column slice misaligns b's rows.
  auto a = torch::randn({3, 10, 6}, opt);
  auto b = torch::randn({3, 6, 9}, opt);
  auto ref = torch::bmm(a.to(torch::kFloat64), b.to(torch::kFloat64));
  EXPECT_LT(max_rel(model::bmm_fp32(a, b), ref), 2e-6);
  auto a2 = torch::randn({2, 16, 16}, opt), b2 = torch::randn({2, 16, 21}, opt).narrow(2, 1, 16);
  EXPECT_LT(max_rel(model::bmm_fp32(a2, b2), torch::bmm(a2.to(torch::kFloat64), b2.to(torch::kFloat64))), 2e-6);
  // With the kernel switched off the product is ATen's, bit for bit.
  auto a3 = torch::randn({4, 64, 64}, opt), b3 = torch::randn({4, 64, 128}, opt);
  model::bmm_fp32_use_kernel(false);
  auto off = model::bmm_fp32(a3, b3);
  model::bmm_fp32_use_kernel(true);
  EXPECT_TRUE(torch::equal(off, torch::bmm(a3, b3)));
  EXPECT_THROW(model::bmm_fp32(a3, b3.transpose(1, 2)), c10::Error);
}

// Per-row dot products (model/bmm_fp32.h row_dot_fp32, kernels/row_dot.*) against fp64 sums of the
// same fp32 inputs: the delta rule's [R, dk, dv] states, a row length that is not a multiple of 4
// (scalar path), a misaligned view (scalar path), rows shorter than one block's stride, and none.
// Both are fp32 sums of ≤ 16384 products in different orders; relative to Σ |a ⊙ b| the error of
// either stays near n · 2⁻²⁴ at worst, so 1e-5 of that scale per row is the bound.
TEST(BmmFp32Cuda, RowDotMatchesFp64Sums) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 31);
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  struct Case {
    std::vector<int64_t> shape;
    bool offset;  // view the data one float in (not 16-byte aligned)
  };
  const Case cases[] = {{{300, 128, 128}, false}, {{77, 96, 192}, false}, {{33, 1001}, false},
                        {{41, 64, 36}, true},     {{5, 3}, false},         {{0, 16}, false}};
  for (const Case& c : cases) {
    int64_t numel = 1;
    for (const int64_t s : c.shape) numel *= s;
    auto base_a = torch::randn({numel + 1}, opt), base_b = torch::randn({numel + 1}, opt);
    const int64_t o = c.offset ? 1 : 0;
    auto a = base_a.narrow(0, o, numel).view(c.shape), b = base_b.narrow(0, o, numel).view(c.shape);
    const auto got = model::row_dot_fp32(a, b);
    ASSERT_EQ(got.dim(), 1);
    ASSERT_EQ(got.size(0), c.shape[0]);
    if (c.shape[0] == 0) continue;
    const int64_t R = c.shape[0];
    auto a64 = a.to(torch::kCPU, torch::kFloat64).reshape({R, -1}), b64 = b.to(torch::kCPU, torch::kFloat64).reshape({R, -1});
    auto want = (a64 * b64).sum(1), scale = (a64 * b64).abs().sum(1);
    const double err = ((got.to(torch::kCPU, torch::kFloat64) - want).abs() / scale).max().item<double>();
    const double err_ref =
        ((model::row_dot_fp32_reference(a, b).to(torch::kCPU, torch::kFloat64) - want).abs() / scale).max().item<double>();
    std::printf("[row_dot] shape %s%s: kernel %.1e, ATen %.1e (of sum |a b| per row)\n",
                c10::str(c.shape).c_str(), c.offset ? " misaligned" : "", err, err_ref);
    EXPECT_LT(err, 1e-5);
  }
}

namespace {

// x rounded to TF32 as the tensor cores' conversion does (cvt.rna: nearest, ties away from zero):
// the low 13 mantissa bits dropped after adding half of them.
torch::Tensor round_tf32(const torch::Tensor& x) {
  auto bits = x.contiguous().view(torch::kInt32);
  return (bits + 0x1000).bitwise_and(~0x1FFF).view(torch::kFloat32).view(x.sizes());
}

}  // namespace

// Operands in bf16 (the delta rule's intermediates under 16-bit training): the kernel stages them
// as bf16 and widens them exactly, and takes an fp32 operand beside one rounded to TF32, one mma
// per product. So against an fp64 product of the widened bf16 values and the TF32-rounded fp32
// ones only fp32 accumulation remains (5e-6, as above); against the exact product the TF32
// rounding shows where an operand is fp32 (2⁻¹¹ per element; 1e-3 of the largest output). bf16 A
// (K- or M-contiguous) beside an fp32 B, fp32 A beside a bf16 B, both bf16, each with either B
// layout; the one-pass sum with its B operands or all four in bf16. The layouts the kernel refuses
// (a bf16 B beside an M-contiguous A) fall back to ATen.
TEST(BmmFp32Cuda, Bf16OperandsMatchFp64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4245);
  struct Case {
    int64_t R, M, N, K;
  };
  // The delta rule's products against its states (C 64, dk and dv 128; hybrid base's dk 96, dv
  // 192), and partial tiles in M, N and K with extents that are multiples of 8.
  const Case cases[] = {{16, 64, 128, 128}, {6, 64, 96, 192}, {4, 64, 192, 96}, {3, 40, 24, 72}, {2, 64, 64, 128}};
  struct Types {
    bool a_t, a_bf16, b_bf16;  // a M-contiguous; which operands are bf16
  };
  const Types types[] = {{false, true, false}, {false, false, true}, {false, true, true}, {true, true, false}};
  const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kFloat64); };
  const auto as_taken = [](const torch::Tensor& x) { return x.scalar_type() == torch::kFloat32 ? round_tf32(x) : x; };
  double worst = 0, worst_exact = 0;
  for (const Case& c : cases) {
    for (const Types& ty : types) {
      for (const bool b_t : {false, true}) {
        auto a = make_operand(c.R, c.M, c.K, ty.a_t), b = make_operand(c.R, c.K, c.N, b_t);
        if (ty.a_bf16) a = a.to(torch::kBFloat16);
        if (ty.b_bf16) b = b.to(torch::kBFloat16);
        auto ref = torch::bmm(f64(as_taken(a)), f64(as_taken(b)));
        auto exact = torch::bmm(f64(a), f64(b));
        auto got = model::bmm_fp32(a, b, 1.0);
        ASSERT_EQ(got.scalar_type(), torch::kFloat32);
        const double err = max_rel(got, ref), err_exact = max_rel(got, exact);
        worst = std::max(worst, err);
        worst_exact = std::max(worst_exact, err_exact);
        const std::string what = "R=" + std::to_string(c.R) + " M=" + std::to_string(c.M) + " N=" +
                                 std::to_string(c.N) + " K=" + std::to_string(c.K) + " a_t=" + std::to_string(ty.a_t) +
                                 " b_t=" + std::to_string(b_t) + " bf16 a=" + std::to_string(ty.a_bf16) +
                                 " b=" + std::to_string(ty.b_bf16);
        EXPECT_LT(err, 5e-6) << what;
        EXPECT_LT(err_exact, ty.a_bf16 && ty.b_bf16 ? 5e-6 : 1e-3) << what;
        auto out0 = torch::randn({c.R, c.M, c.N}, a.options().dtype(torch::kFloat32));
        auto out = out0.clone();
        model::bmm_fp32_accumulate(out, a, b, -0.5, 2.0);
        EXPECT_LT(max_rel(out, ref * -0.5 + 2.0 * f64(out0)), 5e-6) << what;
      }
    }
    // O = s (P Vn + Qg h_in) with Vn and h_in in bf16, then with every operand bf16.
    auto P = make_operand(c.R, c.M, c.K, false), Qg = make_operand(c.R, c.M, c.N, false);
    auto Vn = make_operand(c.R, c.K, c.N, false).to(torch::kBFloat16);
    auto h = make_operand(c.R, c.N, c.N, false).to(torch::kBFloat16);
    auto ref = (torch::bmm(f64(round_tf32(P)), f64(Vn)) + torch::bmm(f64(round_tf32(Qg)), f64(h))) * 0.125;
    EXPECT_LT(max_rel(model::bmm_fp32_sum(P, Vn, Qg, h, 0.125), ref), 5e-6) << "sum, R=" << c.R;
    const auto Pb = P.to(torch::kBFloat16), Qb = Qg.to(torch::kBFloat16);
    ref = (torch::bmm(f64(Pb), f64(Vn)) + torch::bmm(f64(Qb), f64(h))) * 0.125;
    EXPECT_LT(max_rel(model::bmm_fp32_sum(Pb, Vn, Qb, h, 0.125), ref), 5e-6) << "bf16 sum, R=" << c.R;
  }
  // The kernel takes the delta rule's bf16 operands (not the fallback) and refuses the rest.
  auto P = make_operand(8, 64, 64, false), Vn = make_operand(8, 64, 128, false).to(torch::kBFloat16);
  auto out = torch::empty({8, 64, 128}, P.options());
  kernels::GemmTf32x3Args g;
  g.batch = 8, g.M = 64, g.N = 128, g.K = 64;
  g.a = {P.data_ptr<float>(), 64 * 64, 64, 1};
  g.b = {Vn.data_ptr(), 64 * 128, 128, 1, true};
  g.out = out.data_ptr<float>();
  g.out_batch = 64 * 128, g.out_row = 128;
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b.row = 132;  // 132 bf16 = 264 bytes: not 16-byte aligned rows
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  g.b.row = 128;
  g.a.bf16 = true;  // two bf16 operands
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b.bf16 = false;
  g.a = {P.data_ptr<float>(), 64 * 64, 1, 64, true};  // M-contiguous bf16 A beside an fp32 B
  EXPECT_TRUE(kernels::gemm_tf32x3_supports(g));
  g.b.bf16 = true;  // ... beside a bf16 B
  EXPECT_FALSE(kernels::gemm_tf32x3_supports(g));
  // The fallback (ATen, fp32) for an M-contiguous A beside a bf16 B, fp32 or bf16.
  auto At = make_operand(4, 64, 64, true);
  auto Bb = make_operand(4, 64, 32, false).to(torch::kBFloat16);
  EXPECT_LT(max_rel(model::bmm_fp32(At, Bb), torch::bmm(f64(At), f64(Bb))), 5e-6);
  const auto Atb = At.to(torch::kBFloat16);
  EXPECT_LT(max_rel(model::bmm_fp32(Atb, Bb), torch::bmm(f64(Atb), f64(Bb))), 5e-6);
  std::printf("bmm with bf16 operands vs fp64: worst %.2e against the TF32-rounded operands, %.2e against the exact ones\n",
              worst, worst_exact);
}

// Two bf16 operands go through bf16 m16n8k16 mma on ldmatrix fragments by default
// (model::bmm_fp32_bf16_mma), or through TF32 mma on the widened values: both multiply exactly, so
// both are within fp32 accumulation (5e-6) of the fp64 product, for B N- and K-contiguous, partial
// tiles in M, N and K, the widest and the 64-column blocks, alpha, beta and the one-pass sum
// (gathered rows: BmmFp32Cuda.GatheredRows*, on whichever form is on). The two forms sum in other
// orders: the largest case must differ somewhere, or the switch chose nothing.
TEST(BmmFp32Cuda, Bf16MmaMatchesTf32MmaOnTwoBf16Operands) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4246);
  struct Restore {
    ~Restore() {
      model::bmm_fp32_bf16_mma(true);
      model::bmm_fp32_wide_tiles(true);
    }
  } restore;
  struct Case {
    int64_t R, M, N, K;
  };
  const Case cases[] = {{16, 64, 128, 128}, {6, 64, 192, 64}, {4, 64, 96, 192}, {3, 40, 24, 72}, {2, 72, 160, 40}};
  const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kFloat64); };
  const auto bf16 = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
  bool any_difference = false;
  double worst = 0;
  for (const Case& c : cases) {
    for (const bool b_t : {false, true}) {
      for (const bool wide : {true, false}) {
        model::bmm_fp32_wide_tiles(wide);
        const auto a = bf16(make_operand(c.R, c.M, c.K, false)), b = bf16(make_operand(c.R, c.K, c.N, b_t));
        const auto exact = torch::bmm(f64(a), f64(b));
        const std::string what = "R=" + std::to_string(c.R) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                                 " K=" + std::to_string(c.K) + " b_t=" + std::to_string(b_t) +
                                 " wide=" + std::to_string(wide);
        model::bmm_fp32_bf16_mma(false);
        const auto tf32 = model::bmm_fp32(a, b, 0.5);
        model::bmm_fp32_bf16_mma(true);
        const auto got = model::bmm_fp32(a, b, 0.5);
        const double err = max_rel(got, 0.5 * exact), err_tf32 = max_rel(tf32, 0.5 * exact);
        worst = std::max(worst, err);
        EXPECT_LT(err, 5e-6) << "bf16 mma, " << what;
        EXPECT_LT(err_tf32, 5e-6) << "TF32 mma, " << what;
        if (c.R == 16) any_difference = any_difference || !torch::equal(got, tf32);
        auto out0 = torch::randn({c.R, c.M, c.N}, got.options());
        auto out = out0.clone();
        model::bmm_fp32_accumulate(out, a, b, -0.5, 2.0);
        EXPECT_LT(max_rel(out, exact * -0.5 + 2.0 * f64(out0)), 5e-6) << "accumulate, " << what;
      }
    }
    // O = s (P Vn + Qg h_in), all four bf16: one pass through both pairs.
    const auto P = bf16(make_operand(c.R, c.M, c.K, false)), Vn = bf16(make_operand(c.R, c.K, c.N, false));
    const auto Qg = bf16(make_operand(c.R, c.M, c.N, false)), h = bf16(make_operand(c.R, c.N, c.N, false));
    const auto ref = (torch::bmm(f64(P), f64(Vn)) + torch::bmm(f64(Qg), f64(h))) * 0.125;
    EXPECT_LT(max_rel(model::bmm_fp32_sum(P, Vn, Qg, h, 0.125), ref), 5e-6) << "bf16 sum, R=" << c.R;
  }
  EXPECT_TRUE(any_difference) << "bf16 and TF32 mma gave the same bits everywhere: the switch took one path";
  std::printf("bmm of two bf16 operands by bf16 mma vs fp64: worst %.2e\n", worst);
}

// bmm_fp32_sum's bf16 result (the delta rule's output under 16-bit training): the fp32 result rounded
// once, to the bit, whether the kernel writes it (even widths) or the fallback rounds it (an odd
// width, which the kernel's paired stores refuse); fp32 and bf16 operands, both block widths.
TEST(BmmFp32Cuda, Bf16ResultIsTheFp32ResultRoundedOnce) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 4247);
  struct Restore {
    ~Restore() { model::bmm_fp32_wide_tiles(true); }
  } restore;
  struct Case {
    int64_t R, M, N, K;
  };
  const Case cases[] = {{6, 64, 192, 64}, {4, 64, 128, 96}, {3, 40, 24, 72}, {2, 64, 21, 64}};
  const auto bf16 = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
  for (const Case& c : cases) {
    for (const bool bf16_operands : {false, true}) {
      for (const bool wide : {true, false}) {
        model::bmm_fp32_wide_tiles(wide);
        auto P = make_operand(c.R, c.M, c.K, false), Vn = make_operand(c.R, c.K, c.N, false);
        auto Qg = make_operand(c.R, c.M, c.K, false), h = make_operand(c.R, c.K, c.N, false);
        if (bf16_operands) {
          P = bf16(P), Vn = bf16(Vn), Qg = bf16(Qg), h = bf16(h);
        }
        const std::string what = "R=" + std::to_string(c.R) + " M=" + std::to_string(c.M) + " N=" +
                                 std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                 (bf16_operands ? " bf16 operands" : " fp32 operands") + (wide ? " wide" : "");
        const auto fp32 = model::bmm_fp32_sum(P, Vn, Qg, h, 0.125);
        const int64_t before = model::bmm_fp32_bf16_result_launches();
        const auto got = model::bmm_fp32_sum(P, Vn, Qg, h, 0.125, /*bf16_result=*/true);
        EXPECT_EQ(model::bmm_fp32_bf16_result_launches() - before, c.N % 2 == 0 ? 1 : 0) << what << ": the kernel";
        ASSERT_EQ(got.scalar_type(), torch::kBFloat16) << what;
        EXPECT_TRUE(torch::equal(got, bf16(fp32))) << what;
      }
    }
  }
}

// The delta rule's decay gradient with its states in bf16: a bf16, b fp32 (or bf16: the fused
// reverse scan's state gradient), against fp64 sums of the same (widened) values, on the vector
// and the scalar path.
TEST(BmmFp32Cuda, RowDotWithBf16RowsMatchesFp64Sums) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 32);
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{300, 128, 128}, {77, 96, 192}, {33, 1001}, {5, 3}}) {
    for (const bool b_bf16 : {false, true}) {
      auto a = torch::randn(shape, opt).to(torch::kBFloat16), b = torch::randn(shape, opt);
      if (b_bf16) b = b.to(torch::kBFloat16);
      const auto got = model::row_dot_fp32(a, b);
      ASSERT_EQ(got.scalar_type(), torch::kFloat32);
      const int64_t R = shape[0];
      auto a64 = a.to(torch::kCPU, torch::kFloat64).reshape({R, -1});
      auto b64 = b.to(torch::kCPU, torch::kFloat64).reshape({R, -1});
      auto want = (a64 * b64).sum(1), scale = (a64 * b64).abs().sum(1);
      const double err = ((got.to(torch::kCPU, torch::kFloat64) - want).abs() / scale).max().item<double>();
      std::printf("[row_dot] bf16 rows %s, b %s: kernel %.1e (of sum |a b| per row)\n", c10::str(shape).c_str(),
                  b_bf16 ? "bf16" : "fp32", err);
      EXPECT_LT(err, 1e-5) << c10::str(shape) << (b_bf16 ? ", b bf16" : ", b fp32");
    }
  }
}

// Products reading one operand's rows through a row map (GatheredRows: the delta rule's output
// gradient read in token order) equal, bit for bit, the kernel's product of the gathered copy: a
// gathered K-contiguous a and a gathered N-contiguous b, fp32 and bf16 sources, maps with −1
// entries (zero rows) over a larger source, partial tiles in M, N and K, K up to the map's limit.
TEST(BmmFp32Cuda, GatheredRowsMatchTheGatheredCopy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 733);
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  // R items of `rows` rows each, picked from a source of 2 R rows + 37, about 1 in 8 entries −1.
  auto make_map = [&](int64_t R, int64_t rows, int64_t n_src) {
    auto m = torch::randperm(n_src, opt.dtype(torch::kInt64)).narrow(0, 0, R * rows);
    m = torch::where(torch::rand({R * rows}, opt).lt(0.125), torch::full_like(m, -1), m);
    return m.to(torch::kInt32);
  };
  struct Case {
    int64_t R, rows, D, other;  // gathered [R, rows, D]; the plain operand's other extent
  };
  const Case cases[] = {{6, 64, 128, 64}, {4, 50, 96, 40}, {3, 64, 192, 128}, {5, 40, 24, 72}, {2, 128, 64, 64}};
  int taken = 0, taken_b = 0;
  for (const Case& c : cases) {
    for (const bool src_bf16 : {false, true}) {
      const int64_t n_src = 2 * c.R * c.rows + 37;
      auto src = torch::randn({n_src, c.D}, opt);
      if (src_bf16) src = src.to(torch::kBFloat16);
      const model::GatheredRows x{src, make_map(c.R, c.rows, n_src), c.R, c.rows};
      const auto copy = model::gathered(x);
      const std::string what = "R=" + std::to_string(c.R) + " rows=" + std::to_string(c.rows) + " D=" +
                               std::to_string(c.D) + " other=" + std::to_string(c.other) + " bf16 " +
                               std::to_string(src_bf16);
      // Gathered a [R, M = rows, K = D] by a plain b [R, K, other]: K-contiguous (as vᵀ, bf16) and
      // N-contiguous (fp32).
      for (const bool b_t : {true, false}) {
        auto b = b_t ? torch::randn({c.R, c.other, c.D}, opt).to(torch::kBFloat16).transpose(1, 2)
                     : torch::randn({c.R, c.D, c.other}, opt);
        EXPECT_TRUE(torch::equal(model::bmm_fp32(x, b, 0.25), model::bmm_fp32(copy, b, 0.25))) << what << " a, b_t " << b_t;
      }
      // A plain a [R, other, K = rows] (M-contiguous, bf16, as Pᵀ; and K-contiguous fp32) by a
      // gathered b [R, K = rows, N = D].
      if (c.rows <= kernels::kGemmMappedRowsMax) {
        const auto at = torch::randn({c.R, c.rows, c.other}, opt).to(torch::kBFloat16).transpose(1, 2);
        const auto ak = torch::randn({c.R, c.other, c.rows}, opt);
        for (const auto& a : {at, ak}) {
          if (src_bf16 && a.stride(2) != 1) continue;  // a bf16 b needs a K-contiguous a (the fallback's case)
          EXPECT_TRUE(torch::equal(model::bmm_fp32(a, x, 0.5), model::bmm_fp32(a, copy, 0.5))) << what << " b";
        }
      }
      // The kernel takes the gathered operand (not the fallback) wherever the plain one allows it.
      kernels::GemmTf32x3Args g;
      g.batch = c.R, g.M = c.rows, g.K = c.D, g.N = c.other;
      g.a = {src.data_ptr(), 0, c.D, 1, src_bf16};
      g.a.rows = x.map.data_ptr<int32_t>();
      g.b = {src.data_ptr(), c.D * c.other, c.other, 1};
      g.out = reinterpret_cast<float*>(src.data_ptr());
      taken += kernels::gemm_tf32x3_supports(g) ? 1 : 0;
      // ... and a gathered fp32 b beside an M-contiguous bf16 a (the delta rule's Pᵀ dO).
      if (!src_bf16 && c.rows <= kernels::kGemmMappedRowsMax) {
        g.M = c.other, g.K = c.rows, g.N = c.D;
        g.a = {src.data_ptr(), c.rows * c.other, 1, c.other, true};
        g.b = {src.data_ptr(), 0, c.D, 1};
        g.b.rows = x.map.data_ptr<int32_t>();
        taken_b += kernels::gemm_tf32x3_supports(g) ? 1 : 0;
      }
    }
  }
  constexpr int kCases = static_cast<int>(sizeof(cases) / sizeof(cases[0]));
  EXPECT_EQ(taken, 2 * kCases);
  EXPECT_EQ(taken_b, kCases);
}

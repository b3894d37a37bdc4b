// The delta rule backward's products with the chunk states as one kernel
// (kernels/gdr_chunk_state_grads.h, model/gdr_state_grads.h) against the four batched products and
// the row dot it replaces, and both against fp64: the model's head sizes (dk 128 and 96 with dv 128
// and 192), dk 64 with a dv that is not a multiple of 64, a row count that is odd, the output
// gradient read directly and through a row map with zero rows, dU in fp32 and in bf16, and a size
// the kernel refuses; and its bf16 outputs are its fp32 ones rounded under TF32 products. Then its
// bf16 products (model::gdr_bf16_state_grads_products, the default with bf16 outputs) against fp64
// and against the TF32 ones, at the same sizes and at dv of 16 mod 32 (the unpadded pitch).
// Last, the tight layout of the bf16-dO launches against the staged one: the same bits; and one
// kernel asking for a large, a small and again the large shared-memory size.
// Fresh random inputs each run, seeded from GoogleTest's seed. Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/gdr_chunk_state_grads.h"
#include "kernels/gdr_head_sizes.h"
#include "model/gdr_state_grads.h"
#include "tests/support/gdr_state_grads_truth.h"
#include "tests/support/torch_compare.h"

namespace {

// max |x − ref| / max |ref|, in fp64.
double max_rel(const torch::Tensor& x, const torch::Tensor& ref) {
  auto r = ref.to(torch::kCPU, torch::kFloat64);
  return (x.to(torch::kCPU, torch::kFloat64) - r).abs().max().item<double>() / r.abs().max().item<double>();
}

struct StateCase {
  int64_t R, C, dk, dv;
  bool row_map;
  bool kernel_takes;
  bool dU_bf16 = false;  // dU from the reverse scan in bf16 (the fused backward's 16-bit mode)
};

// The bf16-product switch back on however a test leaves (an ASSERT returns early).
struct Bf16ProductsRestored {
  ~Bf16ProductsRestored() { model::gdr_bf16_state_grads_products(true); }
};

// dO and dU for a case: dO_src [n, dv] fp32 (n > R·C through a row map, every seventh chunk row
// of zeros) and the row map or undefined; dU fp32 or bf16.
struct OutputGrads {
  torch::Tensor dO_src, dO_rows, dU;
};
OutputGrads random_output_grads(const StateCase& c) {
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const int64_t rows = c.R * c.C;
  OutputGrads o;
  o.dU = torch::randn({c.R, c.C, c.dv}, c.dU_bf16 ? f32.dtype(torch::kBFloat16) : f32);
  if (c.row_map) {
    // Token order: a permutation of more rows than the chunks hold, every seventh chunk row zero.
    const int64_t n_src = rows + 13;
    o.dO_src = 0.1 * torch::randn({n_src, c.dv}, f32);
    auto map = torch::randperm(n_src, torch::TensorOptions().dtype(torch::kLong)).narrow(0, 0, rows);
    map.index_put_({torch::arange(0, rows, 7)}, -1);
    o.dO_rows = map.to(torch::kInt32).to(torch::kCUDA);
  } else {
    o.dO_src = 0.1 * torch::randn({rows, c.dv}, f32);
  }
  return o;
}

}  // namespace

TEST(GdrStateGradsCuda, KernelMatchesTheProductsAndFp64) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(77);
  const Bf16ProductsRestored restore;
  model::gdr_bf16_state_grads_products(false);  // the TF32 form throughout; the bf16 one is tested below
  const std::vector<StateCase> cases = {{37, 64, 128, 128, false, true}, {37, 64, 128, 128, true, true},
                                        {11, 64, 96, 192, true, true},   {9, 64, 64, 72, false, true},
                                        {5, 64, 80, 128, true, false},   {37, 64, 128, 128, true, true, true},
                                        {11, 64, 96, 192, false, true, true}};
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const auto bf16 = f32.dtype(torch::kBFloat16);
  const double scale = 0.0884;
  for (const auto& c : cases) {
    const int64_t rows = c.R * c.C;
    // Values of the model's order: states and their gradient O(1), Vn and dU O(1), dO O(0.1).
    auto h_in = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto dh_next = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto v_new = torch::randn({c.R, c.C, c.dv}, bf16);
    const auto [dO_src, dO_rows, dU] = random_output_grads(c);
    model::gdr_fuse_state_grads(true);
    const int64_t launches = model::gdr_state_grads_launches();
    const auto got = model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale);
    EXPECT_EQ(model::gdr_state_grads_launches() - launches, c.kernel_takes ? 1 : 0)
        << "R " << c.R << " dk " << c.dk << " dv " << c.dv;
    // bf16 outputs (the fused backward's 16-bit mode): the same fp32 sums, rounded once.
    const auto got16 = model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale, true);
    EXPECT_EQ(got16.dQg.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(got16.dQg, got.dQg.to(torch::kBFloat16))) << "dQg in bf16, dk " << c.dk;
    EXPECT_TRUE(torch::equal(got16.dW, got.dW.to(torch::kBFloat16))) << "dW in bf16, dk " << c.dk;
    EXPECT_TRUE(torch::equal(got16.dKd, got.dKd.to(torch::kBFloat16))) << "dKd in bf16, dk " << c.dk;
    EXPECT_TRUE(torch::equal(got16.dP_raw, got.dP_raw) && torch::equal(got16.ddecay, got.ddecay));
    model::gdr_fuse_state_grads(false);
    const auto ref = model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale);
    model::gdr_fuse_state_grads(true);
    const auto truth = testing_support::gdr_state_grads_fp64(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale);

    const std::vector<const char*> names = {"dP_raw", "dQg", "dW", "dKd", "ddecay"};
    const std::vector<torch::Tensor> g = {got.dP_raw, got.dQg, got.dW, got.dKd, got.ddecay};
    const std::vector<torch::Tensor> r = {ref.dP_raw, ref.dQg, ref.dW, ref.dKd, ref.ddecay};
    const std::vector<torch::Tensor> t = {truth.dP_raw, truth.dQg, truth.dW, truth.dKd, truth.ddecay};
    for (size_t i = 0; i < names.size(); ++i) {
      ASSERT_EQ(g[i].sizes(), t[i].sizes()) << names[i];
      EXPECT_EQ(g[i].scalar_type(), torch::kFloat32) << names[i];
      // Both round dO and dU to TF32 the same way and widen the bf16 operands exactly: only the
      // order of the fp32 sums differs. Against fp64, the TF32 rounding (2⁻¹¹ of each fp32 operand)
      // is what remains; dKd and ddecay multiply bf16 values exactly.
      const double vs_ref = max_rel(g[i], r[i]), vs_truth = max_rel(g[i], t[i]), ref_truth = max_rel(r[i], t[i]);
      std::printf("R %ld dk %ld dv %ld map %d dU %s %-7s kernel vs products %.2e, vs fp64 %.2e (products vs fp64 %.2e)\n",
                  static_cast<long>(c.R), static_cast<long>(c.dk), static_cast<long>(c.dv), c.row_map ? 1 : 0,
                  c.dU_bf16 ? "bf16" : "fp32", names[i], vs_ref, vs_truth, ref_truth);
      EXPECT_LT(vs_ref, 2e-5) << names[i] << " R " << c.R << " dk " << c.dk << " dv " << c.dv;
      EXPECT_LT(vs_truth, 1e-3) << names[i] << " R " << c.R << " dk " << c.dk << " dv " << c.dv;
    }
    // The zero rows of the map give zero rows of dP_raw and dQg.
    if (c.row_map) {
      const auto zero_rows = torch::arange(0, rows, 7, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
      EXPECT_EQ(got.dQg.view({rows, c.dk}).index_select(0, zero_rows).abs().max().item<float>(), 0.f);
      EXPECT_EQ(got.dP_raw.view({rows, c.C}).index_select(0, zero_rows).abs().max().item<float>(), 0.f);
    }
  }
}

// With bf16 outputs the kernel takes its products as bf16 mma by default: dO (and an fp32 dU)
// rounded to bf16 as an operand, 2⁻⁹ relative, as the outputs dQg, dW and dKd are rounded anyway.
// Bounds, relative to the largest value, against fp64: dP_raw (fp32 out, dO rounded) 4e-3; dQg and
// dW (dO or dU rounded, then the output) 6e-3; dKd (exact operands, output rounded) 4e-3; ddecay
// 1e-3. And against the TF32 form's outputs: the same bounds, plus, for the bf16 outputs, one bf16
// step at the largest value's exponent (at most 2⁻⁷ of it, 7.8e-3), where the two forms' sums can
// round to neighbouring values; ddecay, the same fp32 code in both forms, to the bit. A dv that is
// not a multiple of 16 keeps the TF32 form (counted), and the fp32-output launches never take the
// bf16 one.
TEST(GdrStateGradsCuda, Bf16ProductsStayCloseToFp64AndTf32Ones) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(78);
  const Bf16ProductsRestored restore;
  // {R, C, dk, dv, map, kernel_takes, dU bf16}, kernel_takes meaning here the bf16 form: the model's
  // head sizes, compact (bf16 dU) and not, compact ones at each dv the kernel knows at compile time
  // (128, 192, 256) and each dk; dv of 16 mod 32 (pitch dv) at dk 64 and 96; dv 72, which the bf16
  // form does not take.
  const std::vector<StateCase> cases = {{37, 64, 128, 128, true, true, true}, {37, 64, 128, 128, false, true},
                                        {11, 64, 96, 192, true, true, true},  {11, 64, 96, 192, false, true},
                                        {5, 64, 128, 256, true, true, true},  {9, 64, 64, 128, false, true, true},
                                        {9, 64, 64, 80, true, true, true},    {7, 64, 96, 48, false, true},
                                        {9, 64, 64, 72, false, false, true}};
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const double scale = 0.0884;
  for (const auto& c : cases) {
    auto h_in = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto dh_next = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto v_new = torch::randn({c.R, c.C, c.dv}, bf16);
    const auto [dO_src, dO_rows, dU] = random_output_grads(c);
    const std::string what = "R " + std::to_string(c.R) + " dk " + std::to_string(c.dk) + " dv " +
                             std::to_string(c.dv) + (c.dU_bf16 ? " dU bf16" : " dU fp32");

    model::gdr_bf16_state_grads_products(true);
    const int64_t launches = model::gdr_state_grads_launches(), bf16_launches = model::gdr_state_grads_bf16_launches();
    (void)model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale);  // fp32 out: TF32 form
    const auto got = model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale, true);
    EXPECT_EQ(model::gdr_state_grads_launches() - launches, 2) << what;
    EXPECT_EQ(model::gdr_state_grads_bf16_launches() - bf16_launches, c.kernel_takes ? 1 : 0) << what;
    model::gdr_bf16_state_grads_products(false);
    const auto tf32 = model::gdr_state_grads(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale, true);
    EXPECT_EQ(model::gdr_state_grads_bf16_launches() - bf16_launches, c.kernel_takes ? 1 : 0) << what;
    const auto truth = testing_support::gdr_state_grads_fp64(dO_src, dO_rows, dU, h_in, dh_next, v_new, scale);

    const std::vector<const char*> names = {"dP_raw", "dQg", "dW", "dKd", "ddecay"};
    const std::vector<torch::Tensor> g = {got.dP_raw, got.dQg, got.dW, got.dKd, got.ddecay};
    const std::vector<torch::Tensor> r = {tf32.dP_raw, tf32.dQg, tf32.dW, tf32.dKd, tf32.ddecay};
    const std::vector<torch::Tensor> t = {truth.dP_raw, truth.dQg, truth.dW, truth.dKd, truth.ddecay};
    const std::vector<double> bounds = {4e-3, 6e-3, 6e-3, 4e-3, 1e-3};
    for (size_t i = 0; i < names.size(); ++i) {
      ASSERT_EQ(g[i].sizes(), t[i].sizes()) << names[i];
      EXPECT_EQ(g[i].scalar_type(), i == 0 || i == 4 ? torch::kFloat32 : torch::kBFloat16) << names[i];
      const double vs_truth = max_rel(g[i], t[i]), vs_tf32 = max_rel(g[i], r[i]);
      std::printf("%s %-7s bf16 products vs fp64 %.2e, vs TF32 products %.2e (TF32 vs fp64 %.2e)\n", what.c_str(),
                  names[i], vs_truth, vs_tf32, max_rel(r[i], t[i]));
      EXPECT_LT(vs_truth, bounds[i]) << names[i] << ", " << what;
      const double one_bf16_step = g[i].scalar_type() == torch::kBFloat16 ? 7.8e-3 : 0.0;
      EXPECT_LT(vs_tf32, bounds[i] + one_bf16_step) << names[i] << ", " << what;
    }
    EXPECT_TRUE(torch::equal(got.ddecay, tf32.ddecay)) << "ddecay, " << what;
    if (c.row_map) {  // the zero rows of the map still give zero rows of dP_raw and dQg
      const int64_t rows = c.R * c.C;
      const auto zero_rows = torch::arange(0, rows, 7, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
      EXPECT_EQ(got.dQg.view({rows, c.dk}).index_select(0, zero_rows).abs().max().item<float>(), 0.f) << what;
      EXPECT_EQ(got.dP_raw.view({rows, c.C}).index_select(0, zero_rows).abs().max().item<float>(), 0.f) << what;
    }
    if (c.dU_bf16 && c.kernel_takes) {
      // dO in bf16 (the 16-bit path's output gradient), staged as it is: every output the same bits
      // as from an fp32 dO of its values, but ddecay: a bf16 dO takes a whole row a block
      // (kernels::gdr_chunk_state_grads_whole_row), which sums each row's ddecay in another order
      // (1e-6). Both launches take the bf16 form (counted): the kernel reads a bf16 dO in no other.
      model::gdr_bf16_state_grads_products(true);
      const auto dO16 = dO_src.to(torch::kBFloat16);
      const int64_t before = model::gdr_state_grads_bf16_launches();
      const auto from16 = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, scale, true);
      const auto from_values =
          model::gdr_state_grads(dO16.to(torch::kFloat32), dO_rows, dU, h_in, dh_next, v_new, scale, true);
      EXPECT_EQ(model::gdr_state_grads_bf16_launches() - before, 2) << what << ", bf16 dO";
      const std::vector<torch::Tensor> a = {from16.dP_raw, from16.dQg, from16.dW, from16.dKd, from16.ddecay};
      const std::vector<torch::Tensor> b = {from_values.dP_raw, from_values.dQg, from_values.dW, from_values.dKd,
                                            from_values.ddecay};
      for (size_t i = 0; i + 1 < names.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << names[i] << ", bf16 dO, " << what;
      EXPECT_LT(max_rel(a[4], b[4]), 1e-6) << "ddecay, bf16 dO, " << what;
    }
  }
}

// The tight layout (kernels::gdr_chunk_state_grads_tight: with a bf16 dO, dh_next staged after the
// first pass in dO's room and dU after the second in Vn's) against the layout that stages dh_next
// with dO: the same products in the same order, so every output the same bits (ddecay too: each
// row's two halves added onto zero). At each dv the kernel knows at compile time (128, 192, 256),
// each dk, a dv it takes as an argument (80), the row map with zero rows; counted. A block for each
// half of dk (the whole-row blocks are compared with these below).
TEST(GdrStateGradsCuda, TightLayoutGivesTheSameBits) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(80);
  struct TightRestored {
    ~TightRestored() {
      kernels::gdr_chunk_state_grads_tight(true);
      kernels::gdr_chunk_state_grads_whole_row(true);
    }
  } restore;
  kernels::gdr_chunk_state_grads_whole_row(false);
  const Bf16ProductsRestored products_back;
  model::gdr_bf16_state_grads_products(true);
  const std::vector<StateCase> cases = {{300, 64, 96, 192, true, true, true}, {37, 64, 128, 128, false, true, true},
                                        {5, 64, 128, 256, true, true, true},  {9, 64, 64, 80, true, true, true}};
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (const auto& c : cases) {
    auto h_in = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto dh_next = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto v_new = torch::randn({c.R, c.C, c.dv}, bf16);
    const auto [dO_src, dO_rows, dU] = random_output_grads(c);
    const auto dO16 = dO_src.to(torch::kBFloat16);
    const std::string what = "R " + std::to_string(c.R) + " dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv);
    kernels::gdr_chunk_state_grads_tight(true);
    const int64_t before = kernels::gdr_chunk_state_grads_tight_launches();
    const auto tight = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, 0.0884, true);
    EXPECT_EQ(kernels::gdr_chunk_state_grads_tight_launches() - before, 1) << what;
    kernels::gdr_chunk_state_grads_tight(false);
    const auto staged = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, 0.0884, true);
    EXPECT_EQ(kernels::gdr_chunk_state_grads_tight_launches() - before, 1) << what;
    EXPECT_TRUE(torch::equal(tight.dP_raw, staged.dP_raw)) << "dP_raw, " << what;
    EXPECT_TRUE(torch::equal(tight.dQg, staged.dQg)) << "dQg, " << what;
    EXPECT_TRUE(torch::equal(tight.dW, staged.dW)) << "dW, " << what;
    EXPECT_TRUE(torch::equal(tight.dKd, staged.dKd)) << "dKd, " << what;
    EXPECT_TRUE(torch::equal(tight.ddecay, staged.ddecay)) << "ddecay, " << what;
    EXPECT_GT(tight.dQg.abs().max().item<float>(), 0.f) << what;
  }
}

// A whole row a block (kernels::gdr_chunk_state_grads_whole_row, the default) against a block for each
// half of dk, both in the tight layout: each output tile the same products in the same order, so
// dP_raw, dQg, dW and dKd the same bits; ddecay's row sum taken in another order (1e-6). At each dv
// the kernel knows at compile time and each dk, with and without a row map; counted.
TEST(GdrStateGradsCuda, WholeRowBlocksGiveTheSameTiles) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(82);
  struct WholeRowRestored {
    ~WholeRowRestored() { kernels::gdr_chunk_state_grads_whole_row(true); }
  } restore;
  const Bf16ProductsRestored products_back;
  model::gdr_bf16_state_grads_products(true);
  const std::vector<StateCase> cases = {{300, 64, 96, 192, true, true, true},
                                        {37, 64, 128, 128, false, true, true},
                                        {5, 64, 128, 256, true, true, true},
                                        {11, 64, 64, 192, false, true, true}};
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (const auto& c : cases) {
    auto h_in = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto dh_next = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto v_new = torch::randn({c.R, c.C, c.dv}, bf16);
    const auto [dO_src, dO_rows, dU] = random_output_grads(c);
    const auto dO16 = dO_src.to(torch::kBFloat16);
    const std::string what = "R " + std::to_string(c.R) + " dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv);
    kernels::gdr_chunk_state_grads_whole_row(false);
    const auto halves = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, 0.0884, true);
    kernels::gdr_chunk_state_grads_whole_row(true);
    const int64_t before = kernels::gdr_chunk_state_grads_whole_row_launches();
    const auto whole = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, 0.0884, true);
    EXPECT_EQ(kernels::gdr_chunk_state_grads_whole_row_launches() - before, 1) << what;
    EXPECT_TRUE(torch::equal(whole.dP_raw, halves.dP_raw)) << "dP_raw, " << what;
    EXPECT_TRUE(torch::equal(whole.dQg, halves.dQg)) << "dQg, " << what;
    EXPECT_TRUE(torch::equal(whole.dW, halves.dW)) << "dW, " << what;
    EXPECT_TRUE(torch::equal(whole.dKd, halves.dKd)) << "dKd, " << what;
    EXPECT_LT(max_rel(whole.ddecay, halves.ddecay), 1e-6) << "ddecay, " << what;
    EXPECT_GT(whole.dW.abs().max().item<float>(), 0.f) << what;
  }
}

// Chunks of length 0 (a fixed layout's spare chunks) skipped through chunk_len (row r is chunk
// r / heads's): every row of the other chunks the same bits as without skipping, and the skipped
// rows' ddecay zero (each row's sum starts from zero). The skipped rows of the other outputs are
// left as they were (no reader: the fused backward's solve and tail skip those chunks too); the
// first chunk, the last and two runs in between are skipped, at hybrid base's and moe-1b's sizes.
TEST(GdrStateGradsCuda, ChunksOfLengthZeroAreSkipped) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(81);
  const Bf16ProductsRestored products_back;
  model::gdr_bf16_state_grads_products(true);
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const std::vector<std::pair<StateCase, int64_t>> cases = {{{60, 64, 96, 192, true, true, true}, 6},
                                                             {{24, 64, 128, 256, false, true, true}, 3}};
  for (const auto& [c, heads] : cases) {
    auto h_in = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto dh_next = torch::randn({c.R, c.dk, c.dv}, bf16);
    auto v_new = torch::randn({c.R, c.C, c.dv}, bf16);
    const auto [dO_src, dO_rows, dU] = random_output_grads(c);
    const auto dO16 = dO_src.to(torch::kBFloat16);
    const int64_t n_chunks = c.R / heads;
    auto len = torch::full({n_chunks}, c.C, torch::kInt32);
    for (const int64_t n : {int64_t{0}, n_chunks - 1, n_chunks / 2, n_chunks / 2 + 1, n_chunks / 3}) len[n] = 0;
    const auto skipped = (len == 0).repeat_interleave(heads).to(torch::kCUDA);  // [R]
    const auto kept = skipped.logical_not();
    const auto all = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, 0.0884, true);
    const auto some = model::gdr_state_grads(dO16, dO_rows, dU, h_in, dh_next, v_new, 0.0884, true,
                                             len.to(torch::kCUDA), heads);
    const std::string what = "dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv);
    EXPECT_TRUE(torch::equal(some.dP_raw.index({kept}), all.dP_raw.index({kept}))) << "dP_raw, " << what;
    EXPECT_TRUE(torch::equal(some.dQg.index({kept}), all.dQg.index({kept}))) << "dQg, " << what;
    EXPECT_TRUE(torch::equal(some.dW.index({kept}), all.dW.index({kept}))) << "dW, " << what;
    EXPECT_TRUE(torch::equal(some.dKd.index({kept}), all.dKd.index({kept}))) << "dKd, " << what;
    EXPECT_TRUE(torch::equal(some.ddecay.index({kept}), all.ddecay.index({kept}))) << "ddecay, " << what;
    EXPECT_EQ(some.ddecay.index({skipped}).abs().max().item<float>(), 0.f) << "skipped rows' ddecay, " << what;
    EXPECT_GT(all.ddecay.index({skipped}).abs().max().item<float>(), 0.f) << "the skipped rows had sums to skip";
  }
}

// The kernel that takes dv as an argument (gdr_fixed_head_sizes off) asks for its shared memory at
// each launch: 102 KiB at dv 256, 30 KiB at dv 64, then 102 KiB again. The opt-in
// (kernels/smem_opt_in.cuh) must keep the largest size allowed: lowered to dv 64's, the third
// launch would fail. Each launch's outputs equal those of the same inputs launched before.
TEST(GdrStateGradsCuda, OneKernelTakesALargeASmallAndALargeBlockAgain) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(81);
  struct Restore {
    ~Restore() { kernels::gdr_fixed_head_sizes(true); }
  } restore;
  kernels::gdr_fixed_head_sizes(false);
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  struct Inputs {
    torch::Tensor dO, dO_rows, dU, h_in, dh_next, v_new;
  };
  auto draw = [&](int64_t dv) {
    const StateCase c{5, 64, 128, dv, false, true, true};
    const auto g = random_output_grads(c);
    return Inputs{g.dO_src.to(torch::kBFloat16), g.dO_rows, g.dU, torch::randn({c.R, c.dk, c.dv}, bf16),
                  torch::randn({c.R, c.dk, c.dv}, bf16), torch::randn({c.R, c.C, c.dv}, bf16)};
  };
  auto run = [](const Inputs& in) {
    return model::gdr_state_grads(in.dO, in.dO_rows, in.dU, in.h_in, in.dh_next, in.v_new, 0.0884, true);
  };
  const Inputs wide = draw(256), narrow = draw(64);
  const auto large = run(wide);
  const auto small = run(narrow);
  EXPECT_GT(small.dQg.abs().max().item<float>(), 0.f);
  const auto large_again = run(wide);
  EXPECT_TRUE(torch::equal(large.dQg, large_again.dQg) && torch::equal(large.dW, large_again.dW) &&
              torch::equal(large.dKd, large_again.dKd) && torch::equal(large.dP_raw, large_again.dP_raw));
}

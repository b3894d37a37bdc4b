// The fused training kernels against their ATen references on the same GPU, forward and backward:
// residual add + RMSNorm (every dtype combination the models use), RoPE on strided q/k views,
// SwiGLU on the fused gate|up output, and a whole tiny model's loss and gradients on the GPU
// (fused path) against the CPU (reference path). Fresh random inputs each run (seeded from
// GoogleTest's random seed, printed on failure), odd sizes included. Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/column_sum.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/l2_norm.h"
#include "kernels/rmsnorm_train.h"
#include "kernels/short_conv.h"
#include "kernels/zero_rows.h"
#include "model/decoder_lm.h"
#include "model/fp8_linear.h"
#include "model/fp8_swiglu_mlp.h"
#include "model/fused_gated_norm.h"
#include "model/fused_gdn_gates.h"
#include "model/fused_l2norm.h"
#include "model/fused_rmsnorm.h"
#include "model/fused_rope.h"
#include "model/fused_short_conv.h"
#include "model/gated_deltanet.h"
#include "model/fused_swiglu.h"
#include "model/kernel_dtype.h"
#include "model/layers.h"
#include "model/linear.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::rel_norm_diff;
using testing_support::seed_from_gtest;

// Tolerance of a result stored in `t`: fp32 differs by summation order only; bf16/fp16 by one
// rounding of the same fp32 value (2^-8, 2^-11) where the two sides' fp32 values straddle it.
double tol_for(torch::ScalarType t) {
  if (t == torch::kFloat32) return 1e-5;
  return t == torch::kBFloat16 ? 8e-3 : 1e-3;
}

const char* name_of(torch::ScalarType t) {
  return t == torch::kFloat32 ? "f32" : t == torch::kBFloat16 ? "bf16" : "f16";
}

}  // namespace

TEST(FusedOpsCuda, AddRmsNormMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(71);
  struct Combo {
    torch::ScalarType x, y, b;
  };
  const Combo combos[] = {{torch::kFloat32, torch::kFloat32, torch::kFloat32},
                          {torch::kFloat32, torch::kBFloat16, torch::kBFloat16},
                          {torch::kFloat32, torch::kFloat32, torch::kBFloat16},
                          {torch::kFloat32, torch::kHalf, torch::kHalf},
                          {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16}};
  struct Shape {
    int64_t rows, C;
  };
  // C = 10000 is past the kernels' widest row: it checks the fallback to the reference. Rows whose
  // width is a multiple of 4 move 4 columns per load, or 1 with the switch off (both are checked);
  // 37 and 4097 always move 1.
  for (const bool vec : {true, false}) {
    kernels::add_rmsnorm_vector_loads(vec);
    for (const Combo cb : combos) {
      for (const Shape sh : {Shape{1, 37}, Shape{1000, 768}, Shape{5, 1028}, Shape{333, 4097}, Shape{64, 8000},
                             Shape{16, 10000}}) {
        for (const bool with_b : {true, false}) {
          for (const bool with_w : {true, false}) {
            const std::string what = std::string(vec ? "vec4" : "scalar") + " x " + name_of(cb.x) + " y " +
                                     name_of(cb.y) + " b " + (with_b ? name_of(cb.b) : "-") +
                                     " rows=" + std::to_string(sh.rows) + " C=" + std::to_string(sh.C) +
                                     (with_w ? " w" : " no-w");
            auto x0 = (torch::randn({sh.rows, sh.C + 3}, torch::kCUDA) * 2.0).narrow(1, 1, sh.C).to(cb.x);  // strided
            auto b0 = with_b ? torch::randn({sh.rows, sh.C}, torch::kCUDA).to(cb.b) : torch::Tensor();
            auto w0 = with_w ? torch::rand({sh.C}, torch::kCUDA) + 0.5 : torch::Tensor();
            auto dy = torch::randn({sh.rows, sh.C}, torch::kCUDA).to(cb.y);
            auto dh_in = torch::randn({sh.rows, sh.C}, torch::kCUDA).to(cb.x);
            auto run = [&](bool fused) {
              auto x = x0.detach().clone().requires_grad_(true);
              auto b = with_b ? b0.detach().clone().requires_grad_(true) : torch::Tensor();
              auto w = with_w ? w0.detach().clone().requires_grad_(true) : torch::Tensor();
              auto out = fused ? model::fused_add_rms_norm(x, b, w, 1e-6, cb.y)
                               : model::add_rms_norm_reference(x, b, w, 1e-6, cb.y);
              // The residual h also flows on (its own gradient) when there is an add.
              auto loss = (out.y.to(torch::kFloat32) * dy.to(torch::kFloat32)).sum();
              if (with_b) loss = loss + (out.h.to(torch::kFloat32) * dh_in.to(torch::kFloat32)).sum();
              loss.backward();
              return std::vector<torch::Tensor>{out.y.detach(), out.h.detach(), x.grad(),
                                                with_b ? b.grad() : torch::zeros({1}),
                                                with_w ? w.grad() : torch::zeros({1})};
            };
            auto f = run(true), r = run(false);
            EXPECT_EQ(f[0].scalar_type(), cb.y) << what;
            EXPECT_LT(rel_norm_diff(f[0], r[0]), tol_for(cb.y)) << what << " y";
            EXPECT_LT(rel_norm_diff(f[1], r[1]), tol_for(cb.x)) << what << " h";
            // dx: the fused kernel and autograd both compute it in fp32 from the same dy.
            EXPECT_LT(rel_norm_diff(f[2], r[2]), tol_for(cb.x) * 2) << what << " dx";
            if (with_b) {
              EXPECT_LT(rel_norm_diff(f[3], r[3]), tol_for(cb.b) * 2) << what << " db";
            }
            if (with_w) {
              EXPECT_LT(rel_norm_diff(f[4], r[4]), cb.y == torch::kFloat32 ? 1e-5 : 1e-2) << what << " dw";
            }
            if ((sh.C == 4097 || sh.C == 1028) && with_b && with_w)
              std::printf("[measured] fused add+RMSNorm %s: y %.3g h %.3g dx %.3g db %.3g dw %.3g\n", what.c_str(),
                          rel_norm_diff(f[0], r[0]), rel_norm_diff(f[1], r[1]), rel_norm_diff(f[2], r[2]), rel_norm_diff(f[3], r[3]), rel_norm_diff(f[4], r[4]));
          }
        }
      }
    }
  }
  kernels::add_rmsnorm_vector_loads(true);
}

// An add + RMSNorm whose sum h nothing reads (the final norm before the LM head) gets no zero
// gradient for it (no fill, no read): x's, b's and w's gradients as the reference's; and one whose
// y nothing reads gets them from h's gradient alone (dy taken as zeros).
TEST(FusedOpsCuda, AddRmsNormWithOneOutputUnread) {
  DD_REQUIRE_GPU();
  seed_from_gtest(72);
  const int64_t rows = 300, C = 768;
  auto x0 = torch::randn({rows, C}, torch::kCUDA), b0 = torch::randn({rows, C}, torch::kCUDA).to(torch::kBFloat16);
  auto w0 = torch::rand({C}, torch::kCUDA) + 0.5;
  auto g = torch::randn({rows, C}, torch::kCUDA);
  for (const bool read_y : {true, false}) {
    auto run = [&](bool fused) {
      auto x = x0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      auto out = fused ? model::fused_add_rms_norm(x, b, w, 1e-6, torch::kBFloat16)
                       : model::add_rms_norm_reference(x, b, w, 1e-6, torch::kBFloat16);
      (((read_y ? out.y : out.h).to(torch::kFloat32)) * g).sum().backward();
      return std::vector<torch::Tensor>{x.grad(), b.grad(), w.grad()};
    };
    const auto f = run(true), r = run(false);
    const char* names[] = {"dx", "db", "dw"};
    for (size_t i = 0; i < f.size(); ++i) {
      if (i == 2 && !read_y) {  // w reaches only y: no gradient (the reference) or zeros
        EXPECT_FALSE(r[i].defined());
        EXPECT_TRUE(!f[i].defined() || f[i].abs().max().item<float>() == 0.f);
        continue;
      }
      ASSERT_TRUE(f[i].defined()) << names[i] << (read_y ? ", y read" : ", h read");
      EXPECT_LT(rel_norm_diff(f[i], r[i]), 2e-2) << names[i] << (read_y ? ", y read" : ", h read");
    }
  }
}

// An RMSNorm with no add reads a column slice of wider rows in place (MLA's latent, the first rkv
// columns of its K|V projection's rows): the same bits forward and backward as on a contiguous copy
// where both take the same vector width (a thread's columns, and so the sums' order, follow it), and
// within rounding of the reference where they do not (a row stride that is not a multiple of 4 on
// aligned rows: one column at a time). The slice is read in place, not copied: the saved input then
// shares the slice's version, and changing the slice in place makes the backward refuse. Slices of
// 2-D, 3-D and 4-D tensors, one with a dim of size 1 whose stride is that of a wider tensor, and a
// 4-D view that is not one row stride apart across its outer dims (copied).
TEST(FusedOpsCuda, RmsNormReadsAColumnSliceInPlace) {
  DD_REQUIRE_GPU();
  seed_from_gtest(79);
  // The block kernels' reading (NarrowRmsNormRowsMatchReference checks the narrow ones' slices): a
  // 16-bit slice and its copy could otherwise take different kernels, and sum in different orders.
  kernels::add_rmsnorm_narrow_rows(false);
  struct Shape {
    std::vector<int64_t> outer;  // the leading dims of the buffer, rows last
    int64_t C, width, col;
    bool vec_both;  // both sides in 4-column vectors (or both one at a time): the same bits
    bool in_place;  // read where it lies (else the norm copies it)
  };
  const Shape shapes[] = {{{4, 300}, 256, 288, 0, true, true},   {{2, 97}, 512, 516, 4, true, true},
                          {{3, 50}, 64, 67, 1, false, true},     {{3, 50}, 64, 66, 0, false, true},
                          {{200}, 128, 136, 8, true, true},       {{2, 1, 40}, 64, 72, 0, true, true},
                          {{2, 3, 40}, 64, 72, 0, true, true}};
  for (const Shape& sh : shapes) {
    for (const auto dt : {torch::kBFloat16, torch::kFloat32}) {
      std::string what = std::string(name_of(dt)) + " C=" + std::to_string(sh.C) + " of rows of " +
                         std::to_string(sh.width) + " from column " + std::to_string(sh.col) + ", " +
                         std::to_string(sh.outer.size() + 1) + "-d";
      std::vector<int64_t> sizes = sh.outer;
      sizes.push_back(sh.width);
      const auto rows = torch::randn(sizes, torch::kCUDA).to(dt);
      const auto w0 = torch::rand({sh.C}, torch::kCUDA) + 0.5;
      auto dy_sizes = sh.outer;
      dy_sizes.push_back(sh.C);
      const auto dy = torch::randn(dy_sizes, torch::kCUDA).to(dt);
      auto run = [&](bool slice) {
        auto base = rows.detach().clone().requires_grad_(true);
        auto x = base.narrow(-1, sh.col, sh.C);
        if (!slice) x = x.contiguous();
        auto w = w0.detach().clone().requires_grad_(true);
        auto y = model::fused_rms_norm(x, w, 1e-6);
        (y.to(torch::kFloat32) * dy.to(torch::kFloat32)).sum().backward();
        return std::vector<torch::Tensor>{y.detach(), base.grad(), w.grad()};
      };
      kernels::add_rmsnorm_vector_loads(sh.vec_both || sh.width % 4 != 0);
      const auto in_place = run(true);
      if (sh.vec_both) {
        const auto copied = run(false);
        EXPECT_TRUE(torch::equal(in_place[0], copied[0])) << what << ": y";
        EXPECT_TRUE(torch::equal(in_place[1], copied[1])) << what << ": x's gradient";
        EXPECT_TRUE(torch::equal(in_place[2], copied[2])) << what << ": w's gradient";
      }
      auto xr = rows.narrow(-1, sh.col, sh.C).to(torch::kFloat32).requires_grad_(true);
      auto wr = w0.clone().requires_grad_(true);
      auto ref = model::rms_norm_reference(xr, wr, 1e-6);
      (ref * dy.to(torch::kFloat32)).sum().backward();
      EXPECT_LT(rel_norm_diff(in_place[0].to(torch::kFloat32), ref.detach()), tol_for(dt)) << what << ": y, reference";
      EXPECT_LT(rel_norm_diff(in_place[1].narrow(-1, sh.col, sh.C).to(torch::kFloat32), xr.grad()), 2 * tol_for(dt))
          << what << ": x's gradient, reference";
      EXPECT_LT(rel_norm_diff(in_place[2], wr.grad()), dt == torch::kFloat32 ? 1e-5 : 1e-2) << what << ": w's gradient";
      // Read in place: a later in-place change of the rows reaches the saved input.
      auto base = rows.detach().clone().requires_grad_(true);
      auto base2 = base * 1;
      auto y = model::fused_rms_norm(base2.narrow(-1, sh.col, sh.C), w0.detach().clone().requires_grad_(true), 1e-6);
      {
        torch::NoGradGuard no_grad;
        base2.mul_(1);
      }
      bool refused = false;
      try {
        y.to(torch::kFloat32).sum().backward();
      } catch (const c10::Error&) {
        refused = true;
      }
      EXPECT_EQ(refused, sh.in_place) << what << ": the slice read in place";
    }
  }
  // A 4-D view whose size-1 dim carries the stride of a tensor twice as long: not one row stride
  // apart across its outer dims, so the norm copies it (reading it in place would be wrong).
  const auto wide = torch::randn({2, 2 * 40, 72}, torch::kCUDA).to(torch::kBFloat16);
  const auto view = wide.view({2, 1, 80, 72}).narrow(2, 0, 40).narrow(3, 0, 64);
  const auto w1 = torch::rand({64}, torch::kCUDA) + 0.5;
  EXPECT_TRUE(torch::equal(model::fused_rms_norm(view, w1, 1e-6), model::fused_rms_norm(view.contiguous(), w1, 1e-6)))
      << "a view whose outer dims are not one row stride apart";
  kernels::add_rmsnorm_vector_loads(true);
  kernels::add_rmsnorm_narrow_rows(true);
}

// Narrow 16-bit rows without an add (MLA's latent norms: 384 and 256 wide at hybrid base, read in
// place out of wider rows) take the four-rows-a-warp kernels (kernels/rmsnorm_narrow.cu): within
// rounding of the fp32 reference and of the block kernels, forward and backward, with and without
// a weight, at row counts that leave a group of four part full; a slice the same bits as its copy.
// Rows the narrow kernels cannot take (a width not a multiple of 8, wider than 512, a slice whose
// rows are not 16-byte aligned) keep the block kernels, counted.
TEST(FusedOpsCuda, NarrowRmsNormRowsMatchReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(83);
  struct Shape {
    int64_t rows, C, width, col;
    bool narrow;  // the narrow kernels take it
  };
  const Shape shapes[] = {{1, 8, 8, 0, true},          {3, 64, 64, 0, true},      {1000, 384, 384, 0, true},
                          {4099, 256, 288, 0, true},   {517, 512, 520, 8, true},  {33, 136, 136, 0, true},
                          {16389, 384, 672, 0, true},  {70, 320, 328, 8, true},   {50, 256, 288, 1, false},
                          {50, 37, 37, 0, false},      {20, 520, 520, 0, false}};
  for (const auto dt : {torch::kBFloat16, torch::kHalf}) {
    for (const Shape& sh : shapes) {
      for (const bool with_w : {true, false}) {
        const std::string what = std::string(name_of(dt)) + " rows=" + std::to_string(sh.rows) +
                                 " C=" + std::to_string(sh.C) + " of " + std::to_string(sh.width) + " from column " +
                                 std::to_string(sh.col) + (with_w ? " w" : " no-w");
        const auto rows = torch::randn({sh.rows, sh.width}, torch::kCUDA).mul(1.5).to(dt);
        const auto w0 = torch::rand({sh.C}, torch::kCUDA) + 0.5;
        const auto dy = torch::randn({sh.rows, sh.C}, torch::kCUDA).to(dt);
        auto run = [&](bool narrow, bool slice) {
          kernels::add_rmsnorm_narrow_rows(narrow);
          auto base = rows.detach().clone().requires_grad_(true);
          auto x = base.narrow(-1, sh.col, sh.C);
          if (!slice) x = x.contiguous();
          auto w = with_w ? w0.detach().clone().requires_grad_(true) : torch::Tensor();
          const int64_t before = kernels::add_rmsnorm_narrow_launches();
          auto y = model::fused_rms_norm(x, w, 1e-6);
          (y.to(torch::kFloat32) * dy.to(torch::kFloat32)).sum().backward();
          torch::cuda::synchronize();
          const int64_t launches = kernels::add_rmsnorm_narrow_launches() - before;
          kernels::add_rmsnorm_narrow_rows(true);
          return std::make_pair(std::vector<torch::Tensor>{y.detach(), base.grad().narrow(-1, sh.col, sh.C),
                                                           with_w ? w.grad() : torch::zeros({1})},
                                launches);
        };
        const auto [narrow, narrow_launches] = run(true, true);
        const auto [block, block_launches] = run(false, true);
        EXPECT_EQ(narrow_launches, sh.narrow ? 2 : 0) << what << ": narrow launches, forward and backward";
        EXPECT_EQ(block_launches, 0) << what << ": the switch off";
        auto xr = rows.narrow(-1, sh.col, sh.C).to(torch::kFloat32).requires_grad_(true);
        auto wr = with_w ? w0.clone().requires_grad_(true) : torch::Tensor();
        auto ref = model::rms_norm_reference(xr, wr, 1e-6);
        (ref * dy.to(torch::kFloat32)).sum().backward();
        const double tol = tol_for(dt);
        EXPECT_LT(rel_norm_diff(narrow[0].to(torch::kFloat32), ref.detach()), tol) << what << ": y";
        EXPECT_LT(rel_norm_diff(narrow[1].to(torch::kFloat32), xr.grad()), 2 * tol) << what << ": dx";
        EXPECT_LT(rel_norm_diff(narrow[0], block[0]), tol) << what << ": y against the block kernel";
        EXPECT_LT(rel_norm_diff(narrow[1], block[1]), 2 * tol) << what << ": dx against the block kernel";
        if (with_w) {
          EXPECT_LT(rel_norm_diff(narrow[2], wr.grad()), 1e-2) << what << ": dw";
          EXPECT_LT(rel_norm_diff(narrow[2], block[2]), 1e-2) << what << ": dw against the block kernel";
        }
        if (sh.narrow && sh.width != sh.C) {
          const auto [copied, copied_launches] = run(true, false);
          EXPECT_EQ(copied_launches, 2) << what;
          EXPECT_TRUE(torch::equal(narrow[0], copied[0])) << what << ": y, slice against copy";
          EXPECT_TRUE(torch::equal(narrow[1], copied[1])) << what << ": dx, slice against copy";
          EXPECT_TRUE(torch::equal(narrow[2], copied[2])) << what << ": dw, slice against copy";
        }
        if (sh.rows == 16389 && with_w)
          std::printf("[measured] narrow RMSNorm %s: y %.3g dx %.3g dw %.3g against the reference\n", what.c_str(),
                      rel_norm_diff(narrow[0].to(torch::kFloat32), ref.detach()),
                      rel_norm_diff(narrow[1].to(torch::kFloat32), xr.grad()), rel_norm_diff(narrow[2], wr.grad()));
      }
    }
  }
}

TEST(FusedOpsCuda, RopeMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(72);
  struct Shape {
    int64_t B, T, H, D;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    // D 64 and 32 take 16-byte vectors, D 40 (half 20) 8-byte ones in bf16/fp16, D 34 scalars.
    for (const Shape sh : {Shape{2, 37, 3, 64}, Shape{1, 1000, 12, 64}, Shape{4, 128, 2, 34}, Shape{1, 300, 1, 32},
                           Shape{2, 50, 5, 40}}) {
      for (const bool packed : {false, true}) {
        const std::string what = std::string(name_of(dtype)) + " B=" + std::to_string(sh.B) + " T=" +
                                 std::to_string(sh.T) + " H=" + std::to_string(sh.H) + " D=" + std::to_string(sh.D) +
                                 (packed ? " packed" : " dense");
        auto tables = model::make_rope_tables(sh.D, 2048, 10000.0);
        tables.cos = tables.cos.cuda();
        tables.sin = tables.sin.cuda();
        model::Positions p;
        if (packed) {
          // Documents of random lengths cut at every row end.
          std::vector<int64_t> cu = {0};
          for (int64_t r = 0; r < sh.B; ++r) {
            int64_t at = r * sh.T;
            while (at < (r + 1) * sh.T) {
              at = std::min((r + 1) * sh.T, at + 1 + torch::randint(0, sh.T / 2 + 1, {1}).item<int64_t>());
              cu.push_back(at);
            }
          }
          p = model::packed_positions(torch::tensor(cu), sh.B, sh.T, torch::kCUDA);
        } else {
          p = model::dense_positions(sh.B, sh.T, torch::kCUDA);
        }
        // q as a strided view of a wider projection, as the fused qkv matmul produces it.
        auto wide = torch::randn({sh.B, sh.T, sh.H * sh.D + 40}, torch::kCUDA).to(dtype);
        auto dy = torch::randn({sh.B, sh.T, sh.H, sh.D}, torch::kCUDA).to(dtype);
        auto run = [&](bool fused) {
          auto w = wide.detach().clone().requires_grad_(true);
          auto x = w.narrow(-1, 8, sh.H * sh.D).view({sh.B, sh.T, sh.H, sh.D});
          EXPECT_EQ(model::fused_rope_applies(x, p.pos, tables), true) << what;
          auto y = fused ? model::rope(x, p.pos, tables) : model::apply_rope(x, p.pos, tables);
          y.backward(dy);
          return std::vector<torch::Tensor>{y.detach(), w.grad()};
        };
        auto f = run(true), r = run(false);
        EXPECT_EQ(f[0].scalar_type(), dtype) << what;
        const double tol = dtype == torch::kFloat32 ? 1e-6 : tol_for(dtype);
        EXPECT_LT(rel_norm_diff(f[0], r[0]), tol) << what << " y";
        EXPECT_LT(rel_norm_diff(f[1], r[1]), tol) << what << " dx";
        if (sh.T == 1000)
          std::printf("[measured] fused RoPE %s: y %.3g dx %.3g\n", what.c_str(), rel_norm_diff(f[0], r[0]), rel_norm_diff(f[1], r[1]));
      }
    }
  }
}

// rope_qkv (RoPE on q and k out of a fused q|k|v projection, one autograd node writing the three
// gradients into one tensor) against split + apply_rope + a view of v. The upstream gradients
// arrive in attention's transposed [B, H, T, D] layout (strided, as SDPA's backward hands them
// back), and once with v unused (its gradient columns must be exactly zero). Grouped-query shapes
// (nkv < nh), an odd head dim and a head dim that is not a multiple of 4 included.
TEST(FusedOpsCuda, RopeQkvMatchesSplitAndRope) {
  DD_REQUIRE_GPU();
  seed_from_gtest(79);
  struct Shape {
    int64_t B, T, nh, nkv, dh;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{2, 37, 4, 2, 64}, Shape{1, 300, 12, 12, 64}, Shape{3, 16, 3, 1, 34}}) {
      for (const bool v_used : {true, false}) {
        const std::string what = std::string(name_of(dtype)) + " B=" + std::to_string(sh.B) + " T=" +
                                 std::to_string(sh.T) + " nh=" + std::to_string(sh.nh) + " nkv=" +
                                 std::to_string(sh.nkv) + " dh=" + std::to_string(sh.dh) + (v_used ? "" : " v unused");
        auto tables = model::make_rope_tables(sh.dh, 1024, 10000.0);
        tables.cos = tables.cos.cuda();
        tables.sin = tables.sin.cuda();
        const auto p = model::dense_positions(sh.B, sh.T, torch::kCUDA);
        const int64_t W = (sh.nh + 2 * sh.nkv) * sh.dh;
        auto qkv0 = torch::randn({sh.B, sh.T, W}, torch::kCUDA).to(dtype);
        auto gq = torch::randn({sh.B, sh.nh, sh.T, sh.dh}, torch::kCUDA).to(dtype);
        auto gk = torch::randn({sh.B, sh.nkv, sh.T, sh.dh}, torch::kCUDA).to(dtype);
        auto gv = torch::randn({sh.B, sh.nkv, sh.T, sh.dh}, torch::kCUDA).to(dtype);
        auto run = [&](bool fused) {
          auto qkv = qkv0.detach().clone().requires_grad_(true);
          model::RopedQkv r;
          if (fused) {
            r = model::rope_qkv(qkv, sh.nh, sh.nkv, sh.dh, p.pos, tables);
          } else {
            auto parts = qkv.split_with_sizes({sh.nh * sh.dh, sh.nkv * sh.dh, sh.nkv * sh.dh}, -1);
            r.q = model::apply_rope(parts[0].view({sh.B, sh.T, sh.nh, sh.dh}), p.pos, tables);
            r.k = model::apply_rope(parts[1].view({sh.B, sh.T, sh.nkv, sh.dh}), p.pos, tables);
            r.v = parts[2].view({sh.B, sh.T, sh.nkv, sh.dh});
          }
          auto f32 = [](const torch::Tensor& x) { return x.to(torch::kFloat32); };
          auto loss = (f32(r.q.transpose(1, 2)) * f32(gq)).sum() + (f32(r.k.transpose(1, 2)) * f32(gk)).sum();
          if (v_used) loss = loss + (f32(r.v.transpose(1, 2)) * f32(gv)).sum();
          loss.backward();
          return std::vector<torch::Tensor>{r.q.detach(), r.k.detach(), r.v.detach(), qkv.grad()};
        };
        auto f = run(true), r = run(false);
        const double tol = dtype == torch::kFloat32 ? 1e-6 : tol_for(dtype);
        const char* names[] = {"q", "k", "v", "dqkv"};
        for (int i = 0; i < 4; ++i) {
          EXPECT_EQ(f[i].sizes(), r[i].sizes()) << what << " " << names[i];
          EXPECT_EQ(f[i].scalar_type(), dtype) << what << " " << names[i];
          EXPECT_LT(rel_norm_diff(f[i], r[i]), tol) << what << " " << names[i];
        }
        if (!v_used) {
          EXPECT_EQ(f[3].narrow(2, (sh.nh + sh.nkv) * sh.dh, sh.nkv * sh.dh).abs().max().item<float>(), 0.f) << what;
        }
        std::printf("[measured] RoPE q|k|v %s: q %.3g k %.3g dqkv %.3g\n", what.c_str(), rel_norm_diff(f[0], r[0]),
                    rel_norm_diff(f[1], r[1]), rel_norm_diff(f[3], r[3]));
      }
    }
  }
}

// MLA's Q, K and V from its projections through one kernel each way (model::mla_qkv) against its
// reference (split, RoPE, cat, expand, pad) on the same GPU: the outputs and the three inputs'
// gradients, for base's and moe-1b's MLA widths (V padded, V at its own width as cuDNN's
// attention takes it, copied or as kv's own columns), a V as wide as Q (no padding) and odd widths
// (narrow vector paths), on packed positions, with q and kv as column slices of wider rows and k_r
// a slice of the latent's row, as the layer hands them over.
TEST(FusedOpsCuda, MlaQkvMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(83);
  struct Shape {
    int64_t B, T, nh, dn, dr, dva;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{1, 300, 12, 64, 32, 64}, Shape{2, 64, 16, 128, 64, 128}, Shape{2, 40, 3, 32, 32, 64},
                           Shape{1, 37, 5, 6, 10, 4}})
      for (const int v_mode : {0, 1, 2}) {  // V padded, V copied at its own width, V a view of kv
        const bool pad_v = v_mode == 0, v_view = v_mode == 2;
        const std::string what = std::string(name_of(dtype)) + " B=" + std::to_string(sh.B) +
                                 " T=" + std::to_string(sh.T) + " nh=" + std::to_string(sh.nh) + " dn=" + std::to_string(sh.dn) +
                                 " dr=" + std::to_string(sh.dr) + " dva=" + std::to_string(sh.dva) +
                                 (pad_v ? " V padded" : v_view ? " V in kv" : " V unpadded");
        const int64_t dqk = sh.dn + sh.dr, rkv = 8;
        auto tables = model::make_rope_tables(sh.dr, 1024, 10000.0);
        tables.cos = tables.cos.cuda();
        tables.sin = tables.sin.cuda();
        // Packed positions: documents of 1, 9 and the rest in every row.
        std::vector<int64_t> cu{0};
        for (int64_t b = 0; b < sh.B; ++b) {
          for (int64_t cut : {int64_t{1}, int64_t{10}, sh.T}) cu.push_back(b * sh.T + cut);
        }
        const auto p = model::packed_positions(torch::tensor(cu, torch::kInt64), sh.B, sh.T, torch::kCUDA);
        auto q_rows = torch::randn({sh.B, sh.T, sh.nh * dqk + 8}, torch::kCUDA).to(dtype);
        auto kv_rows = torch::randn({sh.B, sh.T, sh.nh * (sh.dn + sh.dva) + 8}, torch::kCUDA).to(dtype);
        auto a_rows = torch::randn({sh.B, sh.T, rkv + sh.dr}, torch::kCUDA).to(dtype);
        const int64_t dv_out = pad_v ? std::max(sh.dva, dqk) : sh.dva;
        auto gq = torch::randn({sh.B, sh.T, sh.nh, dqk}, torch::kCUDA).to(dtype);
        auto gk = torch::randn({sh.B, sh.T, sh.nh, dqk}, torch::kCUDA).to(dtype);
        auto gv = torch::randn({sh.B, sh.T, sh.nh, dv_out}, torch::kCUDA).to(dtype);
        auto run = [&](bool fused) {
          model::mla_qkv_fused(fused);
          auto qr = q_rows.detach().clone().requires_grad_(true);
          auto kvr = kv_rows.detach().clone().requires_grad_(true);
          auto ar = a_rows.detach().clone().requires_grad_(true);
          auto q = qr.narrow(2, 0, sh.nh * dqk).view({sh.B, sh.T, sh.nh, dqk});
          auto kv = kvr.narrow(2, 0, sh.nh * (sh.dn + sh.dva)).view({sh.B, sh.T, sh.nh, sh.dn + sh.dva});
          auto out = model::mla_qkv(q, kv, ar.narrow(2, rkv, sh.dr), sh.dn, p.pos, tables, pad_v, v_view);
          EXPECT_EQ(out.v.size(3), dv_out) << what << ": V's width";
          if (v_view) {
            EXPECT_EQ(out.v.data_ptr(), kv.narrow(3, sh.dn, sh.dva).data_ptr()) << what << ": V is kv's columns";
            EXPECT_EQ(out.v.strides(), kv.strides()) << what << ": V is kv's columns";
          }
          EXPECT_EQ(out.q.grad_fn()->name().find("MlaQkv") != std::string::npos, fused) << what << ": the path taken";
          auto f32 = [](const torch::Tensor& x) { return x.to(torch::kFloat32); };
          auto loss = (f32(out.q) * f32(gq)).sum() + (f32(out.k) * f32(gk)).sum() + (f32(out.v) * f32(gv)).sum();
          loss.backward();
          return std::vector<torch::Tensor>{out.q.detach(), out.k.detach(), out.v.detach(), qr.grad(), kvr.grad(),
                                            ar.grad()};
        };
        auto f = run(true), r = run(false);
        model::mla_qkv_fused(true);
        const double tol = dtype == torch::kFloat32 ? 1e-6 : tol_for(dtype);
        const char* names[] = {"Q", "K", "V", "dq", "dkv", "da"};
        for (int i = 0; i < 6; ++i) {
          EXPECT_EQ(f[i].sizes(), r[i].sizes()) << what << " " << names[i];
          EXPECT_EQ(f[i].scalar_type(), dtype) << what << " " << names[i];
          EXPECT_LT(rel_norm_diff(f[i], r[i]), tol) << what << " " << names[i];
        }
        if (pad_v && sh.dva < dqk) {
          EXPECT_EQ(f[2].narrow(3, sh.dva, dqk - sh.dva).abs().max().item<float>(), 0.f) << what << ": V's padding";
        }
        std::printf("[measured] MLA q|k|v %s: Q %.3g K %.3g V %.3g dq %.3g dkv %.3g da %.3g\n", what.c_str(),
                    rel_norm_diff(f[0], r[0]), rel_norm_diff(f[1], r[1]), rel_norm_diff(f[2], r[2]),
                    rel_norm_diff(f[3], r[3]), rel_norm_diff(f[4], r[4]), rel_norm_diff(f[5], r[5]));
      }
  }
}

TEST(FusedOpsCuda, SwigluMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(73);
  struct Shape {
    int64_t N, F;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{1, 37}, Shape{1000, 2048}, Shape{333, 4097}, Shape{3, 1}}) {
      const std::string what = std::string(name_of(dtype)) + " N=" + std::to_string(sh.N) + " F=" + std::to_string(sh.F);
      auto gu0 = (torch::randn({sh.N, 2 * sh.F}, torch::kCUDA) * 3.0).to(dtype);
      auto dh = torch::randn({sh.N, sh.F}, torch::kCUDA).to(dtype);
      auto run = [&](bool fused) {
        auto gu = gu0.detach().clone().requires_grad_(true);
        auto h = fused ? model::swiglu(gu) : model::swiglu_reference(gu);
        h.backward(dh);
        return std::vector<torch::Tensor>{h.detach(), gu.grad()};
      };
      auto f = run(true), r = run(false);
      EXPECT_EQ(f[0].scalar_type(), dtype) << what;
      // bf16: the reference rounds silu(g) to bf16 before the product, the kernel does not.
      const double tol = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
      EXPECT_LT(rel_norm_diff(f[0], r[0]), tol) << what << " h";
      EXPECT_LT(rel_norm_diff(f[1], r[1]), tol) << what << " dgu";
      if (sh.F == 4097)
        std::printf("[measured] fused SwiGLU %s: h %.3g dgu %.3g\n", what.c_str(), rel_norm_diff(f[0], r[0]), rel_norm_diff(f[1], r[1]));
    }
  }
}

// The MoE experts' SwiGLU with each row weighted by its router weight (model::swiglu_weighted)
// against the formula in fp64 on the same inputs: h and dgu within the output's one rounding
// (fp32: 1e-5, for the kernel's fast exp; bf16: 2⁻⁸ relative a value), dw (a dot product of F terms) within
// 1e-5 of the terms' magnitudes Σ_f |dh · silu(g) · u|. Weights of both signs and zero.
TEST(FusedOpsCuda, WeightedSwigluMatchesTheFormula) {
  DD_REQUIRE_GPU();
  seed_from_gtest(74);
  struct Shape {
    int64_t N, F;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{1, 37}, Shape{1000, 256}, Shape{333, 4097}, Shape{3, 1}, Shape{64, 264}}) {
      // indexed: w in another order, row n weighted by w[idx[n]] (the MoE layer's γ in pair order).
      for (const bool indexed : {false, true}) {
        const std::string what = std::string(name_of(dtype)) + " N=" + std::to_string(sh.N) +
                                 " F=" + std::to_string(sh.F) + (indexed ? " indexed" : "");
        auto gu0 = (torch::randn({sh.N, 2 * sh.F}, torch::kCUDA) * 3.0).to(dtype);
        auto w0 = torch::randn({sh.N}, torch::kCUDA);
        w0.index_put_({0}, 0.0);
        auto dh = torch::randn({sh.N, sh.F}, torch::kCUDA).to(dtype);
        const auto idx = torch::randperm(sh.N, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA));
        auto gu = gu0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
        auto h = indexed ? model::swiglu_weighted(gu, w, idx) : model::swiglu_weighted(gu, w);
        h.backward(dh);
        auto gu64 = gu0.to(torch::kFloat64).requires_grad_(true), w64 = w0.to(torch::kFloat64).requires_grad_(true);
        auto g = gu64.narrow(1, 0, sh.F), u = gu64.narrow(1, sh.F, sh.F);
        auto s64 = g * torch::sigmoid(g) * u;
        auto h64 = s64 * (indexed ? w64.index_select(0, idx) : w64).unsqueeze(1);
        h64.backward(dh.to(torch::kFloat64));
        const double tol = dtype == torch::kFloat32 ? 1e-5 : 6e-3;
        EXPECT_EQ(h.scalar_type(), dtype) << what;
        EXPECT_LT(rel_norm_diff(h, h64), tol) << what << " h";
        EXPECT_LT(rel_norm_diff(gu.grad(), gu64.grad()), tol) << what << " dgu";
        // Row n's dw entry (w[idx[n]] when indexed) against the magnitude of its row's terms.
        auto terms = (dh.to(torch::kFloat64) * s64.detach()).abs().sum(1).clamp_min(1e-300);
        auto dw_rows = indexed ? w.grad().index_select(0, idx) : w.grad();
        auto dw64_rows = indexed ? w64.grad().index_select(0, idx) : w64.grad();
        const double e_dw = ((dw_rows.to(torch::kFloat64) - dw64_rows).abs() / terms).max().item<double>();
        EXPECT_LT(e_dw, 1e-5) << what << " dw";
        if (sh.F == 256)
          std::printf("[measured] weighted SwiGLU %s: h %.3g dgu %.3g dw %.3g\n", what.c_str(), rel_norm_diff(h, h64),
                      rel_norm_diff(gu.grad(), gu64.grad()), e_dw);
      }
    }
  }
  EXPECT_THROW(model::swiglu_weighted(torch::zeros({4, 6}, torch::kCUDA), torch::zeros({3}, torch::kCUDA)), c10::Error);
  EXPECT_THROW(model::swiglu_weighted(torch::zeros({4, 6}, torch::kCUDA), torch::zeros({4}, torch::kCUDA),
                                      torch::zeros({3}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA))),
               c10::Error);
}

// The models' wiring of the fused ops (the branch carried into the next norm, fused qkv and
// gate|up, RoPE on views): loss and every gradient on the GPU against the CPU, fp32, no TF32.
TEST(FusedOpsCuda, TinyModelsLossAndGradientsMatchCpu) {
  DD_REQUIRE_GPU();
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const auto& [name, family] : {std::pair<std::string, model::Family>{"gpt", model::Family::Gpt},
                                     {"hybrid", model::Family::Hybrid}}) {
    auto cfg = *model::make_preset("tiny", family);
    torch::manual_seed(9);
    model::DecoderLM cpu(cfg);
    model::DecoderLM gpu(cfg);
    {
      torch::NoGradGuard ng;
      auto src = cpu->parameters(), dst = gpu->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    }
    gpu->to(torch::kCUDA);
    auto tokens = torch::randint(0, cfg.vocab_size, {2, 96}, torch::kInt64);
    auto targets = torch::randint(0, cfg.vocab_size, {2, 96}, torch::kInt64);
    auto cu = torch::tensor(std::vector<int64_t>{0, 30, 96, 100, 192});
    auto l_cpu = cpu->loss_parts(tokens, targets, cu).total;
    auto l_gpu = gpu->loss_parts(tokens.cuda(), targets.cuda(), cu).total;
    l_cpu.backward();
    l_gpu.backward();
    EXPECT_LT(std::abs(l_gpu.item<double>() - l_cpu.item<double>()), 1e-5 * std::abs(l_cpu.item<double>())) << name;
    double worst = 0;
    auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
    for (const auto& item : pc) {
      const double e = rel_norm_diff(pg[item.key()].grad(), item.value().grad());
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-4) << name << " " << item.key();
    }
    std::printf("[measured] tiny %s fp32 GPU (fused) vs CPU (reference): loss %.3g, worst gradient %.3g\n",
                name.c_str(), std::abs(l_gpu.item<double>() - l_cpu.item<double>()), worst);
  }
}

// The column sums that finish an RMSNorm weight's gradient (kernels/column_sum.h) against fp64 sums
// row counts around the kernel's 32 row groups and 8-way unroll (and 4096, as tall as the gated RMSNorm's used to be),
// column counts around its 32.
TEST(FusedOpsCuda, ColumnSumMatchesFp64) {
  DD_REQUIRE_GPU();
  seed_from_gtest(75);
  for (const int64_t R : {1, 31, 33, 129, 255, 257, 1056, 2000, 4096}) {
    for (const int64_t C : {1, 37, 768, 1000}) {
      auto in = torch::randn({R, C}, torch::kCUDA);
      auto out = torch::full({C}, NAN, in.options());
      model::check_kernel_launch(kernels::column_sum_f32(out.data_ptr<float>(), in.data_ptr<float>(), R, C,
                                                         model::stream_of(in)),
                                 "column_sum_f32");
      // Per column against Σ|x| (a plain relative error blows up where a column's sum cancels): fp32
      // sums of at most ~R/256 + 40 terms in a row stay within ~1e-5 of it.
      auto ref = in.to(torch::kFloat64).sum(0);
      const double err =
          ((out.to(torch::kFloat64) - ref).abs() / in.to(torch::kFloat64).abs().sum(0).clamp_min(1e-30)).max().item<double>();
      EXPECT_LT(err, 1e-5) << "R=" << R << " C=" << C;
    }
  }
}

// The fp32-accumulating weight-gradient GEMM (kernels/gemm_accumulate.h) against fp64: two
// accumulations into a random fp32 matrix, odd sizes included.
TEST(FusedOpsCuda, GemmAccumulateMatchesFp64) {
  DD_REQUIRE_GPU();
  seed_from_gtest(74);
  struct Shape {
    int64_t K, M, N;
  };
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const Shape sh : {Shape{1334, 1000, 768}, Shape{37, 64, 96}, Shape{333, 101, 7}}) {
      const std::string what = std::string(name_of(dtype)) + " K=" + std::to_string(sh.K) + " M=" +
                               std::to_string(sh.M) + " N=" + std::to_string(sh.N);
      auto c = torch::randn({sh.M, sh.N}, torch::kCUDA);
      auto ref = c.to(torch::kFloat64);
      for (int rep = 0; rep < 2; ++rep) {
        auto a = torch::randn({sh.K, sh.M}, torch::kCUDA).to(dtype);
        auto b = torch::randn({sh.K, sh.N}, torch::kCUDA).to(dtype);
        model::add_at_b_(c, a, b);
        ref += torch::mm(a.to(torch::kFloat64).t(), b.to(torch::kFloat64));
      }
      // Exact bf16/fp16 products summed in fp32: error ~ K · 2^-24 relative to the row norms.
      const double e = rel_norm_diff(c, ref);
      EXPECT_LT(e, 1e-5) << what;
      if (sh.K == 1334) std::printf("[measured] fp32-accumulating GEMM %s vs fp64: %.3g\n", what.c_str(), e);
    }
  }
}

// FP8 quantisation kernels (kernels/fp8_quant.h) against the ATen reference: the same bits for q,
// the exact transpose, the same scale; a non-finite amax is counted once per quantisation.
TEST(FusedOpsCuda, Fp8QuantizeMatchesReferenceBitForBit) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(75);
  struct Shape {
    int64_t rows, cols;
  };
  // The kernel's q, qᵀ and scale against the reference's, bit for bit.
  auto expect_reference_bits = [](const torch::Tensor& x, at::ScalarType fp8, const std::string& what) {
    auto got = model::quantize_fp8_operand(x, fp8, /*transposed=*/true);
    auto [q_ref, s_ref] = model::quantize_fp8(x, fp8);
    EXPECT_EQ(got.scale.item<float>(), s_ref.item<float>()) << what;
    EXPECT_TRUE(torch::equal(got.q.view(torch::kUInt8), q_ref.view(torch::kUInt8))) << what << " q";
    EXPECT_TRUE(torch::equal(got.qt.view(torch::kUInt8), q_ref.t().contiguous().view(torch::kUInt8))) << what << " qt";
  };
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (const auto fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (const Shape sh : {Shape{1000, 768}, Shape{37, 4097}, Shape{16, 16}, Shape{130, 65}}) {
        const std::string what = std::string(name_of(dtype)) + (fp8 == at::kFloat8_e5m2 ? " e5m2" : " e4m3") +
                                 " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
        // Rows with a stride wider than the row, values over several orders of magnitude.
        auto x = (torch::randn({sh.rows, sh.cols + 5}, torch::kCUDA) * torch::exp(torch::randn({sh.rows, sh.cols + 5},
                                                                                              torch::kCUDA) * 2))
                     .narrow(1, 2, sh.cols)
                     .to(dtype);
        expect_reference_bits(x, fp8, what);
      }
    }
  }
  // Magnitudes that put the scale outside [2^-80, 2^100], where the kernel divides as fp32 division
  // does (ExactDivide), and just inside, where it divides through the scale's reciprocal
  // (ReciprocalDivide): the same bits either way.
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (const double magnitude : {1e-30, 1.6e-25, 1e25, 1e30}) {
      char label[64];
      std::snprintf(label, sizeof label, " e4m3 magnitude %g", magnitude);
      const std::string what = std::string(name_of(dtype)) + label;
      auto x = (torch::randn({1000, 768}, torch::kCUDA) * torch::exp(torch::randn({1000, 768}, torch::kCUDA) * 2) *
                magnitude)
                   .to(dtype);
      expect_reference_bits(x, at::kFloat8_e4m3fn, what);
    }
  }
  const torch::Device dev(torch::kCUDA, 0);
  model::take_fp8_saturations(dev);
  auto x = torch::randn({64, 64}, torch::kCUDA).to(torch::kBFloat16);
  x[3][7] = std::numeric_limits<float>::infinity();
  model::quantize_fp8_operand(x, at::kFloat8_e4m3fn, false);
  x[3][7] = std::numeric_limits<float>::quiet_NaN();
  model::quantize_fp8_operand(x, at::kFloat8_e4m3fn, false);
  EXPECT_EQ(model::take_fp8_saturations(dev), 2);
  x[3][7] = 1.0;
  model::quantize_fp8_operand(x, at::kFloat8_e4m3fn, false);
  EXPECT_EQ(model::take_fp8_saturations(dev), 0);
}

// Delayed scaling (kernels::fp8_quantize_delayed) against its ATen reference over a sequence of
// quantisations on one record: the first takes its scale from x's own amax, later ones from the
// history (max × margin / fmax); the same q, qᵀ and scale bits, the same record words after every
// call (history rolled, pending words zero), and the same saturation count: none while the amax
// stays within the margin, one when it grows past it (values clip), one for a NaN (not filed).
TEST(FusedOpsCuda, Fp8DelayedQuantizeMatchesReference) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(76);
  const torch::Device dev(torch::kCUDA, 0);
  struct Shape {
    int64_t rows, cols;
  };
  // Growth of x's magnitude per call: within the margin of 2, then past it, then a NaN.
  const std::vector<double> growth = {1.0, 1.5, 0.5, 1.9, 4.0, 1.0, 0.0 /* NaN */, 1.0};
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (const auto fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (const Shape sh : {Shape{1000, 768}, Shape{37, 4097}, Shape{16, 16}, Shape{130, 65}}) {
        const std::string what = std::string(name_of(dtype)) + (fp8 == at::kFloat8_e5m2 ? " e5m2" : " e4m3") +
                                 " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
        model::Fp8History h;
        auto ref_record = torch::zeros({kernels::kFp8RecordWords}, torch::TensorOptions().dtype(torch::kFloat).device(dev));
        double magnitude = 1.0;
        float last_amax = 0.f;  // of the last x (in x's dtype)
        model::take_fp8_saturations(dev);
        for (size_t call = 0; call < growth.size(); ++call) {
          const std::string at = what + " call " + std::to_string(call);
          if (growth[call] > 0) magnitude *= growth[call];
          // The largest |x| is pinned to `magnitude` so the growth per call is exact.
          auto x = torch::randn({sh.rows, sh.cols + 3}, dev).clamp(-3, 3) * (magnitude / 3.0);
          x[0][2] = magnitude;
          if (growth[call] == 0) x[sh.rows / 2][2 + sh.cols / 2] = std::numeric_limits<float>::quiet_NaN();
          x = x.narrow(1, 2, sh.cols).to(dtype);
          last_amax = x.to(torch::kFloat).abs().amax().item<float>();
          auto got = model::quantize_fp8_operand_delayed(x, fp8, /*transposed=*/true, h, model::Fp8History::kGradient);
          const int64_t got_sat = model::take_fp8_saturations(dev);
          auto [q_ref, s_ref] = model::quantize_fp8_delayed_reference(x, fp8, ref_record, /*from_current=*/call == 0);
          const int64_t ref_sat = model::take_fp8_saturations(dev);
          EXPECT_EQ(got.scale.item<float>(), s_ref.item<float>()) << at;
          EXPECT_TRUE(torch::equal(got.q.view(torch::kUInt8), q_ref.view(torch::kUInt8))) << at << " q";
          EXPECT_TRUE(torch::equal(got.qt.view(torch::kUInt8), q_ref.t().contiguous().view(torch::kUInt8))) << at << " qt";
          EXPECT_TRUE(torch::equal(h.records[model::Fp8History::kGradient], ref_record)) << at << " record";
          // Growth 4 outgrows the margin and clips; a NaN counts; the rest fit.
          const int64_t want_sat = (growth[call] == 4.0 || growth[call] == 0) ? 1 : 0;
          EXPECT_EQ(got_sat, want_sat) << at;
          EXPECT_EQ(ref_sat, want_sat) << at;
        }
        // Eight calls, one NaN not filed: seven amaxes, the newest first.
        auto hist = h.records[model::Fp8History::kGradient].cpu();
        EXPECT_EQ(hist[0].item<float>(), last_amax) << what;
        EXPECT_GT(hist[6].item<float>(), 0.f) << what;
        EXPECT_EQ(hist[7].item<float>(), 0.f) << what;
        EXPECT_EQ(hist[kernels::kFp8History].item<float>(), 0.f) << what;
        EXPECT_EQ(hist[kernels::kFp8History + 1].item<float>(), 0.f) << what;
      }
    }
  }
}

namespace {

// Two fp8 tensors of the same shape agree to within one step of the format: every element pair
// differs by at most one unit in the last place of the larger (plus the smallest subnormal, for
// values around zero), and at most `max_fraction` of them differ at all. Values computed by the
// kernels (exp, products) and by ATen differ in the last fp32 bits, so a few land on the other side
// of an fp8 rounding boundary; anything more is a bug.
void expect_fp8_within_one_step(const torch::Tensor& got, const torch::Tensor& want, at::ScalarType fp8,
                                double max_fraction, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  auto a = got.to(torch::kFloat).cpu(), b = want.to(torch::kFloat).cpu();
  const double ulp = fp8 == at::kFloat8_e5m2 ? 0.25 : 0.125;        // 2^-mantissa bits
  const double tiny = fp8 == at::kFloat8_e5m2 ? 1.53e-5 : 1.96e-3;  // smallest subnormal
  auto diff = (a - b).abs();
  auto bound = torch::maximum(a.abs(), b.abs()) * ulp + tiny;
  EXPECT_EQ(diff.gt(bound).sum().item<int64_t>(), 0) << what << ": elements more than one fp8 step apart";
  const double fraction = diff.gt(0).to(torch::kFloat).mean().item<double>();
  EXPECT_LE(fraction, max_fraction) << what << ": fraction of elements that differ";
}

}  // namespace

// The quantisers that compute SwiGLU's activation (or its gradient) on the way in, against
// swiglu_reference (swiglu_backward_reference) in fp32 quantised by the delayed-scaling reference,
// over three quantisations on one record (the first from the current amax, then delayed): q within
// one fp8 step (the kernel's exp and ATen's differ in the last bits), qᵀ exactly q's transpose, the
// scale and the record's amaxes within 1e-5 relative, the pending words cleared. Shapes: the vector
// path (F and the row stride multiples of 8), a wider row stride, odd F, and rows not a multiple of 8.
TEST(FusedOpsCuda, Fp8SwigluQuantizersMatchReference) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(77);
  const torch::Device dev(torch::kCUDA, 0);
  struct Shape {
    int64_t rows, F, pad;  // gu's row stride is 2F + pad
  };
  for (const bool grad : {false, true}) {
    for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
      for (const auto fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
        for (const Shape sh : {Shape{512, 384, 0}, Shape{256, 200, 8}, Shape{64, 100, 3}, Shape{130, 72, 0}}) {
          const std::string what = std::string(grad ? "grad " : "act ") + name_of(dtype) +
                                   (fp8 == at::kFloat8_e5m2 ? " e5m2 " : " e4m3 ") + std::to_string(sh.rows) + "x" +
                                   std::to_string(sh.F) + " pad " + std::to_string(sh.pad);
          model::Fp8History h;
          auto ref_record = torch::zeros({kernels::kFp8RecordWords}, torch::TensorOptions().dtype(torch::kFloat).device(dev));
          for (int call = 0; call < 3; ++call) {
            const std::string at = what + " call " + std::to_string(call);
            const double magnitude = call == 1 ? 1.5 : 1.0;
            auto gu = (torch::randn({sh.rows, 2 * sh.F + sh.pad}, dev) * 2 * magnitude).narrow(1, 0, 2 * sh.F).to(dtype);
            auto dh = (torch::randn({sh.rows, sh.F}, dev) * 1e-3).to(dtype);
            model::Fp8Operand got;
            torch::Tensor value;  // fp32, from the inputs as rounded to dtype
            if (grad) {
              got = model::quantize_swiglu_grad_fp8_delayed(gu, dh, fp8, h, model::Fp8History::kGradient);
              value = model::swiglu_backward_reference(gu.to(torch::kFloat), dh.to(torch::kFloat));
            } else {
              got = model::quantize_swiglu_fp8_delayed(gu, fp8, h, model::Fp8History::kGradient);
              value = model::swiglu_reference(gu.to(torch::kFloat));
            }
            ASSERT_EQ(got.q.size(1), grad ? 2 * sh.F : sh.F) << at;
            auto [q_ref, s_ref] = model::quantize_fp8_delayed_reference(value, fp8, ref_record, call == 0);
            const double s_got = got.scale.item<double>(), s_want = s_ref.item<double>();
            EXPECT_NEAR(s_got, s_want, 1e-5 * s_want) << at << " scale";
            expect_fp8_within_one_step(got.q, q_ref, fp8, 2e-3, at + " q");
            EXPECT_TRUE(torch::equal(got.qt.view(torch::kUInt8), got.q.t().contiguous().view(torch::kUInt8))) << at << " qt";
            auto rec = h.records[model::Fp8History::kGradient].cpu(), want = ref_record.cpu();
            for (int i = 0; i < kernels::kFp8History; ++i)
              EXPECT_NEAR(rec[i].item<double>(), want[i].item<double>(), 1e-5 * want[i].item<double>()) << at << " record " << i;
            EXPECT_EQ(rec[kernels::kFp8History].item<float>(), 0.f) << at;
            EXPECT_EQ(rec[kernels::kFp8History + 1].item<float>(), 0.f) << at;
          }
        }
      }
    }
  }
}

// The fused fp8 feed-forward (model/fp8_swiglu_mlp.h) against its plain twin, the unfused fp8 layers
// (fp8_linear → swiglu → fp8_linear, each with its own histories), and both against the bf16
// products, over three steps so delayed scaling takes over. The two fp8 paths differ only in
// SwiGLU's activation and gradient being rounded to bf16 before they are quantised, which moves a
// few values across an fp8 rounding boundary: fused vs unfused must stay under half of fp8's own
// error (unfused vs bf16) and under 4% (output) / 6% (gradients); each fp8 path within 10% (output,
// e4m3) / 20% (gradients, e5m2) of bf16. The figures are printed.
TEST(FusedOpsCuda, Fp8SwigluMlpMatchesTheUnfusedLayers) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(78);
  const int64_t d = 256, F = 384;
  // gate's and up's weights as two parameters, as the models hold them (read where they are).
  auto w_g = (torch::randn({F, d}, torch::kCUDA) * 0.06).requires_grad_();
  auto w_u = (torch::randn({F, d}, torch::kCUDA) * 0.06).requires_grad_();
  auto w_down = (torch::randn({d, F}, torch::kCUDA) * 0.05).requires_grad_();
  const std::vector<torch::Tensor> w_gu = {w_g, w_u};
  model::Fp8History fused_gu, fused_down, plain_gu, plain_down;
  for (int step = 0; step < 3; ++step) {
    const std::string at = "step " + std::to_string(step);
    auto x = torch::randn({4, 48, d}, torch::kCUDA).to(torch::kBFloat16).requires_grad_();
    auto r = torch::randn({4, 48, d}, torch::kCUDA);
    auto run = [&](int path) {
      if (path == 0) return model::fp8_swiglu_mlp(x, w_gu, w_down, fused_gu, fused_down);
      if (path == 1)
        return model::fp8_linear(model::swiglu(model::fp8_linear(x, w_gu, &plain_gu)), w_down, &plain_down);
      auto gu = torch::matmul(x, torch::cat(w_gu, 0).to(torch::kBFloat16).t());
      return torch::matmul(model::swiglu(gu), w_down.to(torch::kBFloat16).t());
    };
    // Per path: y, dx, dW_gate, dW_up, dW_down.
    std::vector<std::vector<torch::Tensor>> got;
    for (int path = 0; path < 3; ++path) {
      ASSERT_TRUE(model::fp8_swiglu_mlp_fits(x, w_gu, w_down));
      auto out = run(path);
      ASSERT_EQ(out.scalar_type(), torch::kBFloat16) << at;
      auto g = torch::autograd::grad({(out.to(torch::kFloat) * r).sum()}, {x, w_g, w_u, w_down});
      got.push_back({out, g[0], g[1], g[2], g[3]});
    }
    const char* names[] = {"y", "dx", "dW_gate", "dW_up", "dW_down"};
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(got[0][k].sizes(), got[2][k].sizes()) << at << " " << names[k];
      const double fused_plain = rel_norm_diff(got[0][k], got[1][k]), fused_bf16 = rel_norm_diff(got[0][k], got[2][k]),
                   plain_bf16 = rel_norm_diff(got[1][k], got[2][k]);
      std::printf("fp8 SwiGLU MLP %s %s: fused vs unfused %.4f, fused vs bf16 %.4f, unfused vs bf16 %.4f\n",
                  at.c_str(), names[k], fused_plain, fused_bf16, plain_bf16);
      const double own = k == 0 ? 0.10 : 0.20, apart = k == 0 ? 0.04 : 0.06;
      EXPECT_LT(fused_plain, apart) << at << " " << names[k];
      EXPECT_LT(fused_plain, 0.5 * plain_bf16) << at << " " << names[k];
      EXPECT_LT(fused_bf16, own) << at << " " << names[k];
      EXPECT_LT(plain_bf16, own) << at << " " << names[k];
    }
  }
  // Both paths filed the same six records three times each, with the same amaxes to within fp8 noise.
  EXPECT_LT(rel_norm_diff(fused_gu.records, plain_gu.records), 0.05);
  EXPECT_LT(rel_norm_diff(fused_down.records, plain_down.records), 0.05);
  EXPECT_GT(fused_down.records[model::Fp8History::kGradient][2].item<float>(), 0.f);
}

// quantize_fp8_rows_delayed (the weights of q|k|v or gate|up read where they are) against the
// quantisation of their concatenation: the same q, qᵀ, scale and record bits over three calls, for
// fp32 blocks on the vector path (columns a multiple of 8) and off it, with 2 to 4 blocks of uneven
// heights.
TEST(FusedOpsCuda, Fp8RowBlocksQuantizeAsTheirConcatenation) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(79);
  struct Case {
    std::vector<int64_t> rows;
    int64_t cols;
  };
  for (const Case& c : {Case{{96, 32}, 256}, Case{{40, 8, 16, 64}, 64}, Case{{37, 27, 64}, 100}}) {
    model::Fp8History blocks, whole;
    for (int call = 0; call < 3; ++call) {
      const std::string at = std::to_string(c.rows.size()) + " blocks x " + std::to_string(c.cols) + " call " +
                             std::to_string(call);
      std::vector<torch::Tensor> parts;
      for (size_t i = 0; i < c.rows.size(); ++i)
        parts.push_back(torch::randn({c.rows[i], c.cols}, torch::kCUDA) * (0.1 * (i + 1) * (call + 1)));
      auto got = model::quantize_fp8_rows_delayed(parts, at::kFloat8_e4m3fn, blocks, model::Fp8History::kWeight);
      auto want = model::quantize_fp8_operand_delayed(torch::cat(parts, 0), at::kFloat8_e4m3fn, true, whole,
                                                      model::Fp8History::kWeight);
      EXPECT_EQ(got.scale.item<float>(), want.scale.item<float>()) << at;
      EXPECT_TRUE(torch::equal(got.q.view(torch::kUInt8), want.q.view(torch::kUInt8))) << at << " q";
      EXPECT_TRUE(torch::equal(got.qt.view(torch::kUInt8), want.qt.view(torch::kUInt8))) << at << " qt";
      EXPECT_TRUE(torch::equal(blocks.records, whole.records)) << at << " records";
    }
  }
}

// quantize_fp8_cols_delayed (q's, k's and v's gradients read where they are) against the
// quantisation of their concatenation: the same q, qᵀ, scale and record bits over three calls, for
// bf16 blocks with row strides wider than their rows, on the vector path and off it (a block of
// odd width), 2 and 3 blocks.
TEST(FusedOpsCuda, Fp8ColumnBlocksQuantizeAsTheirConcatenation) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(80);
  struct Case {
    int64_t rows;
    std::vector<int64_t> cols;
  };
  for (const Case& c : {Case{256, {128, 64, 64}}, Case{96, {40, 24}}, Case{72, {64, 13, 32}}}) {
    model::Fp8History blocks, whole;
    for (int call = 0; call < 3; ++call) {
      const std::string at = std::to_string(c.cols.size()) + " blocks x " + std::to_string(c.rows) + " rows, call " +
                             std::to_string(call);
      std::vector<torch::Tensor> parts;
      for (size_t i = 0; i < c.cols.size(); ++i)
        parts.push_back((torch::randn({c.rows, c.cols[i] + 8}, torch::kCUDA) * (0.5 * (i + 1) * (call + 1)))
                            .narrow(1, 0, c.cols[i])
                            .to(torch::kBFloat16));
      auto got = model::quantize_fp8_cols_delayed(parts, at::kFloat8_e5m2, blocks, model::Fp8History::kGradient);
      auto want = model::quantize_fp8_operand_delayed(torch::cat(parts, 1), at::kFloat8_e5m2, true, whole,
                                                      model::Fp8History::kGradient);
      EXPECT_EQ(got.scale.item<float>(), want.scale.item<float>()) << at;
      EXPECT_TRUE(torch::equal(got.q.view(torch::kUInt8), want.q.view(torch::kUInt8))) << at << " q";
      EXPECT_TRUE(torch::equal(got.qt.view(torch::kUInt8), want.qt.view(torch::kUInt8))) << at << " qt";
      EXPECT_TRUE(torch::equal(blocks.records, whole.records)) << at << " records";
    }
  }
}

// fp8_linear_split (q|k|v as three outputs whose gradients are quantised where they are) against
// fp8_linear of the same blocks followed by a split (whose backward concatenates the gradients):
// the same outputs, input and weight gradients and records, bit for bit, over two steps; one output
// left out of the loss (its gradient arrives undefined) in the second.
TEST(FusedOpsCuda, Fp8LinearSplitMatchesTheSplitProduct) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  seed_from_gtest(81);
  const int64_t d = 128;
  std::vector<torch::Tensor> w = {(torch::randn({64, d}, torch::kCUDA) * 0.1).requires_grad_(),
                                  (torch::randn({32, d}, torch::kCUDA) * 0.1).requires_grad_(),
                                  (torch::randn({32, d}, torch::kCUDA) * 0.1).requires_grad_()};
  model::Fp8History split_h, whole_h;
  for (int step = 0; step < 2; ++step) {
    const std::string at = "step " + std::to_string(step);
    auto x = torch::randn({2, 40, d}, torch::kCUDA).to(torch::kBFloat16).requires_grad_();
    std::vector<torch::Tensor> r = {torch::randn({2, 40, 64}, torch::kCUDA), torch::randn({2, 40, 32}, torch::kCUDA),
                                    torch::randn({2, 40, 32}, torch::kCUDA)};
    const size_t used = step == 0 ? 3 : 2;
    auto loss_of = [&](const std::vector<torch::Tensor>& outs) {
      auto loss = torch::zeros({}, torch::kCUDA);
      for (size_t i = 0; i < used; ++i) loss = loss + (outs[i].to(torch::kFloat) * r[i]).sum();
      return loss;
    };
    auto split = model::fp8_linear_split(x, w, &split_h);
    auto whole = model::fp8_linear(x, w, &whole_h).split_with_sizes({64, 32, 32}, -1);
    ASSERT_EQ(split.size(), 3u) << at;
    std::vector<torch::Tensor> inputs = {x, w[0], w[1], w[2]};
    auto g_split = torch::autograd::grad({loss_of(split)}, inputs);
    auto g_whole = torch::autograd::grad({loss_of(whole)}, inputs);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(split[i].sizes(), whole[i].sizes()) << at << " output " << i;
      EXPECT_TRUE(torch::equal(split[i], whole[i])) << at << " output " << i;
    }
    const char* names[] = {"dx", "dWq", "dWk", "dWv"};
    for (size_t i = 0; i < inputs.size(); ++i) EXPECT_TRUE(torch::equal(g_split[i], g_whole[i])) << at << " " << names[i];
    EXPECT_TRUE(torch::equal(split_h.records, whole_h.records)) << at << " records";
  }
}

// RoPE + QK-norm in one kernel each way against rms_norm_plain(apply_rope(x)): head dims the
// kernel takes (32, 64, 128) and one it leaves to the reference (34), strided q views, dense and
// packed positions.
TEST(FusedOpsCuda, RopeQkNormMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(76);
  struct Shape {
    int64_t B, T, H, D;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{2, 37, 3, 64}, Shape{1, 700, 12, 64}, Shape{2, 64, 4, 128}, Shape{1, 50, 5, 32},
                           Shape{2, 20, 2, 34}}) {
      const std::string what = std::string(name_of(dtype)) + " B=" + std::to_string(sh.B) + " T=" +
                               std::to_string(sh.T) + " H=" + std::to_string(sh.H) + " D=" + std::to_string(sh.D);
      auto tables = model::make_rope_tables(sh.D, 1024, 10000.0);
      tables.cos = tables.cos.cuda();
      tables.sin = tables.sin.cuda();
      auto p = model::dense_positions(sh.B, sh.T, torch::kCUDA);
      auto wide = (torch::randn({sh.B, sh.T, sh.H * sh.D + 24}, torch::kCUDA) * 3).to(dtype);
      auto dy = torch::randn({sh.B, sh.T, sh.H, sh.D}, torch::kCUDA).to(dtype);
      auto run = [&](bool fused) {
        auto w = wide.detach().clone().requires_grad_(true);
        auto x = w.narrow(-1, 8, sh.H * sh.D).view({sh.B, sh.T, sh.H, sh.D});
        auto y = fused ? model::rope_qk_norm(x, p.pos, tables)
                       : model::rms_norm_plain(model::apply_rope(x, p.pos, tables));
        y.backward(dy);
        return std::vector<torch::Tensor>{y.detach(), w.grad()};
      };
      auto f = run(true), r = run(false);
      EXPECT_EQ(f[0].scalar_type(), dtype) << what;
      // bf16: the reference rounds the rotation to bf16 before normalising, the kernel does not.
      const double tol = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
      EXPECT_LT(rel_norm_diff(f[0], r[0]), tol) << what << " y";
      EXPECT_LT(rel_norm_diff(f[1], r[1]), tol) << what << " dx";
      if (sh.T == 700)
        std::printf("[measured] fused RoPE + QK-norm %s: y %.3g dx %.3g\n", what.c_str(), rel_norm_diff(f[0], r[0]),
                    rel_norm_diff(f[1], r[1]));
    }
  }
}

// rope_norm_qkv (RoPE + QK-norm on q and k out of a fused q|k|v projection, one autograd node
// writing the three gradients into one tensor) against what the GPT layer ran before it: split,
// rope_qk_norm on q and k (the same kernels, each writing its own gradient) and a view of v, whose
// gradients split's backward concatenates. The same kernels on the same values: outputs and the
// q|k|v gradient equal to the bit. And against the plain reference rms_norm_plain(apply_rope(·))
// (bf16: 1e-2, as RopeQkNormMatchesReference). Upstream gradients in attention's transposed layout;
// with q's, k's or v's gradient missing (its columns exactly zero); GPT base's heads, grouped-query
// heads, a head dim of 128, and one of 34 that the kernel leaves to the reference (the node each
// run went through is checked, so the bitwise comparison cannot pass by running one path twice).
TEST(FusedOpsCuda, RopeNormQkvMatchesSplitRopeQkNorm) {
  DD_REQUIRE_GPU();
  seed_from_gtest(83);
  struct Shape {
    int64_t B, T, nh, nkv, dh;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{2, 37, 12, 12, 64}, Shape{1, 300, 6, 2, 64}, Shape{2, 40, 4, 1, 128},
                           Shape{2, 20, 2, 2, 34}}) {
      for (const int unused : {-1, 0, 1, 2}) {  // which output's gradient stays undefined (−1: none)
        const std::string what = std::string(name_of(dtype)) + " B=" + std::to_string(sh.B) + " T=" +
                                 std::to_string(sh.T) + " nh=" + std::to_string(sh.nh) + " nkv=" +
                                 std::to_string(sh.nkv) + " dh=" + std::to_string(sh.dh) +
                                 (unused == 0 ? " q unused" : unused == 1 ? " k unused" : unused == 2 ? " v unused" : "");
        auto tables = model::make_rope_tables(sh.dh, 1024, 10000.0);
        tables.cos = tables.cos.cuda();
        tables.sin = tables.sin.cuda();
        const auto p = model::dense_positions(sh.B, sh.T, torch::kCUDA);
        const int64_t W = (sh.nh + 2 * sh.nkv) * sh.dh;
        auto qkv0 = (torch::randn({sh.B, sh.T, W}, torch::kCUDA) * 3).to(dtype);
        const torch::Tensor g[3] = {torch::randn({sh.B, sh.nh, sh.T, sh.dh}, torch::kCUDA).to(dtype),
                                    torch::randn({sh.B, sh.nkv, sh.T, sh.dh}, torch::kCUDA).to(dtype),
                                    torch::randn({sh.B, sh.nkv, sh.T, sh.dh}, torch::kCUDA).to(dtype)};
        // 0: rope_norm_qkv; 1: split + rope_qk_norm (the layer's former path); 2: the plain reference.
        auto run = [&](int how) {
          auto qkv = qkv0.detach().clone().requires_grad_(true);
          model::RopedQkv r;
          if (how == 0) {
            r = model::rope_norm_qkv(qkv, sh.nh, sh.nkv, sh.dh, p.pos, tables);
            EXPECT_EQ(r.q.grad_fn()->name().find("FusedRopeNormQkv") != std::string::npos, sh.dh != 34)
                << what << ": the path taken";
          } else {
            auto parts = qkv.split_with_sizes({sh.nh * sh.dh, sh.nkv * sh.dh, sh.nkv * sh.dh}, -1);
            auto norm = [&](const torch::Tensor& x) {
              return how == 1 ? model::rope_qk_norm(x, p.pos, tables)
                              : model::rms_norm_plain(model::apply_rope(x, p.pos, tables));
            };
            r.q = norm(parts[0].view({sh.B, sh.T, sh.nh, sh.dh}));
            r.k = norm(parts[1].view({sh.B, sh.T, sh.nkv, sh.dh}));
            r.v = parts[2].view({sh.B, sh.T, sh.nkv, sh.dh});
          }
          const torch::Tensor outs[3] = {r.q, r.k, r.v};
          auto f32 = [](const torch::Tensor& x) { return x.to(torch::kFloat32); };
          torch::Tensor loss;
          for (int i = 0; i < 3; ++i) {
            if (i == unused) continue;
            auto term = (f32(outs[i].transpose(1, 2)) * f32(g[i])).sum();
            loss = loss.defined() ? loss + term : term;
          }
          loss.backward();
          return std::vector<torch::Tensor>{r.q.detach(), r.k.detach(), r.v.detach(), qkv.grad()};
        };
        const auto fused = run(0), split = run(1), plain = run(2);
        const double tol = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
        const char* names[] = {"q", "k", "v", "dqkv"};
        for (int i = 0; i < 4; ++i) {
          EXPECT_EQ(fused[i].sizes(), split[i].sizes()) << what << " " << names[i];
          EXPECT_EQ(fused[i].scalar_type(), dtype) << what << " " << names[i];
          EXPECT_TRUE(torch::equal(fused[i], split[i])) << what << " " << names[i] << ": not the split path's bits";
          EXPECT_LT(rel_norm_diff(fused[i], plain[i]), tol) << what << " " << names[i];
        }
        if (unused >= 0) {
          const int64_t col = (unused == 0 ? 0 : unused == 1 ? sh.nh : sh.nh + sh.nkv) * sh.dh;
          const int64_t width = (unused == 0 ? sh.nh : sh.nkv) * sh.dh;
          EXPECT_EQ(fused[3].narrow(2, col, width).abs().max().item<float>(), 0.f) << what;
        }
        if (unused < 0 && sh.T == 300)
          std::printf("[measured] RoPE + QK-norm q|k|v %s: dqkv %.3g from the plain reference\n", what.c_str(),
                      rel_norm_diff(fused[3], plain[3]));
      }
    }
  }
}

// The Gated DeltaNet short conv + SiLU kernel against the ATen shifted-sum reference: output, input
// gradient and weight gradient, on a column slice of a wider tensor (as the layer feeds it), for
// dense rows and for one packed row whose taps must stop at document starts, W = 4 and 3, odd
// channel counts, fp32 and bf16. The reference rounds every tap's partial sum to bf16, so bf16 is
// compared at a few bf16 steps; the kernel's weight gradient is an fp32 sum of every token.
TEST(FusedOpsCuda, ShortConvMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(41);
  struct Case {
    int64_t B, T, C, W;
    bool packed;
    int64_t pad = 7, off = 3;  // x is a column slice [off, off + C) of rows C + pad wide
    bool unit_token_stride = false;  // T = 1: x's token dim gets stride 1 (still "contiguous")
  };
  // The first three slices are misaligned (the kernels stage them element by element), the next
  // two allow 16-byte loads. The last two: one token a row (as in decoding), whose size-1 token dim
  // carries stride 1, which PyTorch calls contiguous: the kernels must step rows by the batch stride
  // (five rows of a plain tensor) and must not take 1 for a row's stride (one row cut from a wider
  // one, at an offset).
  for (const Case c : {Case{2, 300, 333, 4, false}, Case{3, 129, 96, 3, false}, Case{1, 517, 130, 4, true},
                       Case{1, 517, 256, 4, true, 16, 8}, Case{2, 300, 512, 3, false, 8, 0},
                       Case{5, 1, 96, 4, false, 0, 0, true}, Case{1, 1, 130, 4, false, 7, 3, true}}) {
    for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
      auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      auto wide = torch::randn({c.B, c.T, c.C + c.pad}, opts);
      auto w32 = torch::randn({c.C, c.W}, torch::kCUDA) * 0.5;
      model::Positions p = model::dense_positions(c.B, c.T, torch::kCUDA);
      if (c.packed) {
        // Documents of one token at the row's start and end: the backward's walk past the row's end
        // must still keep each tap inside its document.
        auto cu = torch::tensor({int64_t{0}, int64_t{1}, int64_t{40}, int64_t{42}, int64_t{300}, c.T - 2, c.T - 1, c.T},
                                torch::kInt64);
        p = model::packed_positions(cu, c.T, torch::kCUDA);
      }
      auto run = [&](bool fused) {
        auto x = wide.detach().clone().requires_grad_(true);
        auto w = w32.detach().clone().requires_grad_(true);
        auto xs = x.narrow(2, c.off, c.C);  // unit channel stride, token stride C + pad
        if (c.unit_token_stride) {
          xs = xs.as_strided({c.B, 1, c.C}, {c.C + c.pad, 1, 1});
          EXPECT_TRUE(xs.is_contiguous());
        }
        auto y = fused ? model::fused_short_conv(xs, w, p) : model::short_conv(xs, w, p);
        auto gy = torch::ones_like(y) + torch::arange(y.numel(), opts).view(y.sizes()).remainder(7) * 0.1;
        (y.to(torch::kFloat32) * gy.to(torch::kFloat32)).sum().backward();
        return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
      };
      const auto got = run(true), want = run(false);
      const double ey = rel_norm_diff(got[0], want[0]), edx = rel_norm_diff(got[1], want[1]),
                   edw = rel_norm_diff(got[2], want[2]);
      std::printf("short conv B%lld T%lld C%lld W%lld %s %s: y %.1e, dx %.1e, dw %.1e\n", (long long)c.B,
                  (long long)c.T, (long long)c.C, (long long)c.W, c.packed ? "packed" : "dense", name_of(dt), ey, edx,
                  edw);
      const double tol = dt == torch::kFloat32 ? 1e-5 : 2e-2;
      EXPECT_LT(ey, tol);
      EXPECT_LT(edx, tol);
      EXPECT_LT(edw, tol);
    }
  }
}

// More (row, token tile) pairs than one grid dimension holds (65535 blocks: 3.1M tokens a call at
// the backward's 48-token tiles, 4.2M at the forward's 64): the kernels put the rest on the grid's
// z and must still cover every tile once. Two rows of 2.5M tokens, 8 channels, fp32 and bf16,
// against the reference with ShortConvMatchesReference's tolerances.
TEST(FusedOpsCuda, ShortConvCoversMoreTokenTilesThanAGridDimensionHolds) {
  DD_REQUIRE_GPU();
  seed_from_gtest(44);
  const int64_t B = 2, T = 2500000, C = 8, W = 4;
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    auto x0 = torch::randn({B, T, C}, opts);
    auto w0 = torch::randn({C, W}, torch::kCUDA) * 0.5;
    const model::Positions p = model::dense_positions(B, T, torch::kCUDA);
    auto run = [&](bool fused) {
      auto x = x0.detach().clone().requires_grad_(true);
      auto w = w0.detach().clone().requires_grad_(true);
      auto y = fused ? model::fused_short_conv(x, w, p) : model::short_conv(x, w, p);
      auto gy = torch::ones_like(y) + torch::arange(y.numel(), opts).view(y.sizes()).remainder(7) * 0.1;
      (y.to(torch::kFloat32) * gy.to(torch::kFloat32)).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
    };
    const auto got = run(true), want = run(false);
    const double tol = dt == torch::kFloat32 ? 1e-5 : 2e-2;
    // Each row's last tokens too: a tile left out would leave them as the output's fresh memory.
    for (size_t i = 0; i < 2; ++i) {
      const double e = rel_norm_diff(got[i], want[i]);
      const double tail = rel_norm_diff(got[i].narrow(1, T - 1000, 1000), want[i].narrow(1, T - 1000, 1000));
      EXPECT_LT(e, tol) << name_of(dt) << (i == 0 ? " y" : " dx");
      EXPECT_LT(tail, tol) << name_of(dt) << (i == 0 ? " y" : " dx") << ", the rows' last tokens";
    }
    // dw sums 5M tokens' products: fp32 atomics in another order than the reference's sums.
    EXPECT_LT(rel_norm_diff(got[2], want[2]), dt == torch::kFloat32 ? 1e-4 : 2e-2) << name_of(dt) << " dw";
    std::printf("short conv, two rows of %lld tokens, %s: y %.1e, dx %.1e, dw %.1e\n", static_cast<long long>(T),
                name_of(dt), rel_norm_diff(got[0], want[0]), rel_norm_diff(got[1], want[1]),
                rel_norm_diff(got[2], want[2]));
  }
}

// The Gated DeltaNet's front (model::fused_short_conv_parts): the conv over the q|k|v columns of
// the projection's rows, cut into its parts, and the output gate's columns as they are, against
// split, short_conv and split (the reference): each part, the rest, and the gradients of the rows
// (written by the parts' backward into one tensor) and of the conv weight. Widths as in the hybrid
// presets (aligned) and odd ones (staged element by element), dense and packed rows; the rest's
// gradient must be exactly the gradient it was handed. The backward takes up to four parts a
// launch, so five parts take two.
TEST(FusedOpsCuda, ShortConvPartsMatchSplitConvSplit) {
  DD_REQUIRE_GPU();
  seed_from_gtest(43);
  struct Case {
    int64_t B, T, W;
    std::vector<int64_t> widths;
    int64_t rest;
    bool packed;
  };
  for (const Case& c : {Case{2, 300, 4, {576, 576, 1152}, 1152, false}, Case{1, 517, 4, {96, 96, 192}, 192, true},
                        Case{2, 129, 3, {33, 33, 70}, 19, false}, Case{1, 517, 4, {64, 40, 128, 24, 48}, 16, true}}) {
    for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
      int64_t C = 0;
      for (int64_t w : c.widths) C += w;
      auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      auto rows = torch::randn({c.B, c.T, C + c.rest}, opts);
      auto w32 = torch::randn({C, c.W}, torch::kCUDA) * 0.5;
      model::Positions p = model::dense_positions(c.B, c.T, torch::kCUDA);
      if (c.packed) {
        // Documents of one token at the row's start and end: the backward's walk past the row's end
        // must still keep each tap inside its document.
        auto cu = torch::tensor({int64_t{0}, int64_t{1}, int64_t{40}, int64_t{42}, int64_t{300}, c.T - 2, c.T - 1, c.T},
                                torch::kInt64);
        p = model::packed_positions(cu, c.T, torch::kCUDA);
      }
      std::vector<torch::Tensor> grads;
      for (int64_t w : c.widths) grads.push_back(torch::randn({c.B, c.T, w}, opts));
      grads.push_back(torch::randn({c.B, c.T, c.rest}, opts));
      auto run = [&](bool fused) {
        auto y = rows.detach().clone().requires_grad_(true);
        auto w = w32.detach().clone().requires_grad_(true);
        model::ShortConvParts out;
        if (fused) {
          out = model::fused_short_conv_parts(y, w, p, c.widths);
          EXPECT_NE(out.parts[0].grad_fn()->name().find("ShortConvParts"), std::string::npos) << "the path taken";
        } else {
          auto halves = y.split_with_sizes({C, c.rest}, -1);
          out = {model::short_conv(halves[0], w, p).split_with_sizes(c.widths, -1), halves[1]};
        }
        auto loss = (out.rest.to(torch::kFloat32) * grads.back().to(torch::kFloat32)).sum();
        for (size_t i = 0; i < c.widths.size(); ++i)
          loss = loss + (out.parts[i].to(torch::kFloat32) * grads[i].to(torch::kFloat32)).sum();
        loss.backward();
        std::vector<torch::Tensor> r;
        for (const auto& t : out.parts) r.push_back(t.detach());
        r.push_back(out.rest.detach());
        r.push_back(y.grad());
        r.push_back(w.grad());
        return r;
      };
      const auto got = run(true), want = run(false);
      const double tol = dt == torch::kFloat32 ? 1e-5 : 2e-2;
      const std::string what = std::string(name_of(dt)) + " C=" + std::to_string(C) + (c.packed ? " packed" : " dense");
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].sizes(), want[i].sizes()) << what << " tensor " << i;
        EXPECT_LT(rel_norm_diff(got[i], want[i]), tol) << what << " tensor " << i;
      }
      const auto& dy = got[got.size() - 2];
      EXPECT_TRUE(torch::equal(dy.narrow(2, C, c.rest), grads.back())) << what << ": the rest's gradient";
      std::printf("short conv parts %s: parts %.1e, dy %.1e, dw %.1e\n", what.c_str(), rel_norm_diff(got[0], want[0]),
                  rel_norm_diff(dy, want[want.size() - 2]), rel_norm_diff(got.back(), want.back()));
    }
  }
}

// The backward over parts refuses parts it cannot write: out of order or overlapping, past the
// rows of x or dx, none or more than it takes, a part without a gradient. Nothing is launched, so
// the output keeps its contents.
TEST(FusedOpsCuda, ShortConvBackwardPartsRefusesBadParts) {
  DD_REQUIRE_GPU();
  const int64_t T = 8, W = 4, ld = 40;
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto x = torch::randn({1, T, ld}, opts), dx = torch::full({1, T, ld}, 7.0, opts);
  auto dy = torch::randn({1, T, 16}, opts);
  auto w = torch::randn({ld, W}, torch::kCUDA), dw = torch::zeros({ld, W}, torch::kCUDA);
  auto run = [&](std::vector<kernels::ShortConvGradPart> parts, int64_t ld_dx) {
    return kernels::short_conv_backward_parts(dx.data_ptr(), dw.data_ptr<float>(), parts.data(),
                                              static_cast<int>(parts.size()), x.data_ptr(), kernels::DType::BF16,
                                              w.data_ptr<float>(), nullptr, 1, T, ld, static_cast<int>(W), nullptr, ld_dx);
  };
  const void* g = dy.data_ptr();
  EXPECT_NE(run({{g, 0, 16}, {g, 8, 16}}, ld), 0) << "overlapping parts";
  EXPECT_NE(run({{g, 16, 16}, {g, 0, 16}}, ld), 0) << "parts out of order";
  EXPECT_NE(run({{g, 32, 16}}, ld), 0) << "a part past the rows of x";
  EXPECT_NE(run({{g, 0, 16}}, 8), 0) << "a part past the rows of dx";
  EXPECT_NE(run({}, ld), 0) << "no parts";
  EXPECT_NE(run({{g, 0, 4}, {g, 4, 4}, {g, 8, 4}, {g, 12, 4}, {g, 16, 4}}, ld), 0) << "five parts";
  EXPECT_NE(run({{nullptr, 0, 16}}, ld), 0) << "a part without its gradient";
  torch::cuda::synchronize();
  EXPECT_TRUE(torch::all(dx == 7.0).item<bool>()) << "a refused launch wrote dx";
  EXPECT_TRUE(torch::all(dw == 0.0).item<bool>()) << "a refused launch wrote dw";
  EXPECT_EQ(run({{g, 0, 16}, {g, 24, 16}}, ld), 0) << "two parts with a gap between them";
  EXPECT_EQ(run({{g, 0, 0}, {nullptr, 8, 0}}, ld), 0) << "empty parts: nothing to do";
  torch::cuda::synchronize();
  EXPECT_TRUE(torch::all(dx.narrow(2, 16, 8) == 7.0).item<bool>()) << "the gap between two parts was written";
  EXPECT_FALSE(torch::all(dx.narrow(2, 0, 16) == 7.0).item<bool>()) << "the first part was not written";
}

// As in the Gated DeltaNet layer: the rest (the output gate) goes through the gated output norm,
// whose backward writes dz into a buffer laid out as the projection's rows, and the conv parts'
// backward then fills that buffer's other columns instead of copying dz. The projection's gradient
// equals the one through split, conv and split (where dz goes back through autograd's split
// backward): the gate's columns exactly, the conv's within the dtype's tolerance.
TEST(FusedOpsCuda, ShortConvPartsTakeTheGateGradientInPlace) {
  DD_REQUIRE_GPU();
  seed_from_gtest(47);
  const int64_t B = 1, T = 257, H = 3, D = 64, W = 4;
  const std::vector<int64_t> widths = {96, 96, 192};
  const int64_t C = 384, R = H * D;
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    auto rows = torch::randn({B, T, C + R}, opts);
    auto w32 = torch::randn({C, W}, torch::kCUDA) * 0.5;
    auto o = torch::randn({B, T, H, D}, torch::kCUDA);
    auto nw = torch::rand({D}, torch::kCUDA) + 0.5;
    auto dout = torch::randn({B, T, H * D}, opts);
    std::vector<torch::Tensor> gparts;
    for (int64_t w : widths) gparts.push_back(torch::randn({B, T, w}, opts));
    const auto p = model::dense_positions(B, T, torch::kCUDA);
    auto run = [&](bool fused) {
      auto y = rows.detach().clone().requires_grad_(true);
      model::ShortConvParts out;
      if (fused) {
        out = model::fused_short_conv_parts(y, w32, p, widths);
      } else {
        auto halves = y.split_with_sizes({C, R}, -1);
        out = {model::short_conv(halves[0], w32, p).split_with_sizes(widths, -1), halves[1]};
      }
      auto g = model::gated_rms_norm(o, out.rest, nw, 1e-6, dt).reshape({B, T, H * D});
      auto loss = (g.to(torch::kFloat32) * dout.to(torch::kFloat32)).sum();
      for (size_t i = 0; i < widths.size(); ++i)
        loss = loss + (out.parts[i].to(torch::kFloat32) * gparts[i].to(torch::kFloat32)).sum();
      loss.backward();
      return y.grad();
    };
    const int64_t in_place_before = model::short_conv_parts_gradients_in_place();
    const auto got = run(true);
    const std::string what = name_of(dt);
    EXPECT_EQ(model::short_conv_parts_gradients_in_place(), in_place_before + 1) << what << ": the path taken";
    const auto want = run(false);
    EXPECT_TRUE(torch::equal(got.narrow(2, C, R), want.narrow(2, C, R))) << what << ": the gate's columns";
    EXPECT_LT(rel_norm_diff(got.narrow(2, 0, C), want.narrow(2, 0, C)), dt == torch::kFloat32 ? 1e-5 : 2e-2) << what;
  }
}

// The Gated DeltaNet's output norm kernel against the ATen formula: o fp32, the gate z a column
// slice of a wider projection (as in the layer), y and dy in fp32 or bf16, D a multiple of 32 and
// not, packed into one row and over a batch. fp32 differs by summation order (1e-5); bf16 y and dz
// by one rounding of the same value (8e-3), and do / dw carry dy's bf16 rounding only on both sides.
// Rows form (gated_rms_norm_rows): o is [M, D] rows in a shuffled order with 7 rows no token reads
// (the chunk layout's padding), whose gradient must be exactly zero. Rows up to 512 wide take the
// register kernels (4-column vectors where z's slice is aligned, else one column per load); the
// looped kernels run for D = 1024 and with the switch off. The bf16 backward with z aligned and
// D ≤ 256 takes the staged kernel (3 runs of 2 columns at D = 192, else runs of 4), unless that
// switch is off: the test counts its launches. With bf16 y and z, o comes in bf16 too (the delta
// rule's output under 16-bit training): its gradient comes back in bf16, one rounding of the same
// value on both sides; with z aligned and D a multiple of 8 up to 256 the forward takes the grouped
// kernel (four rows a warp) in the grouped form, and so does the backward up to D = 192; the staged
// backward and the register forward otherwise: the test counts their launches (the last case's rows
// take several groups a warp, the second's end in a partial group).
TEST(FusedOpsCuda, GatedRmsNormMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(43);
  struct Case {
    int64_t B, T, H, D;
  };
  // The last: 49128 rows, more than the backward's 4096 warps and not a multiple of them, so that
  // each warp takes 11 or 12 rows (the staged kernel's ring of slots turns over).
  const Case cases[] = {Case{2, 150, 6, 128}, Case{1, 333, 3, 40}, Case{2, 100, 6, 192}, Case{1, 90, 4, 256},
                        Case{3, 17, 1, 1024}, Case{4, 2047, 6, 192}};
  enum Form { kGrouped, kStaged, kRegisters, kLooped };
  for (const Form form : {kGrouped, kStaged, kRegisters, kLooped})
  for (const bool aligned_z : {false, true})
  for (const Case c : cases)
  for (const bool rows : {false, true}) {
    const bool registers = form != kLooped;
    kernels::gated_rmsnorm_register_rows(registers);
    kernels::gated_rmsnorm_staged_rows(form == kStaged || form == kGrouped);
    kernels::gated_rmsnorm_grouped_rows(form == kGrouped);
    for (auto dt : {torch::kFloat32, torch::kBFloat16})
    for (const bool o16 : {false, true}) {
      if (o16 && dt != torch::kBFloat16) continue;
      auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
      const int64_t N = c.B * c.T * c.H, M = rows ? N + 7 : N;
      auto o0 = rows ? torch::randn({M, c.D}, f32) * 3.0 : torch::randn({c.B, c.T, c.H, c.D}, f32) * 3.0;
      if (o16) o0 = o0.to(torch::kBFloat16);
      auto perm = torch::randperm(M, f32.dtype(torch::kInt64));
      auto o_row = perm.narrow(0, 0, N).to(torch::kInt32).view({c.B, c.T, c.H});
      // z at column 5 of rows H·D + 11 wide, or at column 8 of rows H·D + 16 wide (4-column vectors).
      const int64_t z_col = aligned_z ? 8 : 5, z_pad = aligned_z ? 16 : 11;
      auto wide0 = (torch::randn({c.B, c.T, c.H * c.D + z_pad}, f32) * 2.0).to(dt);
      auto w0 = torch::rand({c.D}, f32) + 0.5;
      auto gy = torch::randn({c.B, c.T, c.H, c.D}, f32).to(dt);
      auto run = [&](bool fused, const torch::Tensor& pad_rows = {}) {
        auto o = o0.clone().requires_grad_(true), wide = wide0.clone().requires_grad_(true);
        auto w = w0.clone().requires_grad_(true);
        auto z = wide.narrow(2, z_col, c.H * c.D);
        torch::Tensor y;
        if (rows) {
          y = fused ? model::gated_rms_norm_rows(o, o_row, z, w, 1e-6, dt, pad_rows)
                    : model::gated_rms_norm_rows_reference(o, o_row, z, w, 1e-6, dt);
        } else {
          y = fused ? model::gated_rms_norm(o, z, w, 1e-6, dt) : model::gated_rms_norm_reference(o, z, w, 1e-6, dt);
        }
        if (fused) {  // the kernels' node, not the reference's ATen ops (a bf16 o too)
          EXPECT_NE(y.grad_fn()->name().find("GatedRmsNorm"), std::string::npos) << y.grad_fn()->name();
        }
        (y.to(torch::kFloat32) * gy.to(torch::kFloat32)).sum().backward();
        return std::vector<torch::Tensor>{y.detach(), o.grad(), wide.grad(), w.grad()};
      };
      const int64_t staged_before = kernels::gated_rmsnorm_staged_launches();
      const int64_t grouped_before = kernels::gated_rmsnorm_grouped_launches();
      const auto got = run(true), want = run(false);
      const bool grouped = form == kGrouped && o16 && aligned_z && c.D % 8 == 0 && c.D <= 256;
      const bool grouped_back = grouped && c.D <= 192;
      const bool staged =
          (form == kStaged || form == kGrouped) && !grouped_back && dt == torch::kBFloat16 && aligned_z && c.D <= 256;
      EXPECT_EQ(kernels::gated_rmsnorm_staged_launches() - staged_before, staged ? 1 : 0)
          << "staged backward launches, D " << c.D << (rows ? " rows" : "");
      EXPECT_EQ(kernels::gated_rmsnorm_grouped_launches() - grouped_before,
                (grouped ? 1 : 0) + (grouped_back ? 1 : 0))
          << "grouped forward and backward launches, D " << c.D << (rows ? " rows" : "");
      if (rows) {
        auto unread = perm.narrow(0, N, M - N);
        EXPECT_EQ(got[1].index_select(0, unread).abs().max().item<float>(), 0.f) << "padding rows' gradient";
        // With the padding rows handed over as a list (a fixed chunk layout's), the same bits, by
        // the list's path.
        const int64_t by_list = model::gated_norm_padding_rows_by_list();
        const auto listed = run(true, unread.to(torch::kInt32).contiguous());
        EXPECT_EQ(model::gated_norm_padding_rows_by_list() - by_list, 1) << "D " << c.D;
        for (size_t i = 0; i < listed.size(); ++i)
          EXPECT_TRUE(torch::equal(listed[i], got[i])) << "padding rows by list, output " << i << ", D " << c.D;
      }
      const char* names[] = {"y", "do", "dz", "dw"};
      const double tol = tol_for(dt);
      std::string what = "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" + std::to_string(c.H) + " D" +
                         std::to_string(c.D) + " " + name_of(dt) + (rows ? " rows" : "") +
                         (form == kGrouped  ? " grouped"
                          : form == kStaged ? " staged"
                          : registers       ? " registers"
                                            : " looped") +
                         (aligned_z ? " z aligned" : "") + (o16 ? " bf16 o" : "");
      double e[4];
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what << " " << names[i];
        e[i] = rel_norm_diff(got[i], want[i]);
        EXPECT_LT(e[i], tol) << what << " " << names[i];
      }
      std::printf("[measured] gated RMSNorm %s: y %.1e do %.1e dz %.1e dw %.1e\n", what.c_str(), e[0], e[1], e[2], e[3]);
    }
  }
  kernels::gated_rmsnorm_register_rows(true);
  kernels::gated_rmsnorm_staged_rows(true);
  kernels::gated_rmsnorm_grouped_rows(true);
}

// The padding rows' zero fill of the output norm's backward (kernels/zero_rows.h): on a matrix full
// of 7s, exactly the rows the map does not name become 0 and every named row keeps its 7s; widths
// with and without 16-byte vectors, a map naming every row, none, and with repeats; fp32 and bf16
// rows (the 16-bit entry point). The listed form, given the unnamed rows in a shuffled list, leaves
// the same matrix bit for bit.
TEST(FusedOpsCuda, ZeroUnnamedRowsTouchesOnlyThoseRows) {
  DD_REQUIRE_GPU();
  seed_from_gtest(48);
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA);
  struct Case {
    int64_t M, D, n;
  };
  for (const Case c : {Case{100992 / 8, 256, 100992 / 8 - 336}, Case{1000, 37, 993}, Case{77, 4, 77}, Case{65, 12, 0},
                       Case{300, 96, 1}, Case{130, 8, 60}})
  for (const auto dt : {torch::kFloat32, torch::kBFloat16}) {
    auto x = torch::full({c.M, c.D}, 7.0f, i64.dtype(dt));
    auto perm = torch::randperm(c.M, i64);
    auto row_of = perm.narrow(0, 0, c.n).to(torch::kInt32);
    if (c.n > 1) row_of = torch::cat({row_of, row_of.narrow(0, 0, c.n / 2)});  // repeats are allowed
    auto named = torch::empty({c.M}, i64.dtype(torch::kUInt8));
    const int err = dt == torch::kFloat32
                        ? kernels::zero_unnamed_rows_f32(x.data_ptr<float>(), c.M, c.D, row_of.data_ptr<int32_t>(),
                                                         row_of.numel(), named.data_ptr<uint8_t>(), model::stream_of(x))
                        : kernels::zero_unnamed_rows_16bit(x.data_ptr(), c.M, c.D, row_of.data_ptr<int32_t>(),
                                                           row_of.numel(), named.data_ptr<uint8_t>(), model::stream_of(x));
    model::check_kernel_launch(err, "zero_unnamed_rows");
    const std::string what = "M" + std::to_string(c.M) + " D" + std::to_string(c.D) + " n" + std::to_string(c.n) +
                             (dt == torch::kFloat32 ? " fp32" : " bf16");
    auto kept = x.index_select(0, perm.narrow(0, 0, c.n)), zeroed = x.index_select(0, perm.narrow(0, c.n, c.M - c.n));
    if (c.n > 0) {
      EXPECT_TRUE((kept == 7.0f).all().item<bool>()) << what;
    }
    if (c.n < c.M) {
      EXPECT_EQ(zeroed.abs().max().item<float>(), 0.f) << what;
    }
    auto listed = torch::full({c.M, c.D}, 7.0f, i64.dtype(dt));
    auto unnamed = perm.narrow(0, c.n, c.M - c.n);
    unnamed = unnamed.index_select(0, torch::randperm(unnamed.numel(), i64)).to(torch::kInt32).contiguous();
    const int err_list = dt == torch::kFloat32
                             ? kernels::zero_listed_rows_f32(listed.data_ptr<float>(), c.D, unnamed.data_ptr<int32_t>(),
                                                             unnamed.numel(), model::stream_of(x))
                             : kernels::zero_listed_rows_16bit(listed.data_ptr(), c.D, unnamed.data_ptr<int32_t>(),
                                                               unnamed.numel(), model::stream_of(x));
    model::check_kernel_launch(err_list, "zero_listed_rows");
    EXPECT_TRUE(torch::equal(listed, x)) << what << ": the listed form";
  }
}

// The Gated DeltaNet's L2Norm kernel against the ATen formula: x a column slice of a wider
// activation (as q and k sit in the short conv's output) or contiguous, in fp32, bf16 and fp16, y
// fp32 or in x's dtype (16-bit training's q and k); D in the presets (96, 128), not a multiple of
// 32, and past 256 (the looped kernel); one token per batch row too. Both sides compute in fp32
// from the same x values: an fp32 y within 1e-6, a 16-bit one within one rounding of the same
// value (tol_for). dx is in x's dtype: fp32 differs by summation order (1e-5), bf16 and fp16 by
// one rounding of the same value. 16-bit x with y of its dtype and D of 64, 96 or 128 takes the
// half-warp pair kernels (counted: forward and backward) unless the switch is off, or x's slice
// starts on an odd column (pairs off a 4-byte boundary); 999 rows (a warp's rows part full) and 6
// (the second warp's second half-warp entirely past the end).
TEST(FusedOpsCuda, L2NormMatchesReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(47);
  struct Case {
    int64_t B, T, H, D;
    bool slice;     // x is a column slice of a wider [B, T, H·D + 40] tensor
    int64_t col0 = 16;  // the slice's first column
  };
  const Case cases[] = {Case{2, 150, 6, 96, true},     Case{1, 333, 4, 128, true}, Case{3, 17, 3, 40, false},
                        Case{2, 9, 2, 300, true},      Case{4, 1, 6, 96, true},    Case{1, 333, 3, 64, true},
                        Case{2, 150, 6, 96, true, 15}, Case{1, 1, 6, 96, false}};
  for (const bool pairs : {true, false})
  for (const Case c : cases) {
    kernels::l2_norm_pair_rows(pairs);
    for (auto dt : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
      std::vector<torch::ScalarType> y_dts{torch::kFloat32};
      if (dt != torch::kFloat32) y_dts.push_back(dt);
      for (auto y_dt : y_dts) {
        auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
        auto wide0 = (torch::randn({c.B, c.T, c.H * c.D + 40}, f32) * 2.0).to(dt);
        auto gy = torch::randn({c.B, c.T, c.H, c.D}, f32);
        auto run = [&](bool fused) {
          auto wide = wide0.clone().requires_grad_(true);
          auto x = c.slice ? wide.narrow(2, c.col0, c.H * c.D).view({c.B, c.T, c.H, c.D})
                           : wide.narrow(2, 0, c.H * c.D).contiguous().view({c.B, c.T, c.H, c.D});
          auto y = fused ? model::fused_l2_norm(x, 1e-6, y_dt) : model::l2_norm_reference(x, 1e-6, y_dt);
          (y * gy).sum().backward();
          return std::vector<torch::Tensor>{y.detach(), wide.grad()};
        };
        const int64_t pair_launches = kernels::l2_norm_pair_launches();
        const auto got = run(true), want = run(false);
        std::string what = "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" + std::to_string(c.H) + " D" +
                           std::to_string(c.D) + (c.slice ? " slice at " + std::to_string(c.col0) + " " : " ") +
                           name_of(dt) + ", y " + name_of(y_dt) + (pairs ? "" : ", pairs off");
        const bool takes_pairs = pairs && dt != torch::kFloat32 && y_dt == dt &&
                                 (c.D == 64 || c.D == 96 || c.D == 128) && (!c.slice || c.col0 % 2 == 0);
        EXPECT_EQ(kernels::l2_norm_pair_launches() - pair_launches, takes_pairs ? 2 : 0) << what;
        EXPECT_EQ(got[0].scalar_type(), y_dt) << what;
        EXPECT_EQ(got[1].scalar_type(), dt) << what;
        const double ey = rel_norm_diff(got[0], want[0]), ex = rel_norm_diff(got[1], want[1]);
        EXPECT_LT(ey, y_dt == torch::kFloat32 ? 1e-6 : tol_for(y_dt)) << what << " y";
        EXPECT_LT(ex, tol_for(dt)) << what << " dx";
        std::printf("[measured] L2Norm %s: y %.1e dx %.1e\n", what.c_str(), ey, ex);
      }
    }
  }
  kernels::l2_norm_pair_rows(true);
}

// The Gated DeltaNet's gates kernels (model::fused_gdn_gates) against the ATen formula on a and b
// cut from the same rows: beta, g and the gradients of the rows, A_log and dt_bias. a spans both
// sides of softplus's threshold (20); the hybrid presets' heads (6) and odd ones (3, 17); with and
// without negative eigenvalues; beta's gradient missing once (g alone feeds the loss). Both sides
// compute in fp32 from the same 16-bit values: beta and g within 1e-6, the rows' gradient within
// one rounding of the same value (tol_for), the per-head sums (16384 terms added in another order)
// within 1e-5.
TEST(FusedOpsCuda, GdnGatesMatchReference) {
  DD_REQUIRE_GPU();
  seed_from_gtest(47);
  struct Case {
    int64_t B, T, H;
    bool neg_eig, beta_used;
  };
  for (const Case c : {Case{8, 2048, 6, false, true}, Case{1, 333, 3, true, true}, Case{2, 77, 17, false, false}}) {
    for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
      auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
      auto ab0 = (torch::randn({c.B, c.T, 2 * c.H}, f32) * 6.0 + 2.0).to(dt);
      ab0.select(1, 0).fill_(25.0);  // past softplus's threshold
      auto A0 = torch::rand({c.H}, f32) * 2.5, dt0 = torch::randn({c.H}, f32);
      auto gbeta = torch::randn({c.B, c.T, c.H}, f32), gg = torch::randn({c.B, c.T, c.H}, f32);
      auto run = [&](bool fused) {
        auto ab = ab0.clone().requires_grad_(true), A = A0.clone().requires_grad_(true),
             db = dt0.clone().requires_grad_(true);
        auto out = fused ? model::fused_gdn_gates(ab, A, db, c.neg_eig, torch::kFloat32)
                         : model::gdn_gates_reference(ab.narrow(2, 0, c.H), ab.narrow(2, c.H, c.H), A, db, c.neg_eig,
                                                      torch::kFloat32);
        auto loss = (out.g * gg).sum();
        if (c.beta_used) loss = loss + (out.beta * gbeta).sum();
        loss.backward();
        return std::vector<torch::Tensor>{out.beta.detach(), out.g.detach(), ab.grad(), A.grad(), db.grad()};
      };
      const auto got = run(true), want = run(false);
      const char* names[] = {"beta", "g", "dab", "dA_log", "d_dt_bias"};
      const double tols[] = {1e-6, 1e-6, tol_for(dt), 1e-5, 1e-5};
      std::string what = "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" + std::to_string(c.H) + " " +
                         name_of(dt) + (c.neg_eig ? " neg_eig" : "") + (c.beta_used ? "" : " g only");
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(got[i].defined()) << what << " " << names[i];
        EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << what << " " << names[i];
        const double e = rel_norm_diff(got[i], want[i]);
        EXPECT_LT(e, tols[i]) << what << " " << names[i];
        std::printf("[measured] gdn gates %s %s: %.1e\n", what.c_str(), names[i], e);
      }
      if (!c.beta_used) {
        EXPECT_EQ(got[2].narrow(2, c.H, c.H).abs().max().item<float>(), 0.f) << what << ": b's gradient";
      }
      // The kernels ran (the op's node), not the reference.
      auto probe = model::fused_gdn_gates(ab0.clone().requires_grad_(true), A0, dt0, c.neg_eig, torch::kFloat32);
      EXPECT_NE(probe.g.grad_fn()->name().find("FusedGdnGates"), std::string::npos) << what;
    }
  }
}

// The gated delta rule's CUDA pieces against their ATen references on the same GPU, outputs and
// every input gradient: the chunk-state scan kernel (model/gdr_scan.h) on dense and ragged
// (varlen) chunk plans, with head sizes that are not multiples of its 32-column blocks and chunk
// sizes up to its limit; the unit lower-triangular solve through the inverse kernel
// (model/tril_solve.h); and the chunk core's kernels (model/gdr_chunk_core.h), the forward's fused
// front among them. Fresh random inputs each run, seeded from GoogleTest's seed. Skips without a
// GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kernels/gdr_chunk_front.h"
#include "kernels/gdr_chunk_solve_backward.h"
#include "kernels/gdr_chunk_state_grads.h"
#include "kernels/gdr_head_sizes.h"
#include "kernels/gdr_scan.h"
#include "kernels/wgmma_check.h"
#include "model/fused_l2norm.h"
#include "model/gdr.h"
#include "model/gdr_chunk_core.h"
#include "model/gdr_plan_slots.h"
#include "model/gdr_scan.h"
#include "model/gdr_state_grads.h"
#include "model/tril_solve.h"
#include "tests/support/gdr_output_run.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::rel_norm_diff;

// A step-major plan for documents with these chunk counts (sorted longest first, as model/gdr.cpp
// sorts them). Returns the number of chunks through `n_chunks`.
model::GdrScanPlan make_plan(std::vector<int64_t> counts, int64_t heads, int64_t& n_chunks) {
  std::sort(counts.begin(), counts.end(), std::greater<int64_t>());
  model::GdrScanPlan p;
  p.n_docs = static_cast<int64_t>(counts.size());
  p.heads = heads;
  n_chunks = 0;
  for (int64_t m = 0; m < counts[0]; ++m) {
    int64_t cnt = 0;
    while (cnt < p.n_docs && counts[static_cast<size_t>(cnt)] > m) ++cnt;
    p.step_count.push_back(cnt);
    p.step_off.push_back(n_chunks);
    n_chunks += cnt;
  }
  return p;
}

struct Case {
  std::vector<int64_t> chunk_counts;
  int64_t H, C, dk, dv;
};

// The scan's inputs for R chunk rows and S initial states of case c, with magnitudes like the
// model's: W and Kd rows of L2-normalised keys times β ≤ 1 and decay ≤ 1.
struct ScanInputs {
  torch::Tensor W, U, Kd, decay, h0;
};
ScanInputs random_scan_inputs(const Case& c, int64_t R, int64_t S) {
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  ScanInputs in;
  in.W = torch::randn({R, c.C, c.dk}, opt) / std::sqrt(static_cast<double>(c.dk));
  in.U = torch::randn({R, c.C, c.dv}, opt);
  in.Kd = torch::randn({R, c.C, c.dk}, opt) / std::sqrt(static_cast<double>(c.dk));
  in.decay = torch::rand({R}, opt) * 0.5 + 0.5;
  in.h0 = torch::randn({S, c.dk, c.dv}, opt);
  return in;
}

// Dense and ragged plans at the model's head sizes (bench gdr's, hybrid and moe-1b's) and a narrow
// one, and every scan kernel: the tensor-core widths the default picks from, fixed widths, and the FMA kernel.
const Case kModelHeadCases[] = {{{4, 4}, 3, 64, 128, 128},
                                {{9, 1, 3, 3, 2}, 2, 64, 96, 192},
                                {{3, 2}, 2, 64, 128, 256},
                                {{3, 6, 1}, 2, 32, 80, 40}};
const int kScanVariants[] = {kernels::kGdrScanAuto,          kernels::kGdrScanTensorCores32, kernels::kGdrScanTensorCores64,
                             kernels::kGdrScanTensorCores96, kernels::kGdrScanTensorCores128, kernels::kGdrScanSimt16};

// Puts back the process-wide scan switches a test changes (the automatic kernel variant, the
// forward's bf16 products on) when the test ends, also when an ASSERT leaves it early, so the
// tests after it run with the defaults.
struct ScanSwitchesRestored {
  ~ScanSwitchesRestored() {
    model::gdr_scan_variant(kernels::kGdrScanAuto);
    model::gdr_bf16_forward_scan_products(true);
  }
};

// Likewise for the warp-column scans' switches (kernels::gdr_scan_warp_columns on, the width
// picked for the sizes).
struct WarpColumnsRestored {
  const bool copy_warps = kernels::gdr_scan_copy_warps();
  ~WarpColumnsRestored() {
    kernels::gdr_scan_warp_columns(true);
    kernels::gdr_scan_warp_width(0);
    kernels::gdr_scan_wgmma(false);
    kernels::gdr_scan_copy_warps(copy_warps);
  }
};

// The bf16-product tests' cases: the model's head sizes and the smallest sizes, which the bf16
// kernels take, and C > 64 and dk > 128, which they do not; and the tensor-core variants they run
// in (the automatic width and each fixed one).
struct Bf16Case {
  Case c;
  bool taken;
};
std::vector<Bf16Case> bf16_product_cases() {
  std::vector<Bf16Case> cases;
  for (const Case& c : kModelHeadCases) cases.push_back({c, true});
  cases.push_back({{{2, 5}, 2, 16, 16, 8}, true});     // the smallest sizes taken
  cases.push_back({{{3, 2}, 2, 128, 64, 72}, false});  // C > 64
  cases.push_back({{{3, 1}, 2, 64, 256, 40}, false});  // dk > 128
  return cases;
}
const int kTensorCoreVariants[] = {kernels::kGdrScanAuto, kernels::kGdrScanTensorCores32,
                                   kernels::kGdrScanTensorCores64, kernels::kGdrScanTensorCores96,
                                   kernels::kGdrScanTensorCores128};

std::string describe(const Case& c) {
  std::string docs;
  for (const int64_t n : c.chunk_counts) docs += (docs.empty() ? "" : ",") + std::to_string(n);
  return "docs [" + docs + "] H=" + std::to_string(c.H) + " C=" + std::to_string(c.C) + " dk=" + std::to_string(c.dk) +
         " dv=" + std::to_string(c.dv);
}

// The inputs of the scan's backward fed by the output's gradient (model::gdr_scan_backward_from_
// output_grad) for case c: the plan (TF32 products, bf16 states), bf16 W, Kd, Qg and Pm (zero above
// its diagonal) and fp32 decay; output_grad draws dO and the final state gradient, reference is
// the fp64 result.
struct FusedScanCase {
  struct OutputGrad {
    torch::Tensor dO, map, d_hfinal;  // map: int32 [R·C] when mapped, else undefined
    int64_t n_rows = 0;
  };
  Case c;
  model::GdrScanPlan plan;
  int64_t R = 0, S = 0;
  torch::Tensor W, Kd, Qg, Pm, decay;
  double scale = 1;

  explicit FusedScanCase(const Case& cs) : c(cs) {
    int64_t N = 0;
    plan = make_plan(c.chunk_counts, c.H, N);
    plan.tf32_products = true;
    plan.bf16_states = true;
    R = N * c.H;
    S = plan.n_docs * c.H;
    const ScanInputs in = random_scan_inputs(c, R, S);
    W = in.W.to(torch::kBFloat16);
    Kd = in.Kd.to(torch::kBFloat16);
    decay = in.decay;
    Qg = (torch::randn({R, c.C, c.dk}, in.W.options()) / std::sqrt(static_cast<double>(c.dk))).to(torch::kBFloat16);
    Pm = (torch::randn({R, c.C, c.C}, in.W.options()).tril() / std::sqrt(static_cast<double>(c.C))).to(torch::kBFloat16);
    scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
  }

  // dO [n_rows, dv]: the R·C chunk rows, or when mapped extra_rows more with the chunk rows spread
  // over them in random order through the map, one in eight −1 (a zero row); and a final gradient
  // when with_final.
  OutputGrad output_grad(bool mapped, bool with_final, int64_t extra_rows) const {
    const auto opt = decay.options();
    OutputGrad g;
    g.n_rows = mapped ? R * c.C + extra_rows : R * c.C;
    g.dO = torch::randn({g.n_rows, c.dv}, opt);
    if (mapped) {
      auto idx = torch::randperm(g.n_rows, opt.dtype(torch::kInt64)).narrow(0, 0, R * c.C);
      idx.masked_fill_(torch::rand({R * c.C}, opt) < 0.125, -1);
      g.map = idx.to(torch::kInt32);
    }
    if (with_final) g.d_hfinal = torch::randn({S, c.dk, c.dv}, opt);
    return g;
  }

  model::GdrScanGrads run(const OutputGrad& g, bool bf16_dU = false, bool bf16_products = false) const {
    return model::gdr_scan_backward_from_output_grad(W, Kd, decay, Pm, Qg, g.dO, g.map, scale, g.d_hfinal, plan,
                                                     bf16_dU, bf16_products);
  }

  // fp64: dO gathered into chunk rows (a zero row for −1), the two products, the ATen scan.
  model::GdrScanGrads reference(const OutputGrad& g) const {
    const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kFloat64); };
    const auto rows64 =
        g.map.defined()
            ? torch::cat({f64(g.dO), torch::zeros({1, c.dv}, g.dO.options().dtype(torch::kFloat64))})
                  .index_select(0, torch::where(g.map < 0, g.n_rows, g.map).to(torch::kInt64))
            : f64(g.dO);
    const auto dO64 = rows64.view({R, c.C, c.dv});
    return model::gdr_scan_backward_reference(f64(W), f64(Kd), f64(decay),
                                              scale * torch::bmm(f64(Qg).transpose(1, 2), dO64),
                                              scale * torch::bmm(f64(Pm).transpose(1, 2), dO64),
                                              g.d_hfinal.defined() ? f64(g.d_hfinal) : torch::Tensor(), plan);
  }
};

}  // namespace

// fp32 on both sides; they differ in summation order over dk and C (≤ 256 terms) and its growth
// through up to 9 chain steps, and the tensor-core variant's split-TF32 products add ~1e-6 (its
// worst case measured 1.3e-6): 2e-5 relative is about 100 fp32 ulp of headroom.
TEST(GdrScanCuda, KernelMatchesReferenceForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 907);
  const Case cases[] = {
      {{4, 4}, 3, 64, 128, 128},          // dense, the model's sizes
      {{9, 1, 3, 3, 2}, 2, 16, 36, 40},   // ragged; dk, dv not multiples of 32
      {{5, 2}, 1, 100, 64, 33},           // a chunk past 64 rows (the 16-rows-per-warp path)
      {{2, 3}, 2, 128, 256, 64},          // the kernel's largest chunk and key size
      {{1}, 4, 7, 4, 1},                  // a single step, tiny sizes
      // sizes the tensor-core variant takes, besides the first case: a column block past dv, the
      // smallest tiles, two 16-row tiles of y per warp (C 128), two state-row tiles per warp (dk 256)
      {{3, 6, 1}, 2, 32, 80, 36},
      {{4, 2}, 3, 16, 16, 8},
      {{2, 2}, 2, 48, 48, 68},
      {{3, 2}, 2, 128, 128, 64},
      {{3, 1}, 2, 64, 256, 40},
      {{3, 2}, 2, 64, 96, 192},  // hybrid base's head: two 96-column blocks, or 128 + a half-empty one
  };
  const double tol = 2e-5;
  // Every kernel variant on every case (kernels::GdrScanVariant): fp32 FMA in 8-warp and 16-warp
  // blocks, tensor cores in blocks of 32, 64, 96 and 128 columns, and the default's pick; a
  // tensor-core variant runs the 16-warp FMA kernel where the sizes do not allow it.
  const char* variant_names[] = {"8-warp FMA",  "16-warp FMA", "tensor-core 32-column", "tensor-core 64-column",
                                 "auto-width", "tensor-core 96-column", "tensor-core 128-column"};
  for (const int variant : {0, 1, 2, 3, 4, 5, 6}) {
    for (const Case& c : cases) {
      model::gdr_scan_variant(variant);
      int64_t N = 0;
      const auto plan = make_plan(c.chunk_counts, c.H, N);
      const int64_t R = N * c.H, S = plan.n_docs * c.H;
      auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
      const ScanInputs in = random_scan_inputs(c, R, S);
      const auto &W0 = in.W, &U0 = in.U, &K0 = in.Kd, &d0 = in.decay, &h00 = in.h0;
      auto g_hin = torch::randn({R, c.dk, c.dv}, opt), g_vn = torch::randn({R, c.C, c.dv}, opt);
      auto g_fin = torch::randn({S, c.dk, c.dv}, opt);
      struct Run {
        model::GdrScanResult out;
        std::vector<torch::Tensor> grads;
      };
      auto run = [&](bool kernel) {
        auto W = W0.clone().requires_grad_(true), U = U0.clone().requires_grad_(true);
        auto K = K0.clone().requires_grad_(true), d = d0.clone().requires_grad_(true);
        auto h0 = h00.clone().requires_grad_(true);
        Run r;
        r.out = kernel ? model::gdr_scan(W, U, K, d, h0, plan) : model::gdr_scan_reference(W, U, K, d, h0, plan);
        ((r.out.h_in * g_hin).sum() + (r.out.v_new * g_vn).sum() + (r.out.h_final * g_fin).sum()).backward();
        r.grads = {W.grad(), U.grad(), K.grad(), d.grad(), h0.grad()};
        return r;
      };
      const Run want = run(false), got = run(true);
      const std::string what = describe(c);
      const double e_hin = rel_norm_diff(got.out.h_in, want.out.h_in), e_vn = rel_norm_diff(got.out.v_new, want.out.v_new);
      const double e_fin = rel_norm_diff(got.out.h_final, want.out.h_final);
      EXPECT_LT(e_hin, tol) << what << ": h_in";
      EXPECT_LT(e_vn, tol) << what << ": v_new";
      EXPECT_LT(e_fin, tol) << what << ": h_final";
      const char* names[] = {"dW", "dU", "dKd", "ddecay", "dh0"};
      double worst = 0;
      for (size_t i = 0; i < got.grads.size(); ++i) {
        ASSERT_TRUE(got.grads[i].defined()) << what << ": " << names[i] << " missing";
        const double e = rel_norm_diff(got.grads[i], want.grads[i]);
        worst = std::max(worst, e);
        EXPECT_LT(e, tol) << what << ": " << names[i];
      }
      // The backward without autograd (what the chunk core's hand-written backward calls).
      const auto bw_want = model::gdr_scan_backward_reference(W0, K0, d0, g_hin, g_vn, g_fin, plan);
      const auto bw_got = model::gdr_scan_backward(W0, K0, d0, g_hin, g_vn, g_fin, plan);
      const double e_bw = std::max({rel_norm_diff(bw_got.dh_next, bw_want.dh_next), rel_norm_diff(bw_got.dU, bw_want.dU),
                                    rel_norm_diff(bw_got.dh0, bw_want.dh0)});
      EXPECT_LT(e_bw, tol) << what << ": gdr_scan_backward";
      // And the reference backward agrees with autograd through the reference forward.
      EXPECT_LT(rel_norm_diff(bw_want.dU, want.grads[1]), tol) << what << ": reference dU vs autograd";
      EXPECT_LT(rel_norm_diff(bw_want.dh0, want.grads[4]), tol) << what << ": reference dh0 vs autograd";
      std::printf("[gdr_scan] %s, %s blocks: fwd %.1e %.1e %.1e, worst grad %.1e, backward-only %.1e\n", what.c_str(),
                  variant_names[variant], e_hin, e_vn, e_fin, worst, e_bw);
    }
  }
  model::gdr_scan_variant(kernels::kGdrScanAuto);
}

// The whole chunked delta rule on the GPU (scan kernel inside) against the step-by-step reference
// in fp64 on the CPU, ragged documents and a given initial state: the kernel is wired in right.
// Both scan products: split TF32 within 1e-5; plain TF32 (model.gdn_scan_precision = "tf32")
// within 3e-3, below bf16's rounding of the inputs it is meant for (2⁻⁸ = 3.9e-3), and measurably
// less exact than split TF32 (at least 10×), so the mode is known to have taken effect; plain TF32
// with the saved states in bf16 within 6e-3, bf16's rounding (2⁻⁸ = 3.9e-3 at most per element)
// grown through the products those values feed (measured: o 1.8e-3, worst gradient 2.2e-3); and
// with the front's W, U, Kd, Qg and P in bf16 as well (how 16-bit training runs it) within 1e-2,
// the same rounding on twice as many of the values the products read. Then q, k and v in bf16 (the
// reference takes the same rounded values; dq, dk and dv come back in bf16), with the backward
// through the solve taking its fp32 operands split and rounded to TF32
// (model::gdr_tf32_chunk_products, the default): both within 1e-2, and different, so the TF32
// products are known to have taken effect; and q, k, v in fp16 (fp16 training: the kernels' fp16
// mma and their fp16 TF32 instances) within 1e-2.
TEST(GdrScanCuda, ChunkedRuleWithKernelMatchesStepByStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 911);
  const int64_t T = 300, H = 2, dk = 64, dv = 48;
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto q = torch::nn::functional::normalize(torch::randn({1, T, H, dk}, f64),
                                            torch::nn::functional::NormalizeFuncOptions().dim(-1));
  auto k = torch::nn::functional::normalize(torch::randn({1, T, H, dk}, f64),
                                            torch::nn::functional::NormalizeFuncOptions().dim(-1));
  auto v = torch::randn({1, T, H, dv}, f64);
  auto beta = torch::rand({1, T, H}, f64);
  auto g = -torch::rand({1, T, H}, f64) * 0.1;
  auto cu = torch::tensor({0, 17, 150, 151, 300}, torch::kInt64);
  auto h0 = torch::randn({4, H, dk, dv}, f64) * 0.1;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  // Gradients too: the chunk core's hand-written backward (with the reverse scan kernel) against
  // autograd through the step-by-step reference, for every input and the initial state.
  auto dO = torch::randn({1, T, H, dv}, f64), dH = torch::randn({4, H, dk, dv}, f64);
  // in16: q, k and v given in that 16-bit dtype (kFloat32: none), the reference on the same values.
  auto grads_of = [&](bool gpu, bool tf32_scan, torch::ScalarType in16 = torch::kFloat32) {
    std::vector<torch::Tensor> in{q, k, v, beta, g, h0};
    for (size_t i = 0; i < in.size(); ++i) {
      auto& t = in[i];
      const bool rounded = in16 != torch::kFloat32 && i < 3;  // q, k, v
      if (gpu) t = t.to(torch::kCUDA, rounded ? in16 : torch::kFloat32);
      else t = rounded ? t.to(in16).to(torch::kFloat64) : t.clone();
      t.requires_grad_(true);
    }
    const auto launches_before = model::gdr_scan_launch_counts();
    auto out = gpu ? model::gdr_forward_chunked(in[0], in[1], in[2], in[3], in[4], scale, in[5], cu, 64, tf32_scan)
                   : model::gdr_forward_ref(in[0], in[1], in[2], in[3], in[4], scale, in[5], cu);
    ((out.o * dO.to(out.o.device(), out.o.scalar_type())).sum() +
     (out.h * dH.to(out.h.device(), out.h.scalar_type())).sum())
        .backward();
    if (gpu) {  // one forward and one reverse scan, both in the mode asked for
      const auto launches = model::gdr_scan_launch_counts();
      EXPECT_EQ(launches.tf32 - launches_before.tf32, tf32_scan ? 2 : 0);
      EXPECT_EQ(launches.split_tf32 - launches_before.split_tf32, tf32_scan ? 0 : 2);
    }
    std::vector<torch::Tensor> res{out.o.detach().cpu(), out.h.detach().cpu()};
    for (auto& t : in) res.push_back(t.grad().cpu());
    return res;
  };
  const auto want = grads_of(false, false), want_bf16_inputs = grads_of(false, false, torch::kBFloat16);
  const auto want_fp16_inputs = grads_of(false, false, torch::kHalf);
  const char* names[] = {"o", "h", "dq", "dk", "dv", "dbeta", "dg", "dh0"};
  // Split TF32; plain TF32 with fp32 saved states; plain TF32 with the states and corrected values
  // saved in bf16 (the default under 16-bit training, GdrScanPlan::bf16_states), which adds bf16's
  // rounding (2⁻⁹ relative per element) to what those values feed: o and every gradient but h's.
  struct Mode {
    const char* name;
    bool tf32, bf16_states, bf16_front;
    double tol;
    torch::ScalarType in16 = torch::kFloat32;
    bool tf32_chunk = true;
  };
  const Mode modes[] = {{"split-tf32", false, false, false, 1e-5},
                        {"tf32", true, false, false, 3e-3},
                        {"tf32, bf16 states", true, true, false, 6e-3},
                        {"tf32, bf16 states and front", true, true, true, 1e-2},
                        {"tf32, bf16 inputs, split solve products", true, true, true, 1e-2, torch::kBFloat16, false},
                        {"tf32, bf16 inputs, tf32 solve products", true, true, true, 1e-2, torch::kBFloat16, true},
                        {"tf32, fp16 inputs, tf32 solve products", true, true, true, 1e-2, torch::kHalf, true}};
  constexpr int kModes = sizeof(modes) / sizeof(modes[0]);
  double worst_of[kModes] = {};
  std::vector<std::vector<torch::Tensor>> got_of(kModes);
  std::vector<torch::Tensor> o_of(kModes);
  for (int m = 0; m < kModes; ++m) {
    const Mode& mode = modes[m];
    model::gdr_bf16_states(mode.bf16_states);
    model::gdr_bf16_front(mode.bf16_front);
    model::gdr_tf32_chunk_products(mode.tf32_chunk);
    const auto got = grads_of(true, mode.tf32, mode.in16);
    const auto& ref = mode.in16 == torch::kBFloat16 ? want_bf16_inputs : mode.in16 == torch::kHalf ? want_fp16_inputs : want;
    got_of[m] = got;
    o_of[m] = got[0];
    double worst = 0, worst_grad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double e = rel_norm_diff(got[i], ref[i]);
      worst = std::max(worst, e);
      if (i >= 2) worst_grad = std::max(worst_grad, e);
      EXPECT_LT(e, mode.tol) << names[i] << " (" << mode.name << " scan)";
    }
    worst_of[m] = worst;
    std::printf("[gdr_scan] chunked (GPU fp32, %s scan) vs step-by-step (CPU fp64): o %.1e h %.1e, worst gradient %.1e\n",
                mode.name, rel_norm_diff(got[0], ref[0]), rel_norm_diff(got[1], ref[1]), worst_grad);
  }
  model::gdr_bf16_states(true);
  model::gdr_bf16_front(true);
  model::gdr_tf32_chunk_products(true);
  // dk reads the solve's gradient (dq does not).
  EXPECT_FALSE(torch::equal(got_of[5][3], got_of[4][3])) << "the solve's TF32 products did not take effect (dk)";
  EXPECT_GT(worst_of[1], 10 * worst_of[0]) << "the tf32 scan should be measurably less exact than split TF32";
  EXPECT_FALSE(torch::equal(o_of[3], o_of[2])) << "the front's bf16 outputs did not take effect";
}

// The scan's bf16 outputs (GdrScanPlan::bf16_states) are its fp32 outputs rounded to bf16, bit for
// bit: the same kernel with the same arithmetic, rounding only as it stores h_in and v_new (the
// running state, and so h_final, stay fp32 and equal). Dense and ragged plans at the model's head
// sizes, in every tensor-core block width; where a variant runs an FMA kernel, or the products
// are split TF32, the outputs stay fp32.
TEST(GdrScanCuda, Bf16StatesAreTheFp32StatesRounded) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 915);
  for (const int variant : kScanVariants) {
    model::gdr_scan_variant(variant);
    for (const Case& c : kModelHeadCases) {
      int64_t N = 0;
      auto plan = make_plan(c.chunk_counts, c.H, N);
      const int64_t R = N * c.H, S = plan.n_docs * c.H;
      const ScanInputs in = random_scan_inputs(c, R, S);
      const auto &W = in.W, &U = in.U, &K = in.Kd, &d = in.decay, &h0 = in.h0;
      plan.tf32_products = true;
      plan.bf16_states = false;
      const auto f32 = model::gdr_scan(W, U, K, d, h0, plan);
      plan.bf16_states = true;
      const auto b16 = model::gdr_scan(W, U, K, d, h0, plan);
      const std::string what = describe(c) + ", variant " + std::to_string(variant);
      ASSERT_EQ(f32.h_in.scalar_type(), torch::kFloat32) << what;
      if (variant == kernels::kGdrScanSimt16) {
        EXPECT_EQ(b16.h_in.scalar_type(), torch::kFloat32) << what << ": the FMA kernel writes fp32";
        continue;
      }
      ASSERT_EQ(b16.h_in.scalar_type(), torch::kBFloat16) << what;
      ASSERT_EQ(b16.v_new.scalar_type(), torch::kBFloat16) << what;
      EXPECT_TRUE(torch::equal(b16.h_in, f32.h_in.to(torch::kBFloat16))) << what << ": h_in";
      EXPECT_TRUE(torch::equal(b16.v_new, f32.v_new.to(torch::kBFloat16))) << what << ": v_new";
      EXPECT_TRUE(torch::equal(b16.h_final, f32.h_final)) << what << ": h_final";
      // Split TF32 products keep fp32 outputs.
      plan.tf32_products = false;
      EXPECT_EQ(model::gdr_scan(W, U, K, d, h0, plan).h_in.scalar_type(), torch::kFloat32) << what;
    }
  }
  model::gdr_scan_variant(kernels::kGdrScanAuto);
}

// W, U and Kd given in bf16 (the chunk core's fused front writes them so under 16-bit training):
// the kernel stages them as bf16 and widens them exactly, so its results equal those from fp32
// tensors holding the same values, bit for bit (a bf16 value is a TF32 value, and the TF32 products
// round nothing), forward (bf16 outputs) and backward (bf16 W and Kd, fp32 gradients), in every
// tensor-core block width and with no gradient reaching h_in. The FMA kernel reads fp32 only:
// there the inputs are widened first, with the same result. The forward's TF32 products, that is:
// its bf16 products (model::gdr_bf16_forward_scan_products) are tested below.
TEST(GdrScanCuda, Bf16InputsMatchFp32InputsOfTheSameValues) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const ScanSwitchesRestored restore;
  model::gdr_bf16_forward_scan_products(false);
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 919);
  const auto bf16 = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
  const auto widened = [](const torch::Tensor& x) { return x.to(torch::kBFloat16).to(torch::kFloat32); };
  for (const int variant : kScanVariants) {
    model::gdr_scan_variant(variant);
    for (const Case& c : kModelHeadCases) {
      int64_t N = 0;
      auto plan = make_plan(c.chunk_counts, c.H, N);
      plan.tf32_products = true;
      plan.bf16_states = true;
      const int64_t R = N * c.H, S = plan.n_docs * c.H;
      const ScanInputs in = random_scan_inputs(c, R, S);
      const std::string what = describe(c) + ", variant " + std::to_string(variant);
      const bool takes = model::gdr_scan_takes_bf16_inputs(plan, c.C, c.dk, c.dv);
      EXPECT_EQ(takes, variant != kernels::kGdrScanSimt16) << what;
      const auto want = model::gdr_scan(widened(in.W), widened(in.U), widened(in.Kd), in.decay, in.h0, plan);
      const auto got = model::gdr_scan(bf16(in.W), bf16(in.U), bf16(in.Kd), in.decay, in.h0, plan);
      ASSERT_EQ(got.h_in.scalar_type(), want.h_in.scalar_type()) << what;
      EXPECT_TRUE(torch::equal(got.h_in, want.h_in)) << what << ": h_in";
      EXPECT_TRUE(torch::equal(got.v_new, want.v_new)) << what << ": v_new";
      EXPECT_TRUE(torch::equal(got.h_final, want.h_final)) << what << ": h_final";
      // The reverse scan, with and without a gradient reaching h_in.
      auto opt = in.U.options();
      const auto d_vnew = torch::randn({R, c.C, c.dv}, opt), d_hin = torch::randn({R, c.dk, c.dv}, opt);
      const auto d_hfinal = torch::randn({S, c.dk, c.dv}, opt);
      for (const bool with_hin : {true, false}) {
        const auto dh = with_hin ? d_hin : torch::Tensor();
        const auto bw = model::gdr_scan_backward(widened(in.W), widened(in.Kd), in.decay, dh, d_vnew, d_hfinal, plan);
        const auto bg = model::gdr_scan_backward(bf16(in.W), bf16(in.Kd), in.decay, dh, d_vnew, d_hfinal, plan);
        const std::string bwhat = what + (with_hin ? ", backward" : ", backward without d_hin");
        EXPECT_TRUE(torch::equal(bg.dh_next, bw.dh_next)) << bwhat << ": dh_next";
        EXPECT_TRUE(torch::equal(bg.dU, bw.dU)) << bwhat << ": dU";
        EXPECT_TRUE(torch::equal(bg.dh0, bw.dh0)) << bwhat << ": dh0";
      }
    }
  }
}

// The reverse scan fed by the output's gradient (model::gdr_scan_backward_from_output_grad): its
// fused kernel, which takes d_vnew = s Pmᵀ dO and d_hin = s Qgᵀ dO inside the scan, against the
// same function with the fusion off (the two products, then the scan kernel), on dense and ragged
// plans at the model's head sizes, each tensor-core width, dO read in chunk order and through a row
// map with rows of zeros (−1), with and without a gradient reaching the final state; besides, the
// kernel's other instances (C 128: two row tiles of y per warp, in 32- and 64-column blocks; dk
// 256: two state-row tiles, in 32-column blocks), and sizes whose shared memory it cannot take (C
// 128 with dk 256), where the function takes the products. Both read the
// same bf16 W, Kd, Pm and Qg and round dO to TF32 for its products; they differ in summation order,
// which moves y's rounding to TF32 in the scan's products now and then, and a moved rounding
// grows along the chain: dU and dh0 measured up to 1.4e-4 (the nine-chunk document), bound 5e-4.
// Each of them is further than that from an fp64 ATen reference, by the TF32 products' own error
// (measured 5.4e-4 for both), bound 2e-3. The fused kernel hands dh_next back rounded to bf16
// (2⁻⁹ relative at most, about 1.1e-3 over a tensor), bound 3e-3 against both. The FMA kernel has
// no fused form: there the function takes the products.
TEST(GdrScanCuda, FusedOutputGradBackwardMatchesProductsThenScan) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 929);
  double worst_kernel = 0, worst_ref = 0, worst_state = 0;
  // Each case, and the fixed block widths the fused form takes it in (kernels::gdr_scan_mma_supports:
  // 96 and 128 columns only for C ≤ 64 and dk ≤ 128, and each width's shared memory); the default
  // takes it where any width does.
  struct FusedCase {
    Case c;
    std::vector<int> widths;
  };
  std::vector<FusedCase> cases;
  for (const Case& c : kModelHeadCases) cases.push_back({c, {32, 64, 96, 128}});
  cases.push_back({{{3, 2}, 2, 128, 64, 72}, {32, 64}});
  cases.push_back({{{3, 1}, 2, 64, 256, 40}, {32}});
  cases.push_back({{{2, 2}, 1, 128, 256, 16}, {}});
  for (const int variant : kScanVariants) {
    model::gdr_scan_variant(variant);
    for (const FusedCase& fc : cases) {
      const Case& c = fc.c;
      const FusedScanCase f(c);
      for (const bool mapped : {false, true}) {
        for (const bool with_final : {true, false}) {
          const auto og = f.output_grad(mapped, with_final, 37);
          const std::string what = describe(c) + ", variant " + std::to_string(variant) +
                                   (mapped ? ", row map" : ", chunk rows") + (with_final ? "" : ", no final gradient");
          const bool takes = model::gdr_scan_backward_takes_output_grad(f.W, f.Kd, f.Pm, f.Qg, og.dO, f.plan);
          const int width = variant == kernels::kGdrScanTensorCores32    ? 32
                            : variant == kernels::kGdrScanTensorCores64  ? 64
                            : variant == kernels::kGdrScanTensorCores96  ? 96
                            : variant == kernels::kGdrScanTensorCores128 ? 128
                                                                         : 0;
          const bool listed = std::find(fc.widths.begin(), fc.widths.end(), width) != fc.widths.end();
          EXPECT_EQ(takes, variant == kernels::kGdrScanAuto ? !fc.widths.empty() : listed) << what;
          const int64_t launches = model::gdr_scan_fused_backward_launches();
          const auto got = f.run(og);
          EXPECT_EQ(model::gdr_scan_fused_backward_launches() - launches, takes ? 1 : 0) << what;
          if (takes) {
            // dU in bf16 (the fused backward's 16-bit mode): the same sums, rounded as stored; the
            // state gradients unchanged.
            const auto got16 = f.run(og, true);
            EXPECT_EQ(got16.dU.scalar_type(), torch::kBFloat16) << what;
            EXPECT_TRUE(torch::equal(got16.dU, got.dU.to(torch::kBFloat16))) << what << ": bf16 dU";
            EXPECT_TRUE(torch::equal(got16.dh_next, got.dh_next) && torch::equal(got16.dh0, got.dh0)) << what;
          }
          model::gdr_scan_fuse_output_grads(false);
          EXPECT_FALSE(model::gdr_scan_backward_takes_output_grad(f.W, f.Kd, f.Pm, f.Qg, og.dO, f.plan)) << what;
          const auto want = f.run(og);
          model::gdr_scan_fuse_output_grads(true);
          const auto ref = f.reference(og);
          EXPECT_EQ(got.dh_next.scalar_type(), takes ? torch::kBFloat16 : torch::kFloat32) << what;
          const double e_kernel = std::max(rel_norm_diff(got.dU, want.dU), rel_norm_diff(got.dh0, want.dh0));
          const double e_ref = std::max({rel_norm_diff(got.dU, ref.dU), rel_norm_diff(got.dh0, ref.dh0),
                                         rel_norm_diff(want.dU, ref.dU), rel_norm_diff(want.dh0, ref.dh0)});
          const double e_state = std::max(rel_norm_diff(got.dh_next, want.dh_next), rel_norm_diff(got.dh_next, ref.dh_next));
          EXPECT_LT(e_kernel, 5e-4) << what << ": fused against products then scan";
          EXPECT_LT(e_ref, 2e-3) << what << ": against the fp64 reference";
          EXPECT_LT(e_state, 3e-3) << what << ": dh_next";
          worst_kernel = std::max(worst_kernel, e_kernel);
          worst_ref = std::max(worst_ref, e_ref);
          worst_state = std::max(worst_state, e_state);
        }
      }
    }
  }
  model::gdr_scan_variant(kernels::kGdrScanAuto);
  std::printf("[gdr_scan fused backward] worst: dU and dh0 against products then scan %.1e, against fp64 %.1e; bf16 "
              "dh_next %.1e\n",
              worst_kernel, worst_ref, worst_state);
}

// The fused backward scan with bf16 products (kernels/gdr_scan_bf16.cu) against its TF32 form and
// fp64, at every block width that takes it and where it is refused (C or dk too large), and a bf16
// dO against an fp32 one of the same values (the same bits). Rounding
// dO, the state gradient and dU to bf16 as operands (2⁻⁹ relative) gave gradients at most 4.9e-3
// from fp64 on these inputs on an H100 (the TF32 products 1.8e-3), so the bound is 8e-3; a fragment
// read from the wrong place would give errors of order one. The block kernel's (the warp-column
// kernel off: it takes only a bf16 dO, so the bf16 and fp32 dO below would run different kernels;
// WarpColumnReverseScanMatchesFp64 tests it).
TEST(GdrScanCuda, Bf16ProductsReverseScanStaysCloseToFp64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const WarpColumnsRestored restore;
  kernels::gdr_scan_warp_columns(false);
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1187);
  double worst = 0, worst_tf32 = 0;
  for (const int variant : kTensorCoreVariants) {
    model::gdr_scan_variant(variant);
    for (const Bf16Case& bc : bf16_product_cases()) {
      const Case& c = bc.c;
      const FusedScanCase f(c);
      // dO through a row map for odd document counts; a final gradient for even H.
      const auto og = f.output_grad(c.chunk_counts.size() % 2 == 1, c.H % 2 == 0, 11);
      const std::string what = describe(c) + ", variant " + std::to_string(variant);
      if (!model::gdr_scan_backward_takes_output_grad(f.W, f.Kd, f.Pm, f.Qg, og.dO, f.plan)) continue;  // no fused width
      const auto tf32 = f.run(og, false, false);
      const int64_t before = model::gdr_scan_bf16_product_launches();
      const auto got = f.run(og, false, true);
      const bool taken = model::gdr_scan_bf16_product_launches() - before == 1;
      EXPECT_EQ(taken, bc.taken) << what;
      if (!taken) {
        EXPECT_TRUE(torch::equal(got.dU, tf32.dU) && torch::equal(got.dh0, tf32.dh0)) << what << ": the TF32 form";
        continue;
      }
      // dU rounded to bf16 as written: the same sums.
      const auto got16 = f.run(og, true, true);
      EXPECT_TRUE(torch::equal(got16.dU, got.dU.to(torch::kBFloat16))) << what << ": bf16 dU";
      EXPECT_TRUE(torch::equal(got16.dh_next, got.dh_next) && torch::equal(got16.dh0, got.dh0)) << what;
      // dO in bf16 (the 16-bit path's, staged as it comes): the same bits as an fp32 dO of its values.
      auto og_bf16 = og, og_values = og;
      og_bf16.dO = og.dO.to(torch::kBFloat16);
      og_values.dO = og_bf16.dO.to(torch::kFloat32);
      const int64_t bf16_dO_before = model::gdr_scan_bf16_output_grad_launches();
      const auto from_bf16 = f.run(og_bf16, true, true);
      EXPECT_EQ(model::gdr_scan_bf16_output_grad_launches() - bf16_dO_before, 1) << what << ": bf16 dO staged as it is";
      const auto from_values = f.run(og_values, true, true);
      EXPECT_TRUE(torch::equal(from_bf16.dU, from_values.dU) && torch::equal(from_bf16.dh_next, from_values.dh_next) &&
                  torch::equal(from_bf16.dh0, from_values.dh0))
          << what << ": bf16 dO";
      const auto ref = f.reference(og);
      const double e = std::max({rel_norm_diff(got.dU, ref.dU), rel_norm_diff(got.dh0, ref.dh0),
                                 rel_norm_diff(got.dh_next, ref.dh_next)});
      const double e_tf32 = std::max({rel_norm_diff(tf32.dU, ref.dU), rel_norm_diff(tf32.dh0, ref.dh0),
                                      rel_norm_diff(tf32.dh_next, ref.dh_next)});
      EXPECT_LT(e, 8e-3) << what << ": bf16 products against fp64";
      worst = std::max(worst, e);
      worst_tf32 = std::max(worst_tf32, e_tf32);
    }
  }
  model::gdr_scan_variant(kernels::kGdrScanAuto);
  std::printf("[gdr_scan bf16 products] worst against fp64: %.1e (TF32 products: %.1e)\n", worst, worst_tf32);
}

// The fused backward form with each warp owning 16 columns of the state gradient in registers
// (kernels/gdr_scan_warps.cu: the automatic variant's kernel for a bf16 dO and bf16 dU at C 64, dk
// 96 or 128), through the model's op: against fp64 (bound 8e-3, as the block kernel's bf16 products
// above; a fragment in the wrong place gives errors of order one) and against the block kernel on
// the same inputs (which rounds the same operands, its sums in another order: 8e-3 as well), at
// the model's head sizes and a value width of 48 (one 64-column block with a warp idle), each width
// forced (64, 96, 128 columns), dO through a row map and a final gradient in some cases; each launch
// counted.
TEST(GdrScanCuda, WarpColumnReverseScanMatchesFp64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const WarpColumnsRestored restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1223);
  const Case cases[] = {{{4, 4}, 3, 64, 128, 128},
                        {{9, 1, 3, 3, 2}, 2, 64, 96, 192},
                        {{3, 2}, 2, 64, 128, 256},
                        {{3, 0, 1}, 2, 64, 96, 48}};
  double worst = 0, worst_vs_block = 0;
  int launches = 0;
  for (const Case& c : cases) {
    const FusedScanCase f(c);
    auto og = f.output_grad(c.chunk_counts.size() % 2 == 1, c.H % 2 == 0, 11);
    og.dO = og.dO.to(torch::kBFloat16);
    const auto ref = f.reference(og);
    kernels::gdr_scan_warp_columns(false);
    const auto block = f.run(og, true, true);
    kernels::gdr_scan_warp_columns(true);
    for (const int width : {0, 64, 96, 128}) {
      kernels::gdr_scan_warp_width(width);
      const std::string what = describe(c) + ", width " + std::to_string(width);
      const int64_t before = kernels::gdr_scan_warp_launches();
      const auto got = f.run(og, true, true);
      EXPECT_EQ(kernels::gdr_scan_warp_launches() - before, 1) << what << ": the warp-column kernel not taken";
      const auto err = [](const model::GdrScanGrads& x, const model::GdrScanGrads& y) {
        return std::max({rel_norm_diff(x.dU.to(torch::kFloat64), y.dU.to(torch::kFloat64)),
                         rel_norm_diff(x.dh0.to(torch::kFloat64), y.dh0.to(torch::kFloat64)),
                         rel_norm_diff(x.dh_next.to(torch::kFloat64), y.dh_next.to(torch::kFloat64))});
      };
      const double e = err(got, ref), d = err(got, block);
      EXPECT_LT(e, 8e-3) << what << ": against fp64";
      EXPECT_LT(d, 8e-3) << what << ": against the block kernel";
      worst = std::max(worst, e);
      worst_vs_block = std::max(worst_vs_block, d);
      ++launches;
    }
  }
  std::printf("[gdr_scan reverse, warp columns] %d launches, worst against fp64 %.1e, against the block kernel %.1e\n",
              launches, worst, worst_vs_block);
}

// The forward scan of bf16 inputs and states with its two products as bf16 mma
// (model::gdr_bf16_forward_scan_products, the default on the 16-bit training path): the running
// state and y rounded to bf16 as operands, sums in fp32. Against the fp64 reference on the bf16
// values, beside the TF32 products' own distance from it, at the model's head sizes and each
// tensor-core width; the smallest sizes it takes; C > 64 and dk > 128, which it does not take (the
// TF32 kernel runs, the same to the bit). h_in and v_new come back in bf16 either way (2⁻⁹
// relative at most, about 1.1e-3 over a tensor), bound 8e-3 as for the reverse scan's bf16
// products. gdr_scan refuses bf16 products on the forward's fp32 form and at sizes the bf16 form
// does not take, and writes nothing.
TEST(GdrScanCuda, Bf16ProductsForwardScanStaysCloseToFp64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const ScanSwitchesRestored restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1201);
  const auto bf16 = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
  const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kFloat64); };
  double worst = 0, worst_tf32 = 0;
  for (const int variant : kTensorCoreVariants) {
    model::gdr_scan_variant(variant);
    for (const Bf16Case& bc : bf16_product_cases()) {
      const Case& c = bc.c;
      int64_t N = 0;
      auto plan = make_plan(c.chunk_counts, c.H, N);
      plan.tf32_products = true;
      plan.bf16_states = true;
      const int64_t R = N * c.H, S = plan.n_docs * c.H;
      const ScanInputs in = random_scan_inputs(c, R, S);
      const auto W = bf16(in.W), U = bf16(in.U), Kd = bf16(in.Kd);
      const std::string what = describe(c) + ", variant " + std::to_string(variant);
      if (!model::gdr_scan_takes_bf16_inputs(plan, c.C, c.dk, c.dv)) continue;  // no tensor-core width
      model::gdr_bf16_forward_scan_products(false);
      const auto tf32 = model::gdr_scan(W, U, Kd, in.decay, in.h0, plan);
      model::gdr_bf16_forward_scan_products(true);
      const int64_t before = model::gdr_scan_bf16_forward_launches();
      const auto got = model::gdr_scan(W, U, Kd, in.decay, in.h0, plan);
      const bool taken = model::gdr_scan_bf16_forward_launches() - before == 1;
      EXPECT_EQ(taken, bc.taken) << what;
      if (!taken) {
        EXPECT_TRUE(torch::equal(got.h_in, tf32.h_in) && torch::equal(got.v_new, tf32.v_new) &&
                    torch::equal(got.h_final, tf32.h_final))
            << what << ": the TF32 form";
        continue;
      }
      ASSERT_EQ(got.h_in.scalar_type(), torch::kBFloat16) << what;
      ASSERT_EQ(got.v_new.scalar_type(), torch::kBFloat16) << what;
      ASSERT_EQ(got.h_final.scalar_type(), torch::kFloat32) << what;
      const auto ref = model::gdr_scan_reference(f64(W), f64(U), f64(Kd), f64(in.decay), f64(in.h0), plan);
      const auto error = [&](const model::GdrScanResult& r) {
        return std::max({rel_norm_diff(f64(r.h_in), ref.h_in), rel_norm_diff(f64(r.v_new), ref.v_new),
                         rel_norm_diff(f64(r.h_final), ref.h_final)});
      };
      const double e = error(got), e_tf32 = error(tf32);
      EXPECT_LT(e, 8e-3) << what << ": bf16 products against fp64";
      EXPECT_GT(rel_norm_diff(got.h_final, tf32.h_final), 0.0) << what << ": the same as the TF32 products";
      worst = std::max(worst, e);
      worst_tf32 = std::max(worst_tf32, e_tf32);
    }
  }
  model::gdr_scan_variant(kernels::kGdrScanAuto);  // the refusals below take the automatic width
  std::printf("[gdr_scan forward bf16 products] worst against fp64: %.1e (TF32 products: %.1e)\n", worst, worst_tf32);

  // Launches gdr_scan can only refuse: bf16 products on the forward's fp32 form (fp32 inputs and
  // outputs, sizes the bf16 form takes), and on its bf16 form at C 128, which the bf16 form does not
  // take. Each is refused and writes nothing; the same arguments then run with TF32 products.
  const auto refused_then_runs = [](const Case& c, bool bf16_form) {
    int64_t N = 0;
    const auto plan = make_plan(c.chunk_counts, c.H, N);
    const int64_t R = N * c.H, S = plan.n_docs * c.H;
    const ScanInputs in = random_scan_inputs(c, R, S);
    const auto io = bf16_form ? torch::kBFloat16 : torch::kFloat32;
    const auto W = in.W.to(io), U = in.U.to(io), Kd = in.Kd.to(io);
    const auto opt = in.U.options();
    auto out_state = torch::full({R, c.dk, c.dv}, 7.f, opt.dtype(io));
    auto out_y = torch::full({R, c.C, c.dv}, 7.f, opt.dtype(io));
    auto fin = torch::full({S, c.dk, c.dv}, 7.f, opt);
    std::vector<int32_t> off(plan.step_off.begin(), plan.step_off.end()), nch(static_cast<size_t>(plan.n_docs), 0);
    for (const int64_t cnt : plan.step_count) {
      for (int64_t k = 0; k < cnt; ++k) ++nch[static_cast<size_t>(k)];
    }
    const auto i32 = torch::TensorOptions().dtype(torch::kInt32);
    const auto step_off = torch::tensor(off, i32).to(torch::kCUDA), n_chunks = torch::tensor(nch, i32).to(torch::kCUDA);
    kernels::GdrScanArgs a;
    const auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    if (bf16_form) {
      a.A_bf16 = bits(U);
      a.P_bf16 = bits(W);
      a.Q_bf16 = bits(Kd);
      a.out_state_bf16 = bits(out_state);
      a.out_y_bf16 = bits(out_y);
    } else {
      a.A = U.data_ptr<float>();
      a.P = W.data_ptr<float>();
      a.Q = Kd.data_ptr<float>();
      a.out_state = out_state.data_ptr<float>();
      a.out_y = out_y.data_ptr<float>();
    }
    a.decay = in.decay.data_ptr<float>();
    a.final_state = fin.data_ptr<float>();
    a.step_off = step_off.data_ptr<int32_t>();
    a.n_chunks = n_chunks.data_ptr<int32_t>();
    a.tf32x3 = false;
    a.n_docs = plan.n_docs;
    a.H = c.H;
    a.C = c.C;
    a.dk = c.dk;
    a.dv = c.dv;
    const std::string what = describe(c) + (bf16_form ? ", bf16 form" : ", fp32 form");
    a.bf16_products = true;
    EXPECT_NE(kernels::gdr_scan(a, c10::cuda::getCurrentCUDAStream().stream()), 0) << what << ": bf16 products taken";
    torch::cuda::synchronize();
    EXPECT_TRUE((out_state == 7.f).all().item<bool>() && (out_y == 7.f).all().item<bool>() &&
                (fin == 7.f).all().item<bool>())
        << what << ": a refused launch wrote";
    a.bf16_products = false;
    EXPECT_EQ(kernels::gdr_scan(a, c10::cuda::getCurrentCUDAStream().stream()), 0) << what << ": TF32 products";
    torch::cuda::synchronize();
    EXPECT_FALSE((fin == 7.f).all().item<bool>()) << what << ": TF32 products wrote nothing";
  };
  refused_then_runs(kModelHeadCases[0], false);
  refused_then_runs({{3, 2}, 2, 128, 64, 72}, true);
}

// The scan's recurrence (kernels/gdr_scan.h) in fp64 on the CPU for either direction and any
// signs, straight from its definition: per document and head, its chunks in order (or last first),
// h_in = S, y = A + sign_p P S, S = decay S + sign_q Qᵀ y; final = S, the initial state (or zero)
// for a document of no chunks. Inputs and init (undefined: zero) fp64 on the CPU.
struct ScanRecurrence {
  torch::Tensor state, y, fin;
};
ScanRecurrence scan_recurrence_fp64(const torch::Tensor& P, const torch::Tensor& A, const torch::Tensor& Q,
                                    const torch::Tensor& decay, const torch::Tensor& init, const Case& c,
                                    const model::GdrScanPlan& plan, bool reverse, double sign_p, double sign_q) {
  std::vector<int64_t> counts(c.chunk_counts);
  std::sort(counts.begin(), counts.end(), std::greater<int64_t>());  // the plan's sorted document order
  const int64_t R = A.size(0), S = plan.n_docs * c.H;
  ScanRecurrence out{torch::zeros({R, c.dk, c.dv}, A.options()), torch::zeros({R, c.C, c.dv}, A.options()),
                     torch::zeros({S, c.dk, c.dv}, A.options())};
  for (int64_t d = 0; d < plan.n_docs; ++d) {
    const int64_t n = counts[static_cast<size_t>(d)];
    for (int64_t h = 0; h < c.H; ++h) {
      auto state = init.defined() ? init[d * c.H + h].clone() : torch::zeros({c.dk, c.dv}, A.options());
      for (int64_t step = 0; step < n; ++step) {
        const int64_t m = reverse ? n - 1 - step : step;
        const int64_t r = (plan.step_off[static_cast<size_t>(m)] + d) * c.H + h;
        out.state[r].copy_(state);
        const auto y = A[r] + sign_p * P[r].mm(state);
        out.y[r].copy_(y);
        state = decay[r].item<double>() * state + sign_q * Q[r].t().mm(y);
      }
      out.fin[d * c.H + h].copy_(state);
    }
  }
  return out;
}

// One launch of the forward's bf16 form (GdrScanArgs::bf16_products) on case c's plan: bf16 W, U
// and Kd in, the outputs filled with 7 first, in either direction with both products' signs flipped
// (sign −1) or not, with an initial state or none; against the fp64 recurrence on the same bf16
// values (the largest of the state's, y's and the final state's relative norm errors).
struct ForwardBf16Scan {
  Case c;
  model::GdrScanPlan plan;
  int64_t R = 0, S = 0;
  ScanInputs in;
  torch::Tensor W, U, Kd, step_off, n_chunks;
  // For the chunk output (GdrScanArgs::out_o_bf16): P zero above its diagonal, Qg, and the scale.
  torch::Tensor P, Qg;
  static constexpr double kOutScale = 0.3;

  explicit ForwardBf16Scan(const Case& cs) : c(cs) {
    int64_t N = 0;
    plan = make_plan(c.chunk_counts, c.H, N);
    R = N * c.H;
    S = plan.n_docs * c.H;
    in = random_scan_inputs(c, R, S);
    W = in.W.to(torch::kBFloat16), U = in.U.to(torch::kBFloat16), Kd = in.Kd.to(torch::kBFloat16);
    std::vector<int32_t> off(plan.step_off.begin(), plan.step_off.end()), nch(static_cast<size_t>(plan.n_docs), 0);
    for (const int64_t cnt : plan.step_count) {
      for (int64_t k = 0; k < cnt; ++k) ++nch[static_cast<size_t>(k)];
    }
    const auto i32 = torch::TensorOptions().dtype(torch::kInt32);
    step_off = torch::tensor(off, i32).to(torch::kCUDA), n_chunks = torch::tensor(nch, i32).to(torch::kCUDA);
    P = (torch::randn({R, c.C, c.C}, in.U.options()).tril() / std::sqrt(static_cast<double>(c.C))).to(torch::kBFloat16);
    Qg = (torch::randn({R, c.C, c.dk}, in.U.options()) / std::sqrt(static_cast<double>(c.dk))).to(torch::kBFloat16);
  }

  struct Out {
    torch::Tensor state, y, fin, o;  // o: the chunk output where attach_output set it
    kernels::GdrScanArgs a;
  };
  // Asks the launch for the chunk output too (filled with 7 first).
  void attach_output(Out& o) const {
    o.o = torch::full({R, c.C, c.dv}, 7.f, in.U.options().dtype(torch::kBFloat16));
    o.a.o_P_bf16 = reinterpret_cast<const uint16_t*>(P.data_ptr());
    o.a.o_Qg_bf16 = reinterpret_cast<const uint16_t*>(Qg.data_ptr());
    o.a.out_o_bf16 = reinterpret_cast<uint16_t*>(o.o.data_ptr());
    o.a.out_scale = static_cast<float>(kOutScale);
  }
  Out prepare(int variant, bool reverse, float sign, bool with_init) const {
    const auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    const auto opt = in.U.options();
    Out o{torch::full({R, c.dk, c.dv}, 7.f, opt.dtype(torch::kBFloat16)),
          torch::full({R, c.C, c.dv}, 7.f, opt.dtype(torch::kBFloat16)), torch::full({S, c.dk, c.dv}, 7.f, opt), {},
          {}};
    kernels::GdrScanArgs& a = o.a;
    a.A_bf16 = bits(U);
    a.P_bf16 = bits(W);
    a.Q_bf16 = bits(Kd);
    a.out_state_bf16 = bits(o.state);
    a.out_y_bf16 = bits(o.y);
    a.decay = in.decay.data_ptr<float>();
    a.init = with_init ? in.h0.data_ptr<float>() : nullptr;
    a.final_state = o.fin.data_ptr<float>();
    a.step_off = step_off.data_ptr<int32_t>();
    a.n_chunks = n_chunks.data_ptr<int32_t>();
    a.tf32x3 = false;
    a.bf16_products = true;
    a.variant = variant;
    a.reverse = reverse;
    a.sign_p = -sign;
    a.sign_q = sign;
    a.n_docs = plan.n_docs;
    a.H = c.H;
    a.C = c.C;
    a.dk = c.dk;
    a.dv = c.dv;
    return o;
  }
  // With the chunk output, *o_error gets its error against s (P y + Qg state) from the fp64 recurrence.
  double error(const Out& o, bool reverse, float sign, bool with_init, double* o_error = nullptr) const {
    const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kCPU, torch::kFloat64); };
    const auto ref = scan_recurrence_fp64(f64(W), f64(U), f64(Kd), f64(in.decay),
                                          with_init ? f64(in.h0) : torch::Tensor(), c, plan, reverse, -sign, sign);
    if (o_error != nullptr && o.o.defined()) {
      const auto o_ref = kOutScale * (torch::bmm(f64(P), ref.y) + torch::bmm(f64(Qg), ref.state));
      *o_error = rel_norm_diff(f64(o.o), o_ref);
    }
    return std::max({rel_norm_diff(f64(o.state), ref.state), rel_norm_diff(f64(o.y), ref.y),
                     rel_norm_diff(f64(o.fin), ref.fin)});
  }
  static std::string what(const Case& c, bool reverse, float sign, bool with_init) {
    return describe(c) + (reverse ? ", reverse" : "") + (sign < 0 ? ", signs flipped" : "") +
           (with_init ? "" : ", no initial state");
  }
};

// The forward bf16 scan (GdrScanArgs::bf16_products on the forward's bf16 form) at the kernel's
// own interface, in what the model's forward never asks of it: the reverse direction, both signs
// of each product flipped, no initial state, and a document of no chunks beside documents of one
// and two; against the recurrence in fp64 on the same bf16 values, bound 8e-3 as for the model's
// direction above (the state and y rounded to bf16 as operands). A fragment or a chunk row taken
// from the wrong step gives errors of order one. Every tensor-core width of the block kernel (the
// warp-column kernel off, kernels::gdr_scan_warp_columns: the next test has it); the final states of
// all documents written (filled with 7 before).
TEST(GdrScanCuda, Bf16ForwardScanTakesEitherDirectionAndSign) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const WarpColumnsRestored restore;
  kernels::gdr_scan_warp_columns(false);
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1213);
  const std::vector<Case> cases = {{{5, 0, 1, 2}, 2, 64, 96, 192},  // hybrid base's head sizes
                                   {{3, 0, 2}, 2, 64, 128, 128},
                                   {{2, 5}, 2, 16, 16, 8}};
  double worst = 0;
  int compared = 0;
  for (const Case& c : cases) {
    const int compared_before = compared;
    const ForwardBf16Scan run(c);
    for (const int variant : kTensorCoreVariants) {
      for (const bool reverse : {false, true}) {
        for (const float sign : {1.f, -1.f}) {
          for (const bool with_init : {true, false}) {
            auto o = run.prepare(variant, reverse, sign, with_init);
            const std::string what = ForwardBf16Scan::what(c, reverse, sign, with_init) + ", variant " +
                                     std::to_string(variant);
            if (kernels::gdr_scan_forward_bf16_width(o.a) == 0) continue;  // no bf16 width at this fixed variant
            const int64_t warp_launches = kernels::gdr_scan_warp_launches();
            ASSERT_EQ(kernels::gdr_scan(o.a, c10::cuda::getCurrentCUDAStream().stream()), 0) << what;
            EXPECT_EQ(kernels::gdr_scan_warp_launches(), warp_launches) << what << ": the warp-column kernel ran";
            const double e = run.error(o, reverse, sign, with_init);
            EXPECT_LT(e, 8e-3) << what << ": against the fp64 recurrence";
            EXPECT_FALSE((o.fin == 7.f).any().item<bool>()) << what << ": a final state left unwritten";
            worst = std::max(worst, e);
            ++compared;
          }
        }
      }
    }
    // At least the automatic width in both directions, both signs, with and without h0.
    EXPECT_GE(compared - compared_before, 2 * 2 * 2) << describe(c) << ": the bf16 forward scan ran too few launches";
  }
  std::printf("[gdr_scan forward bf16, either direction and sign] %d launches, worst against fp64 %.1e\n", compared,
              worst);
}

// The forward bf16 scan with each warp owning 16 state columns in registers
// (kernels/gdr_scan_warps.cu, the automatic variant's kernel where it takes the sizes): against the
// fp64 recurrence as above (bound 8e-3; a fragment in the wrong place gives errors of order one),
// in both directions and signs, with and without an initial state, a document of no chunks beside
// others; each block width (64, 96, 128 columns, forced) on the model's head sizes and on a value
// width of 48 (one block of 64 with a warp left idle), each launch counted. And against the block
// kernel on the same inputs, which rounds the same operands and sums in another order: 8e-3 as well
// (measured: a few 1e-4, rounding to bf16 of values that differ in the last fp32 bits). Where the
// kernel takes the chunk output (gdr_scan_forward_output_width: dk 96 here, including a 96-column
// block with half its warps idle), it is asked for too: against s (P y + Qg state) from the fp64
// recurrence, 8e-3.
TEST(GdrScanCuda, WarpColumnForwardScanMatchesTheRecurrence) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const WarpColumnsRestored restore;
  kernels::gdr_scan_wgmma(false);  // the warpgroup kernel (off by default) has the next test
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1217);
  const std::vector<Case> cases = {{{5, 0, 1, 2}, 2, 64, 96, 192},
                                   {{3, 0, 2}, 3, 64, 128, 128},
                                   {{2, 4}, 2, 64, 128, 256},
                                   {{3, 1}, 2, 64, 96, 48}};
  double worst = 0, worst_vs_block = 0, worst_o = 0;
  int launches = 0, with_output = 0;
  for (const Case& c : cases) {
    const ForwardBf16Scan run(c);
    for (const int width : {0, 64, 96, 128}) {
      kernels::gdr_scan_warp_width(width);
      for (const bool reverse : {false, true}) {
        for (const float sign : {1.f, -1.f}) {
          for (const bool with_init : {true, false}) {
            const std::string what = ForwardBf16Scan::what(c, reverse, sign, with_init) + ", width " +
                                     std::to_string(width);
            auto o = run.prepare(kernels::kGdrScanAuto, reverse, sign, with_init);
            ASSERT_GT(kernels::gdr_scan_forward_warps_width(o.a), 0) << what;
            if (kernels::gdr_scan_forward_output_width(o.a) > 0) run.attach_output(o);
            const int64_t before = kernels::gdr_scan_warp_launches();
            ASSERT_EQ(kernels::gdr_scan(o.a, c10::cuda::getCurrentCUDAStream().stream()), 0) << what;
            EXPECT_EQ(kernels::gdr_scan_warp_launches() - before, 1) << what << ": the warp-column kernel not taken";
            double e_o = 0;
            const double e = run.error(o, reverse, sign, with_init, &e_o);
            EXPECT_LT(e, 8e-3) << what << ": against the fp64 recurrence";
            if (o.o.defined()) {
              EXPECT_LT(e_o, 8e-3) << what << ": the chunk output against fp64";
              worst_o = std::max(worst_o, e_o);
              ++with_output;
            }
            EXPECT_FALSE((o.fin == 7.f).any().item<bool>()) << what << ": a final state left unwritten";
            worst = std::max(worst, e);
            ++launches;
            if (width != 0) continue;
            kernels::gdr_scan_warp_columns(false);
            auto b = run.prepare(kernels::kGdrScanAuto, reverse, sign, with_init);
            ASSERT_EQ(kernels::gdr_scan(b.a, c10::cuda::getCurrentCUDAStream().stream()), 0)
                << what << ", block kernel";
            kernels::gdr_scan_warp_columns(true);
            const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kCPU, torch::kFloat64); };
            const double d = std::max({rel_norm_diff(f64(o.state), f64(b.state)), rel_norm_diff(f64(o.y), f64(b.y)),
                                       rel_norm_diff(f64(o.fin), f64(b.fin))});
            EXPECT_LT(d, 8e-3) << what << ": against the block kernel";
            worst_vs_block = std::max(worst_vs_block, d);
          }
        }
      }
    }
  }
  // dk 96: both cases at widths 0, 64 and 96, each in 8 launches.
  EXPECT_EQ(with_output, 2 * 3 * 8) << "launches with the chunk output";
  std::printf("[gdr_scan forward, warp columns] %d launches, worst against fp64 %.1e, against the block kernel %.1e; "
              "%d with the chunk output, worst %.1e\n",
              launches, worst, worst_vs_block, with_output, worst_o);
}

// kernels/wgmma.cuh's products at the smallest size, B staged either way: bf16 products exact,
// fp32 sums, so within 1e-5 of the fp32 product of the same values (a core matrix read from the
// wrong place gives errors of order one).
TEST(Wgmma, ProductsReadBothLayouts) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1301);
  const auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto A = torch::randn({64, 32}, opt), B = torch::randn({32, 64}, opt);
  const auto want = torch::matmul(A.to(torch::kFloat32), B.to(torch::kFloat32));
  const auto bits = [](const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); };
  for (const bool n_major : {true, false}) {
    const auto b = n_major ? B.contiguous() : B.t().contiguous();
    auto D = torch::full({64, 64}, 7.f, opt.dtype(torch::kFloat32));
    ASSERT_EQ(kernels::wgmma_product_check(bits(A), bits(b), D.data_ptr<float>(), n_major,
                                           c10::cuda::getCurrentCUDAStream().stream()),
              0);
    const double e = rel_norm_diff(D.to(torch::kFloat64), want.to(torch::kFloat64));
    EXPECT_LT(e, 1e-5) << (n_major ? "B staged N-major" : "B staged K-major");
    std::printf("[wgmma] %s: %.1e against the fp32 product\n", n_major ? "N-major" : "K-major", e);
  }
}

// The forward bf16 scan on warpgroup products (kernels/gdr_scan_wgmma.cu, switched on here), where
// it takes the sizes: against the recurrence in fp64 (bound 8e-3, as the warp-column kernel above),
// with and without the chunk output (where the scan takes it), both directions and signs, with and
// without an initial state; and against the warp-column kernel (the switch off), whose roundings it
// shares: only the order of fp32 sums may differ, so the two stay within a few bf16 roundings (4e-3
// of the norm; on the H200 they agreed to the bit in every run so far).
TEST(GdrScanCuda, WarpgroupForwardScanMatchesTheRecurrence) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const WarpColumnsRestored restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1303);
  const std::vector<Case> cases = {{{5, 0, 1, 2}, 2, 64, 96, 192},  // hybrid base's head sizes
                                   {{3, 0, 2}, 3, 64, 128, 128},
                                   {{2, 4}, 2, 64, 128, 256}};
  const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kCPU, torch::kFloat64); };
  double worst = 0, worst_o = 0, worst_vs_warps = 0;
  int launches = 0;
  for (const Case& c : cases) {
    const ForwardBf16Scan run(c);
    for (const bool output : {true, false}) {
      for (const bool reverse : {false, true}) {
        for (const float sign : {1.f, -1.f}) {
          for (const bool with_init : {true, false}) {
            const std::string what =
                ForwardBf16Scan::what(c, reverse, sign, with_init) + (output ? ", with the chunk output" : "");
            kernels::gdr_scan_wgmma(true);
            auto o = run.prepare(kernels::kGdrScanAuto, reverse, sign, with_init);
            // The output goes into the scan where the warp-column kernel would take it (dk 96 here).
            if (output && kernels::gdr_scan_forward_output_width(o.a) == 0) continue;
            if (output) run.attach_output(o);
            ASSERT_EQ(kernels::gdr_scan_forward_wgmma_width(o.a), 64) << what;
            const int64_t before = kernels::gdr_scan_wgmma_launches();
            ASSERT_EQ(kernels::gdr_scan(o.a, c10::cuda::getCurrentCUDAStream().stream()), 0) << what;
            EXPECT_EQ(kernels::gdr_scan_wgmma_launches() - before, 1) << what << ": the warpgroup kernel not taken";
            double e_o = 0;
            const double e = run.error(o, reverse, sign, with_init, &e_o);
            EXPECT_LT(e, 8e-3) << what << ": against the fp64 recurrence";
            if (output) {
              EXPECT_LT(e_o, 8e-3) << what << ": the chunk output against fp64";
              worst_o = std::max(worst_o, e_o);
            }
            EXPECT_FALSE((o.fin == 7.f).any().item<bool>()) << what << ": a final state left unwritten";
            worst = std::max(worst, e);
            ++launches;

            kernels::gdr_scan_wgmma(false);
            auto w = run.prepare(kernels::kGdrScanAuto, reverse, sign, with_init);
            if (output) run.attach_output(w);
            ASSERT_EQ(kernels::gdr_scan(w.a, c10::cuda::getCurrentCUDAStream().stream()), 0) << what << ", warps";
            double d = std::max({rel_norm_diff(f64(o.state), f64(w.state)), rel_norm_diff(f64(o.y), f64(w.y)),
                                 rel_norm_diff(f64(o.fin), f64(w.fin))});
            if (output) d = std::max(d, rel_norm_diff(f64(o.o), f64(w.o)));
            EXPECT_LT(d, 4e-3) << what << ": against the warp-column kernel";
            worst_vs_warps = std::max(worst_vs_warps, d);
          }
        }
      }
    }
  }
  EXPECT_EQ(launches, 3 * 8 + 8) << "launches: each case without the output, the first also with it";
  std::printf("[gdr_scan forward, warpgroups] %d launches, worst against fp64 %.1e (chunk output %.1e), against the "
              "warp-column kernel %.1e\n",
              launches, worst, worst_o, worst_vs_warps);
}

// The warp-column scans fed by copy warps (kernels/gdr_scan_copy_warps.cu, the default) run the same
// steps as the kernels whose every thread copies (gdr_scan_copy_warps off): the same bits. The
// forward form in blocks of 96 (hybrid base, dk 96 and 128, documents long enough to refill every
// buffer twice) and 64 columns (one with a warp idle), both directions and signs, with and without
// an initial state and the chunk output; the fused backward form at dk 96 and 128 and a value width
// of 48, dO through a row map with zero rows and a final gradient in some cases, also against fp64
// (8e-3). Each launch counted, both ways; 128-column blocks keep the thread copies.
TEST(GdrScanCuda, CopyWarpScansGiveTheThreadCopyKernelsBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const WarpColumnsRestored restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 1307);
  const auto stream = [] { return c10::cuda::getCurrentCUDAStream().stream(); };
  double worst = 0, worst_reverse = 0;
  int forward_launches = 0, output_launches = 0, reverse_launches = 0;
  for (const Case& c : std::vector<Case>{{{7, 0, 1, 2}, 2, 64, 96, 192},  // hybrid base's head sizes
                                         {{8, 0, 3}, 3, 64, 128, 192},
                                         {{4, 1}, 2, 64, 96, 64},
                                         {{5, 2}, 2, 64, 128, 48}}) {  // 64 columns, a warp idle
    const ForwardBf16Scan run(c);
    for (const bool output : {true, false}) {
      for (const bool reverse : {false, true}) {
        for (const float sign : {1.f, -1.f}) {
          for (const bool with_init : {true, false}) {
            const std::string what =
                ForwardBf16Scan::what(c, reverse, sign, with_init) + (output ? ", with the chunk output" : "");
            kernels::gdr_scan_copy_warps(true);
            auto cw = run.prepare(kernels::kGdrScanAuto, reverse, sign, with_init);
            if (output && kernels::gdr_scan_forward_output_width(cw.a) == 0) continue;
            if (output) run.attach_output(cw);
            const int cols = kernels::gdr_scan_forward_warps_width(cw.a);
            ASSERT_TRUE(kernels::gdr_scan_copy_warps_take(cw.a, cols, false)) << what;
            const int64_t before = kernels::gdr_scan_copy_warps_launches();
            ASSERT_EQ(kernels::gdr_scan(cw.a, stream()), 0) << what;
            EXPECT_EQ(kernels::gdr_scan_copy_warps_launches() - before, 1) << what << ": copy warps not taken";
            const double e = run.error(cw, reverse, sign, with_init);
            EXPECT_LT(e, 8e-3) << what << ": against the fp64 recurrence";
            worst = std::max(worst, e);
            ++forward_launches;
            if (output) ++output_launches;

            kernels::gdr_scan_copy_warps(false);
            auto tc = run.prepare(kernels::kGdrScanAuto, reverse, sign, with_init);
            if (output) run.attach_output(tc);
            const int64_t off_before = kernels::gdr_scan_copy_warps_launches();
            ASSERT_EQ(kernels::gdr_scan(tc.a, stream()), 0) << what << ", thread copies";
            EXPECT_EQ(kernels::gdr_scan_copy_warps_launches(), off_before) << what << ": copy warps with the switch off";
            EXPECT_TRUE(torch::equal(cw.state, tc.state)) << what << ": states";
            EXPECT_TRUE(torch::equal(cw.y, tc.y)) << what << ": y";
            EXPECT_TRUE(torch::equal(cw.fin, tc.fin)) << what << ": final states";
            if (output) {
              EXPECT_TRUE(torch::equal(cw.o, tc.o)) << what << ": the chunk output";
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(output_launches, 2 * 8) << "the chunk output at dk 96 (96 and 64 columns)";
  EXPECT_EQ(forward_launches, 4 * 8 + output_launches) << "each case without the output";
  for (const Case& c : std::vector<Case>{{{9, 1, 3, 3, 2}, 2, 64, 96, 192}, {{6, 4}, 3, 64, 128, 192},
                                         {{3, 0, 1}, 2, 64, 96, 48}}) {
    const FusedScanCase f(c);
    for (const bool rows : {true, false}) {
      const std::string what = describe(c) + (rows ? ", dO through a row map" : "");
      auto og = f.output_grad(rows, c.H % 2 == 0, 11);
      og.dO = og.dO.to(torch::kBFloat16);
      kernels::gdr_scan_copy_warps(true);
      const int64_t before = kernels::gdr_scan_copy_warps_launches();
      const auto cw = f.run(og, true, true);
      EXPECT_EQ(kernels::gdr_scan_copy_warps_launches() - before, 1) << what << ": copy warps not taken";
      kernels::gdr_scan_copy_warps(false);
      const auto tc = f.run(og, true, true);
      EXPECT_EQ(kernels::gdr_scan_copy_warps_launches() - before, 1) << what << ": copy warps with the switch off";
      EXPECT_TRUE(torch::equal(cw.dU, tc.dU)) << what << ": dU";
      EXPECT_TRUE(torch::equal(cw.dh_next, tc.dh_next)) << what << ": the state gradients";
      EXPECT_TRUE(torch::equal(cw.dh0, tc.dh0)) << what << ": the initial state's gradient";
      const auto ref = f.reference(og);
      const auto f64 = [](const torch::Tensor& x) { return x.to(torch::kFloat64); };
      const double e = std::max({rel_norm_diff(f64(cw.dU), ref.dU), rel_norm_diff(f64(cw.dh0), ref.dh0),
                                 rel_norm_diff(f64(cw.dh_next), ref.dh_next)});
      EXPECT_LT(e, 8e-3) << what << ": against fp64";
      worst_reverse = std::max(worst_reverse, e);
      ++reverse_launches;
    }
  }
  // 128-column blocks keep the thread copies.
  kernels::gdr_scan_copy_warps(true);
  const ForwardBf16Scan wide(Case{{2, 1}, 2, 64, 128, 128});
  auto w = wide.prepare(kernels::kGdrScanAuto, false, 1.f, true);
  EXPECT_EQ(kernels::gdr_scan_forward_warps_width(w.a), 128);
  EXPECT_FALSE(kernels::gdr_scan_copy_warps_take(w.a, 128, false)) << "128-column blocks";
  const int64_t copy_before = kernels::gdr_scan_copy_warps_launches(), warp_before = kernels::gdr_scan_warp_launches();
  ASSERT_EQ(kernels::gdr_scan(w.a, stream()), 0);
  EXPECT_EQ(kernels::gdr_scan_copy_warps_launches(), copy_before) << "128-column blocks on copy warps";
  EXPECT_EQ(kernels::gdr_scan_warp_launches() - warp_before, 1) << "128-column blocks: the thread-copy kernel";
  std::printf("[gdr_scan, copy warps] %d forward and %d reverse launches, the thread-copy kernels' bits; against "
              "fp64 %.1e (forward), %.1e (reverse)\n",
              forward_launches, reverse_launches, worst, worst_reverse);
}

// The fused front's bf16 outputs (GdrChunkFrontArgs::bf16_out) are its fp32 outputs rounded to
// bf16, bit for bit: the same arithmetic, rounded only as W, U, Kd, Qg and P are stored; Tm and
// decay stay fp32 and equal. A packed chunk list with ragged chunks, bf16 and fp32 inputs, two V
// panels, and the backward's recompute form (no W, U, Tm).
TEST(GdrChunkFrontCuda, Bf16OutputsAreTheFp32OutputsRounded) {
#if !defined(DD_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 921);
  struct Shape {
    int64_t H, dk, dv;
    bool bf16_in;
  };
  // Chunks of three documents of 130, 64 and 20 tokens: starts and lengths.
  const std::vector<int32_t> starts{0, 64, 128, 130, 194}, lens{64, 64, 2, 64, 20};
  const int64_t tokens = 214, N = static_cast<int64_t>(starts.size()), C = 64;
  auto i32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt32);
  const auto table = torch::cat({torch::tensor(starts, torch::kInt32), torch::tensor(lens, torch::kInt32)}).to(i32.device());
  for (const Shape& sh : {Shape{3, 128, 128, true}, Shape{2, 96, 192, true}, Shape{2, 64, 256, false}}) {
    auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
    const auto in_dt = sh.bf16_in ? torch::kBFloat16 : torch::kFloat32;
    auto unit = [](const torch::Tensor& x) { return x / x.norm(2, -1, true); };
    const auto q = unit(torch::randn({tokens, sh.H, sh.dk}, f32)).to(in_dt);
    const auto k = unit(torch::randn({tokens, sh.H, sh.dk}, f32)).to(in_dt);
    const auto v = torch::randn({tokens, sh.H, sh.dv}, f32).to(in_dt);
    const auto beta = torch::sigmoid(torch::randn({tokens, sh.H}, f32));
    const auto g = -torch::rand({tokens, sh.H}, f32) * 0.5;
    kernels::GdrChunkList l;
    l.chunk_start = table.data_ptr<int32_t>();
    l.chunk_len = l.chunk_start + N;
    l.N = N, l.H = sh.H, l.C = C, l.dk = sh.dk, l.dv = sh.dv;
    for (const bool with_solve : {true, false}) {
      // Outputs in fp32, then in bf16: W, U, Kd, Qg, P, Tm, decay.
      auto run = [&](bool bf16_out) {
        auto o = bf16_out ? f32.dtype(torch::kBFloat16) : f32;
        std::vector<torch::Tensor> t{torch::full({N, sh.H, C, sh.dk}, 7.0, o), torch::full({N, sh.H, C, sh.dv}, 7.0, o),
                                     torch::full({N, sh.H, C, sh.dk}, 7.0, o), torch::full({N, sh.H, C, sh.dk}, 7.0, o),
                                     torch::full({N, sh.H, C, C}, 7.0, o),     torch::full({N, sh.H, C, C}, 7.0, f32),
                                     torch::full({N, sh.H}, 7.0, f32)};
        kernels::GdrChunkFrontArgs a;
        a.q = q.data_ptr();
        a.k = k.data_ptr();
        a.v = v.data_ptr();
        a.beta = beta.data_ptr<float>();
        a.g = g.data_ptr<float>();
        a.in_qk = a.in_v = sh.bf16_in ? kernels::DType::BF16 : kernels::DType::F32;
        a.W = with_solve ? t[0].data_ptr() : nullptr;
        a.U = with_solve ? t[1].data_ptr() : nullptr;
        a.Kd = t[2].data_ptr();
        a.Qg = t[3].data_ptr();
        a.P = t[4].data_ptr();
        a.Tm = with_solve ? t[5].data_ptr<float>() : nullptr;
        a.decay = t[6].data_ptr<float>();
        a.bf16_out = bf16_out;
        EXPECT_EQ(kernels::gdr_chunk_front_forward(l, a, c10::cuda::getCurrentCUDAStream().stream()), 0);
        return t;
      };
      const auto f = run(false), b = run(true);
      const char* names[] = {"W", "U", "Kd", "Qg", "P", "Tm", "decay"};
      const std::string what = "H=" + std::to_string(sh.H) + " dk=" + std::to_string(sh.dk) + " dv=" +
                               std::to_string(sh.dv) + (sh.bf16_in ? " bf16 inputs" : " fp32 inputs") +
                               (with_solve ? "" : ", recompute form");
      for (size_t i = 0; i < f.size(); ++i) {
        if (!with_solve && (i == 0 || i == 1 || i == 5)) continue;
        // Every element written (none left at the fill value), and the bf16 ones the fp32 ones rounded.
        EXPECT_FALSE(f[i].eq(7.0).any().item<bool>()) << what << ": " << names[i] << " not all written";
        const auto want = i < 5 ? f[i].to(torch::kBFloat16) : f[i];
        EXPECT_EQ(b[i].scalar_type(), want.scalar_type()) << what << ": " << names[i];
        EXPECT_TRUE(torch::equal(b[i], want)) << what << ": " << names[i];
      }
    }
  }
#endif
}

// The solve's matrices as the delta rule builds them: A = β (K Kᵀ) ⊙ decay with unit-norm keys,
// plus a diagonal and upper triangle of noise that both paths must ignore. fp32 on both sides
// (cuBLAS trsm vs inverse-then-matmul): 1e-5 relative.
TEST(TrilSolveCuda, InverseKernelPathMatchesTriangularSolve) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 913);
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  struct Shape {
    std::vector<int64_t> batch;
    int64_t C, n;
  };
  for (const Shape& sh : {Shape{{300}, 64, 256}, Shape{{3, 5}, 17, 40}, Shape{{7}, 1, 3}, Shape{{2, 2}, 33, 1}}) {
    auto bshape = sh.batch;
    auto with = [&](std::vector<int64_t> tail) {
      auto v = bshape;
      v.insert(v.end(), tail.begin(), tail.end());
      return v;
    };
    auto K = torch::randn(with({sh.C, 128}), opt);
    K = K / K.norm(2, -1, true);
    auto beta = torch::rand(with({sh.C, 1}), opt);
    auto decay = torch::rand(with({sh.C, sh.C}), opt);
    auto noise = torch::randn(with({sh.C, sh.C}), opt).triu();
    auto A0 = beta * torch::matmul(K, K.transpose(-1, -2)) * decay.tril(-1) + noise;
    auto B0 = torch::randn(with({sh.C, sh.n}), opt);
    auto dX = torch::randn(with({sh.C, sh.n}), opt);
    auto run = [&](bool kernel) {
      auto A = A0.clone().requires_grad_(true), B = B0.clone().requires_grad_(true);
      auto X = kernel ? model::unit_lower_solve(A, B) : model::unit_lower_solve_reference(A, B);
      (X * dX).sum().backward();
      return std::vector<torch::Tensor>{X.detach(), A.grad(), B.grad()};
    };
    const auto want = run(false), got = run(true);
    const std::string what = "C=" + std::to_string(sh.C) + " n=" + std::to_string(sh.n);
    const char* names[] = {"X", "dA", "dB"};
    for (size_t i = 0; i < want.size(); ++i) {
      const double e = rel_norm_diff(got[i], want[i]);
      EXPECT_LT(e, 1e-5) << what << ": " << names[i];
      std::printf("[tril_solve] %s %s: %.1e\n", what.c_str(), names[i], e);
    }
    // The gradient of A is confined to its strict lower triangle (the rest was never read).
    EXPECT_EQ(got[1].triu().abs().max().item<float>(), 0.f) << what;
    // And T (I + strict_lower(A)) = I.
    auto T = model::unit_lower_inverse(A0);
    auto eye = torch::eye(sh.C, opt).expand(T.sizes());
    EXPECT_LT((torch::matmul(T, eye + A0.tril(-1)) - eye).abs().max().item<float>(), 1e-5) << what;
  }
}

// A chunked delta rule case on the GPU, for the tests that run one case two ways.
struct ChunkCase {
  int64_t B, T, H, dk, dv, C;
  std::vector<int64_t> cu;  // empty: dense
  bool qk_bf16, v_bf16, h0;
  int64_t v_pad = 0;  // > 0: v is a column slice of a [B, T, H·dv + v_pad] tensor (read in place)
  bool state_loss_only = false;  // the loss reads the final state only: no gradient reaches o
  bool tf32_scan = false;        // TF32 scan products (16-bit training's; with them the bf16 front)
  bool o_as_rows = false;        // the output as chunk rows (the Gated DeltaNet's), gathered for the loss

  std::string name() const {
    std::string s = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                    " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv) + " C=" + std::to_string(C);
    return s + (cu.empty() ? "" : " packed") + (qk_bf16 ? " q,k bf16" : " q,k fp32") + (v_bf16 ? " v bf16" : " v fp32") +
           (v_pad > 0 ? " strided" : "") + (state_loss_only ? " loss on h only" : "") + (tf32_scan ? " TF32 scan" : "") +
           (o_as_rows ? " o as rows" : "");
  }
};

const char* const kChunkOutputNames[] = {"o", "h", "dq", "dk", "dv", "dbeta", "dg", "dh0"};

// Random inputs for a case, drawn once; run(c) returns o, h and the gradient of every input under
// whatever switches the caller has set, for a fixed random loss Σ o ⊙ dO + Σ h ⊙ dH (or Σ h ⊙ dH).
class ChunkCaseRun {
 public:
  explicit ChunkCaseRun(const ChunkCase& c) : c_(c) {
    auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
    const int64_t n_state = c.cu.empty() ? c.B : static_cast<int64_t>(c.cu.size()) - 1;
    auto unit = [](const torch::Tensor& x) { return x / x.norm(2, -1, true); };
    const auto qk_dt = c.qk_bf16 ? torch::kBFloat16 : torch::kFloat32;
    in_.push_back(unit(torch::randn({c.B, c.T, c.H, c.dk}, f32)).to(qk_dt));
    in_.push_back(unit(torch::randn({c.B, c.T, c.H, c.dk}, f32)).to(qk_dt));
    in_.push_back(torch::randn({c.B, c.T, c.H, c.dv}, f32).to(c.v_bf16 ? torch::kBFloat16 : torch::kFloat32));
    in_.push_back(torch::sigmoid(torch::randn({c.B, c.T, c.H}, f32)));
    in_.push_back(-torch::rand({c.B, c.T, c.H}, f32) * 0.5);
    if (c.h0) in_.push_back(torch::randn({n_state, c.H, c.dk, c.dv}, f32) * 0.1);
    dO_ = torch::randn({c.B, c.T, c.H, c.dv}, f32);
    dH_ = torch::randn({n_state, c.H, c.dk, c.dv}, f32);
  }

  std::vector<torch::Tensor> run() const {
    std::vector<torch::Tensor> in;
    for (const auto& t : in_) in.push_back(t.clone().requires_grad_(true));
    torch::Tensor v = in[2];
    if (c_.v_pad > 0) {  // columns v_pad / 2 .. of a wider tensor; gradients reach in[2] through the copy
      auto wide = torch::zeros({c_.B, c_.T, c_.H * c_.dv + c_.v_pad}, v.options());
      wide.narrow(-1, c_.v_pad / 2, c_.H * c_.dv).copy_(v.reshape({c_.B, c_.T, c_.H * c_.dv}));
      v = wide.narrow(-1, c_.v_pad / 2, c_.H * c_.dv).view({c_.B, c_.T, c_.H, c_.dv});
      EXPECT_FALSE(v.is_contiguous());
    }
    const torch::Tensor cu = c_.cu.empty() ? torch::Tensor() : torch::tensor(c_.cu, torch::kInt64);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c_.dk));
    auto out = model::gdr_forward_chunked(in[0], in[1], v, in[3], in[4], scale, c_.h0 ? in[5] : torch::Tensor(), cu,
                                          c_.C, c_.tf32_scan, c_.o_as_rows);
    if (c_.o_as_rows) {
      out.o = out.o_rows.index_select(0, out.o_row.reshape({-1}).to(torch::kInt64)).view(dO_.sizes());
    }
    if (c_.state_loss_only) {
      (out.h * dH_).sum().backward();
    } else {
      ((out.o.to(torch::kFloat32) * dO_).sum() + (out.h * dH_).sum()).backward();
    }
    std::vector<torch::Tensor> res{out.o.detach(), out.h.detach()};
    for (auto& t : in) res.push_back(t.grad());
    return res;
  }

 private:
  ChunkCase c_;
  std::vector<torch::Tensor> in_;
  torch::Tensor dO_, dH_;
};

// Compares two runs of a case output by output: 1e-5 relative, except the gradients of inputs
// given in bf16, rounded to bf16 on both sides, where a rounding-boundary flip of one ulp (2^-8
// relative) is allowed. Returns the worst error.
double expect_runs_match(const ChunkCase& c, const std::vector<torch::Tensor>& got,
                         const std::vector<torch::Tensor>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!got[i].defined()) {
      ADD_FAILURE() << c.name() << ": " << kChunkOutputNames[i] << " missing";
      continue;
    }
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << c.name() << ": " << kChunkOutputNames[i];
    const double e = rel_norm_diff(got[i], want[i]);
    const bool rounded = (i == 2 || i == 3) ? c.qk_bf16 : (i == 4 && c.v_bf16);
    EXPECT_LT(e, rounded ? 4e-3 : 1e-5) << c.name() << ": " << kChunkOutputNames[i];
    worst = std::max(worst, e);
  }
  return worst;
}

// Expects two runs of a case to agree output by output from output `first` on: to the bit, but dβ
// and dg, which the backward's tail sums by shared-memory atomics in an order that changes from run
// to run (1e-6 of the norm).
void expect_same_bits_but_atomic_sums(const ChunkCase& c, const std::vector<torch::Tensor>& got,
                                      const std::vector<torch::Tensor>& want, size_t first) {
  ASSERT_EQ(got.size(), want.size()) << c.name();
  for (size_t i = first; i < want.size(); ++i) {
    const std::string what = c.name() + ": " + kChunkOutputNames[i];
    if (!got[i].defined() || !want[i].defined()) {
      ADD_FAILURE() << what << " missing";
      continue;
    }
    const bool atomic_sums = i == 5 || i == 6;  // dbeta, dg
    if (atomic_sums) {
      EXPECT_LT(rel_norm_diff(got[i], want[i]), 1e-6) << what;
    } else {
      EXPECT_TRUE(torch::equal(got[i], want[i])) << what << " differs by " << rel_norm_diff(got[i], want[i]);
    }
  }
}

// The chunk core's CUDA kernels (gather and gate math, masks, their backward; kernels/gdr_chunk.h;
// the fused ones at C = 64) against its ATen pieces on the same GPU: outputs and every input
// gradient. Both sides compute in fp32 and differ only in summation order.
TEST(GdrScanCuda, ChunkKernelsMatchAtenPieces) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 917);
  const ChunkCase cases[] = {
      {2, 150, 3, 128, 128, 64, {}, true, true, false},   // the model's sizes, a ragged last chunk
      {1, 300, 2, 128, 128, 64, {0, 17, 150, 151, 300}, false, true, false},  // fp32 q, k (fp32 training); bf16 v
      {1, 300, 2, 36, 40, 32, {0, 17, 150, 151, 300}, false, false, true},   // packed; rows not multiples of 32
      {1, 70, 1, 64, 33, 16, {}, false, false, true},     // small chunks
      {3, 64, 2, 128, 64, 64, {}, false, false, false},   // one chunk per row
      // v read in place from a wider tensor, as the layer's conv output: a token stride that allows
      // 4-element rows, and one that does not
      {1, 300, 2, 128, 128, 64, {0, 17, 150, 151, 300}, false, true, false, 8},
      {2, 150, 3, 64, 40, 64, {}, false, false, false, 3},
  };
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    model::gdr_use_kernels(false);
    const auto want = r.run();
    model::gdr_use_kernels(true);
    const auto got = r.run();
    std::printf("[gdr_chunk] kernels vs ATen pieces, %s: worst %.1e\n", c.name().c_str(),
                expect_runs_match(c, got, want));
  }
}

// The backward reading the forward's Kd, Qg, P and decay (model::gdr_save_front, the default)
// against recomputing them with the front's kernel: the same kernel and code path computes them
// either way, so outputs and gradients agree to the last bit but for summation order (bound 1e-6,
// where a wrong or stale tensor would be off by order 1); and the recompute is counted only with
// the switch off. bf16 front (TF32 scan) dense and packed at bench gdr's and hybrid base's heads,
// and the fp32 front.
TEST(GdrScanCuda, SavedFrontMatchesTheRecompute) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 331);
  const ChunkCase cases[] = {
      {2, 150, 3, 128, 128, 64, {}, true, true, false, 0, false, true},
      {1, 300, 2, 96, 192, 64, {0, 17, 150, 151, 300}, true, true, true, 0, false, true},
      {1, 300, 2, 128, 128, 64, {0, 17, 150, 151, 300}, false, true, false},
  };
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    model::gdr_save_front(false);
    const int64_t before = model::gdr_front_recomputes();
    const auto want = r.run();
    EXPECT_EQ(model::gdr_front_recomputes() - before, 1) << c.name();
    model::gdr_save_front(true);
    const auto got = r.run();
    EXPECT_EQ(model::gdr_front_recomputes() - before, 1) << c.name() << ": the saved front was recomputed";
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(got[i].defined() && want[i].defined()) << c.name() << ": " << kChunkOutputNames[i];
      const double e = rel_norm_diff(got[i], want[i]);
      EXPECT_LT(e, 1e-6) << c.name() << ": " << kChunkOutputNames[i];
      worst = std::max(worst, e);
    }
    std::printf("[gdr_chunk] saved front vs recomputed, %s: worst %.1e\n", c.name().c_str(), worst);
  }
}

// The fused kernels against the separate launches they replace, through the whole op: the
// forward's front (kernels/gdr_chunk_front.h; the output and final state read its W, U, Kd, Qg, P
// and decay, every gradient its Tm and W) and the backward through the solve
// (kernels/gdr_chunk_solve_backward.h; every input gradient reads its dA_raw, dRw and dRu, or v's
// gradient is its own with model::gdr_dv_in_solve, the default, tested on and off). Sizes they
// take: C = 64, dk a multiple of 16 up to 128, dv a multiple of 16 (in panels of 128 columns: 256
// takes two).
TEST(GdrScanCuda, FusedKernelsMatchSeparateOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 311);
  const ChunkCase cases[] = {
      {2, 150, 3, 128, 128, 64, {}, true, true, false},                        // bf16 inputs, a ragged chunk
      {1, 300, 2, 128, 128, 64, {0, 17, 150, 151, 300}, false, true, false},  // packed, as the layer
      {1, 300, 2, 128, 256, 64, {0, 1, 64, 65, 300}, false, false, true},     // two V panels, h0
      {2, 200, 2, 64, 48, 64, {}, false, false, true},                        // narrower heads
      {1, 130, 3, 16, 16, 64, {}, true, false, false},                        // the smallest sizes taken
      {2, 129, 1, 48, 144, 64, {}, false, true, false},                       // a 16-column second panel
      {1, 300, 2, 128, 128, 64, {0, 17, 150, 151, 300}, false, true, false, 8},  // strided v, 4-element rows
      {2, 150, 3, 64, 64, 64, {}, false, false, false, 6},                    // strided v, scalar rows
      {1, 300, 2, 96, 192, 64, {0, 17, 150, 151, 300}, false, true, true, 0, true},  // hybrid base's heads, no dO
  };
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    model::gdr_use_fused_kernels(false);
    const auto want = r.run();
    model::gdr_use_fused_kernels(true);
    // v's gradient from the solve's backward (the default) and from the tail.
    for (const bool dv_in_solve : {true, false}) {
      model::gdr_dv_in_solve(dv_in_solve);
      const auto got = r.run();
      std::printf("[gdr_chunk] fused (dv in the %s) vs separate kernels, %s: worst %.1e\n",
                  dv_in_solve ? "solve" : "tail", c.name().c_str(), expect_runs_match(c, got, want));
    }
    model::gdr_dv_in_solve(true);
  }
}

// L2Norm of q and k taken into the chunked rule's op (model::GdrQkNorm, the Gated DeltaNet's
// default on a GPU) against the norm's own op before it (model::fused_l2_norm, the same forward
// kernel): the same normalised q and k, so o and h to the bit. Where the backward's tail takes the
// norm's backward (hybrid base's heads on the 16-bit path, counted by gdr_tail_norm_launches), q
// and k's gradients differ by rounding (the sums of y ⊙ dy taken from fp32 dy, where the norm's
// kernel reads dy rounded to bf16): within 4e-3 of the other path, and no further from an fp64
// run of the same inputs than it is (1.1 times its error, plus 1e-4). Elsewhere (and there with the
// fixed head sizes' instances off) the core runs the norm's own backward kernel after its own, so
// every gradient is the other path's to the bit. The other gradients are the same either way, but
// for the tail's atomic sums (dβ, dg: 1e-6). Inputs of several scales per row, read in place from
// a wider tensor as the short conv's output is. One case's loss reads only the final states: q's
// gradient is then zero both ways, and k's the separate norm's to the bit. On the 16-bit path the
// forward's norm runs inside the front kernel (counted by gdr_front_norms), reading q and k in
// place: every result the same bits as with the norm's own kernel before the front.
TEST(GdrScanCuda, L2NormInsideTheCoreMatchesTheNormBefore) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 563);
  struct NormCase {
    int64_t B, T, H, dk, dv;
    std::vector<int64_t> cu;
    bool bf16, tf32_scan, in_tail;
    bool o_grad = true;  // false: the loss reads only the final states (the tail runs without dQg)
  };
  const NormCase cases[] = {
      {1, 300, 2, 96, 192, {0, 17, 150, 151, 300}, true, true, true},  // hybrid base's heads, the 16-bit path
      // The same with no output gradient: the core's fp32 dKd then leaves the tail's bf16 path, and
      // the norm's own backward runs after it.
      {1, 300, 2, 96, 192, {0, 17, 150, 151, 300}, true, true, false, false},
      {2, 150, 3, 96, 192, {}, true, true, true},                      // dense, a ragged chunk
      {2, 150, 3, 128, 128, {}, true, true, false},   // moe-1b's dk: the norm's own backward after the tail
      {2, 150, 2, 32, 64, {}, true, true, false},     // dk 32: the norm's kernel forward (not the front's)
      {1, 300, 2, 128, 128, {0, 17, 150, 151, 300}, false, false, false},  // fp32 q, k
      {2, 150, 2, 36, 40, {}, false, false, false},                    // sizes the fused kernels do not take
  };
  auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  for (const NormCase& c : cases) {
    const std::string name = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " dk=" +
                             std::to_string(c.dk) + " dv=" + std::to_string(c.dv) + (c.bf16 ? " bf16" : " fp32") +
                             (c.cu.empty() ? "" : " packed") + (c.o_grad ? "" : " states only");
    const auto dt = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
    const int64_t Kg = c.H * c.dk, n_state = c.cu.empty() ? c.B : static_cast<int64_t>(c.cu.size()) - 1;
    // q | k | 8 spare columns, as the conv's output rows hold q, k and v side by side.
    const auto qk = (torch::randn({c.B, c.T, 2 * Kg + 8}, f32) * (torch::rand({c.B, c.T, 1}, f32) * 3.0 + 0.1)).to(dt);
    const auto v = torch::randn({c.B, c.T, c.H, c.dv}, f32).to(dt);
    const auto beta = torch::sigmoid(torch::randn({c.B, c.T, c.H}, f32));
    const auto g = -torch::rand({c.B, c.T, c.H}, f32) * 0.5;
    const auto dO = torch::randn({c.B, c.T, c.H, c.dv}, f32), dH = torch::randn({n_state, c.H, c.dk, c.dv}, f32);
    const torch::Tensor cu = c.cu.empty() ? torch::Tensor() : torch::tensor(c.cu, torch::kInt64);
    // inside: the norm in the core; fp64: the norm before it, every input in fp64 (the reference).
    auto run = [&](bool inside, bool fp64) {
      const auto x_dt = fp64 ? torch::kFloat64 : dt;
      // Fresh leaves each run (to() of the same dtype would hand back the shared tensor itself).
      auto qk_in = qk.to(x_dt).clone().requires_grad_(true);
      std::vector<torch::Tensor> x{v.to(fp64 ? torch::kFloat64 : dt), beta.to(fp64 ? torch::kFloat64 : torch::kFloat32),
                                   g.to(fp64 ? torch::kFloat64 : torch::kFloat32)};
      for (auto& t : x) t = t.clone().requires_grad_(true);
      auto q = qk_in.narrow(2, 0, Kg).view({c.B, c.T, c.H, c.dk});
      auto k = qk_in.narrow(2, Kg, Kg).view({c.B, c.T, c.H, c.dk});
      if (!inside) {
        q = model::fused_l2_norm(q, 1e-6, x_dt);
        k = model::fused_l2_norm(k, 1e-6, x_dt);
      }
      const auto out = model::gdr_forward_chunked(q, k, x[0], x[1], x[2], 1.0 / std::sqrt(double(c.dk)), {}, cu, 64,
                                                  c.tf32_scan && !fp64, false, nullptr, true,
                                                  model::GdrQkNorm{inside, 1e-6, x_dt});
      auto loss = (out.h.to(torch::kFloat64) * dH).sum();
      if (c.o_grad) loss = loss + (out.o.to(torch::kFloat64) * dO.to(torch::kFloat64)).sum();
      loss.backward();
      const auto dqk = qk_in.grad();
      return std::vector<torch::Tensor>{out.o, out.h, dqk.narrow(2, 0, Kg), dqk.narrow(2, Kg, Kg), x[0].grad(),
                                        x[1].grad(), x[2].grad()};
    };
    const char* const names[] = {"o", "h", "dq", "dk", "dv", "dbeta", "dg"};
    const auto before = run(false, false);
    const int64_t taken = model::gdr_tail_norm_launches(), front_norms = model::gdr_front_norms();
    const auto inside = run(true, false);
    EXPECT_EQ(model::gdr_tail_norm_launches() - taken, c.in_tail ? 1 : 0) << name;
    // The forward's norm inside the front kernel on the 16-bit path (dk 64, 96, 128): the norm
    // kernel's arithmetic in its order, so every result is the same bits as with that kernel, but
    // for dβ and dg, the tail's atomic sums (1e-6).
    const bool in_front = c.bf16 && c.tf32_scan && (c.dk == 64 || c.dk == 96 || c.dk == 128);
    EXPECT_EQ(model::gdr_front_norms() - front_norms, in_front ? 1 : 0) << name << ": the front's norm";
    if (in_front) {
      model::gdr_l2norm_in_front(false);
      const auto norm_kernel = run(true, false);
      model::gdr_l2norm_in_front(true);
      for (size_t i = 0; i < norm_kernel.size(); ++i) {
        if (i == 5 || i == 6) {
          EXPECT_LT(rel_norm_diff(inside[i], norm_kernel[i]), 1e-6) << name << ": " << names[i];
        } else {
          EXPECT_TRUE(torch::equal(inside[i], norm_kernel[i]))
              << name << ": the front's norm against the norm's kernel, " << names[i];
        }
      }
    }
    const auto ref = c.in_tail ? run(false, true) : std::vector<torch::Tensor>{};
    for (size_t i = 0; i < 7; ++i) {
      const double e = rel_norm_diff(inside[i], before[i]);
      if (i == 2 && !c.o_grad) {
        // q reaches the loss only through o.
        EXPECT_EQ(inside[i].abs().max().item<double>(), 0.0) << name << ": dq";
        EXPECT_EQ(before[i].abs().max().item<double>(), 0.0) << name << ": dq";
      } else if ((i == 2 || i == 3) && c.in_tail) {
        EXPECT_LT(e, 4e-3) << name << ": " << names[i];
        const double e_inside = rel_norm_diff(inside[i].to(torch::kFloat64), ref[i]);
        const double e_before = rel_norm_diff(before[i].to(torch::kFloat64), ref[i]);
        EXPECT_LT(e_inside, 1.1 * e_before + 1e-4) << name << ": " << names[i];
        std::printf("[gdr_chunk] L2Norm in the tail, %s: %s %.1e from the norm's kernel; from fp64 %.1e (norm's "
                    "kernel %.1e)\n", name.c_str(), names[i], e, e_inside, e_before);
      } else if (i == 5 || i == 6) {
        EXPECT_LT(e, 1e-6) << name << ": " << names[i];
      } else {
        EXPECT_TRUE(torch::equal(inside[i], before[i])) << name << ": " << names[i] << " differs by " << e;
      }
    }
    if (c.in_tail) {
      // With the fixed head sizes' instances off, the tail's general instance runs, which does not
      // take the norm: the norm's own backward after it, so q and k's gradients are the separate
      // op's to the bit.
      kernels::gdr_fixed_head_sizes(false);
      const auto before_off = run(false, false);
      const int64_t taken_off = model::gdr_tail_norm_launches();
      const auto inside_off = run(true, false);
      kernels::gdr_fixed_head_sizes(true);
      EXPECT_EQ(model::gdr_tail_norm_launches(), taken_off) << name << ": the general instance took the norm";
      EXPECT_TRUE(torch::equal(inside_off[2], before_off[2]) && torch::equal(inside_off[3], before_off[3]))
          << name << ": q and k's gradients differ without the fixed instances";
    }
  }
}

// The front's fixed-size instances taking q, k and v by 16-byte cp.async (kernels::
// gdr_chunk_copies16, on by default) against the same instances staging them through registers:
// the same values land in shared memory, so every result is the same bits, but for dβ and dg (the
// tail's atomic sums, 1e-6). The Gated DeltaNet's path: bf16 q | k read in place from
// the short conv's wider rows with the norm inside the core, the TF32 scan. Rows whose token
// stride is not a multiple of 8 elements (16 bytes) keep the register staging (counted: no
// copies taken), with the same results.
TEST(GdrScanCuda, CopiedRowsGiveTheRegisterStagedBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  struct Restore {
    ~Restore() { kernels::gdr_chunk_copies16(true); }
  } restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 967);
  struct CopyCase {
    int64_t B, T, H, dk, dv;
    std::vector<int64_t> cu;
    int64_t spare;  // columns after q | k in each row (a multiple of 8: the front's copies take them)
  };
  const CopyCase cases[] = {
      {1, 300, 2, 96, 192, {0, 17, 150, 151, 300}, 8},  // hybrid base's heads, packed
      {2, 150, 3, 96, 192, {}, 1152},                   // dense with a ragged chunk, v's width spare
      {2, 150, 2, 128, 256, {}, 8},                     // moe-1b's heads
      {1, 200, 2, 128, 128, {0, 70, 200}, 16},          // bench gdr's heads
      {1, 300, 2, 96, 192, {0, 17, 150, 151, 300}, 4},  // q | k rows 8-byte aligned only: registers
  };
  auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  for (const CopyCase& c : cases) {
    const std::string name = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " dk=" +
                             std::to_string(c.dk) + " dv=" + std::to_string(c.dv) + " spare=" +
                             std::to_string(c.spare) + (c.cu.empty() ? "" : " packed");
    const int64_t Kg = c.H * c.dk, n_state = c.cu.empty() ? c.B : static_cast<int64_t>(c.cu.size()) - 1;
    const auto bf = torch::kBFloat16;
    const auto qk = (torch::randn({c.B, c.T, 2 * Kg + c.spare}, f32) * (torch::rand({c.B, c.T, 1}, f32) * 3.0 + 0.1)).to(bf);
    const auto v = torch::randn({c.B, c.T, c.H, c.dv}, f32).to(bf);
    const auto beta = torch::sigmoid(torch::randn({c.B, c.T, c.H}, f32));
    const auto g = -torch::rand({c.B, c.T, c.H}, f32) * 0.5;
    const auto h0 = torch::randn({n_state, c.H, c.dk, c.dv}, f32) * 0.1;
    const auto dO = torch::randn({c.B, c.T, c.H, c.dv}, f32), dH = torch::randn({n_state, c.H, c.dk, c.dv}, f32);
    const torch::Tensor cu = c.cu.empty() ? torch::Tensor() : torch::tensor(c.cu, torch::kInt64);
    auto run = [&] {
      auto qk_in = qk.clone().requires_grad_(true);
      std::vector<torch::Tensor> x{v.clone(), beta.clone(), g.clone(), h0.clone()};
      for (auto& t : x) t.requires_grad_(true);
      const auto q = qk_in.narrow(2, 0, Kg).view({c.B, c.T, c.H, c.dk});
      const auto k = qk_in.narrow(2, Kg, Kg).view({c.B, c.T, c.H, c.dk});
      const auto out = model::gdr_forward_chunked(q, k, x[0], x[1], x[2], 1.0 / std::sqrt(double(c.dk)), x[3], cu, 64,
                                                  /*tf32_scan=*/true, false, nullptr, true,
                                                  model::GdrQkNorm{true, 1e-6, bf});
      ((out.o.to(torch::kFloat32) * dO).sum() + (out.h * dH).sum()).backward();
      const auto dqk = qk_in.grad();
      return std::vector<torch::Tensor>{out.o, out.h, dqk.narrow(2, 0, Kg), dqk.narrow(2, Kg, Kg), x[0].grad(),
                                        x[1].grad(), x[2].grad(), x[3].grad()};
    };
    const char* const names[] = {"o", "h", "dq", "dk", "dv", "dbeta", "dg", "dh0"};
    kernels::gdr_chunk_copies16(false);
    const int64_t before_off = kernels::gdr_chunk_copies16_launches();
    const auto staged = run();
    EXPECT_EQ(kernels::gdr_chunk_copies16_launches(), before_off) << name << ": copies taken with the switch off";
    kernels::gdr_chunk_copies16(true);
    const int64_t before_on = kernels::gdr_chunk_copies16_launches();
    const auto copied = run();
    EXPECT_EQ(kernels::gdr_chunk_copies16_launches() - before_on, c.spare % 8 == 0 ? 1 : 0)
        << name << ": the front's launches copied";
    for (size_t i = 0; i < staged.size(); ++i) {
      ASSERT_TRUE(staged[i].defined() && copied[i].defined()) << name << ": " << names[i];
      if (i == 5 || i == 6) {
        EXPECT_LT(rel_norm_diff(copied[i], staged[i]), 1e-6) << name << ": " << names[i];
      } else {
        EXPECT_TRUE(torch::equal(copied[i], staged[i]))
            << name << ": " << names[i] << " differs by " << rel_norm_diff(copied[i], staged[i]);
      }
    }
  }
}

// A 16-bit path's switch (on by default) tested as a whole op: each case run with it off, then on,
// on the 16-bit training path (bf16 q, k, v, TF32 scan, bf16 states); dense with a ragged chunk at
// bench gdr's heads, packed at hybrid base's with an initial state. Returns, per case and output
// (kChunkOutputNames), the relative difference between the two runs; leaves the switch on.
std::vector<std::vector<double>> switch_differences(void (*set_switch)(bool), uint64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + seed);
  const ChunkCase cases[] = {
      {2, 150, 3, 128, 128, 64, {}, true, true, false, 0, false, true},
      {1, 300, 2, 96, 192, 64, {0, 17, 150, 151, 300}, true, true, true, 0, false, true},
  };
  std::vector<std::vector<double>> out;
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    set_switch(false);
    const auto want = r.run();
    set_switch(true);
    const auto got = r.run();
    std::vector<double> diff;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(got[i].defined() && want[i].defined()) << c.name() << ": " << kChunkOutputNames[i];
      if (!got[i].defined() || !want[i].defined()) return out;
      EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << c.name() << ": " << kChunkOutputNames[i];
      diff.push_back(rel_norm_diff(got[i], want[i]));
    }
    std::printf("[gdr_chunk]   %s:", c.name().c_str());
    for (size_t i = 0; i < diff.size(); ++i) std::printf(" %s %.1e", kChunkOutputNames[i], diff[i]);
    std::printf("\n");
    out.push_back(diff);
  }
  return out;
}

// switch_differences for a switch with a launch counter (kLaunches) of the path it turns on: the
// switch goes through a wrapper that counts the launches made while it was off (the runs between
// switching off and on), which must be none, and all the launches of the runs, which must be one
// per run with the switch on (one per case). `path` names the path in the failure messages.
template <void (*kSet)(bool), int64_t (*kLaunches)()>
std::vector<std::vector<double>> counted_switch_differences(uint64_t seed, const char* path) {
  static int64_t at_off = 0, off = 0;
  off = 0;
  auto counted = [](bool on) {
    if (on) {
      off += kLaunches() - at_off;
    } else {
      at_off = kLaunches();
    }
    kSet(on);
  };
  const int64_t before = kLaunches();
  auto diffs = switch_differences(counted, seed);
  EXPECT_EQ(off, 0) << path << " ran with the switch off";
  EXPECT_EQ(kLaunches() - before, static_cast<int64_t>(diffs.size())) << "not one launch of " << path
                                                                      << " per run with the switch on";
  return diffs;
}

// No initial state (h0 undefined) starts every document from zero states without a tensor of
// zeros, where the forward scan's kernel takes none (the output as chunk rows, the training path):
// the same bits as an explicit h0 of zeros, forward and backward (but dβ and dg, whose atomic sums
// differ by order: 1e-6), with the output as rows and in token order, packed and dense.
TEST(GdrScanCuda, NoInitialStateMatchesZeroStates) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 577);
  auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const int64_t H = 2, dk = 96, dv = 192;
  for (const bool packed : {true, false}) {
    for (const bool rows : {true, false}) {
      const int64_t B = packed ? 1 : 2, T = packed ? 300 : 150;
      const torch::Tensor cu = packed ? torch::tensor(std::vector<int64_t>{0, 17, 150, 151, 300}) : torch::Tensor();
      const int64_t n_docs = packed ? 4 : B;
      const std::string name = std::string(packed ? "packed" : "dense") + (rows ? ", output as rows" : ", tokens");
      auto unit = [](const torch::Tensor& x) { return x / x.norm(2, -1, true); };
      const auto q = unit(torch::randn({B, T, H, dk}, f32)).to(torch::kBFloat16);
      const auto k = unit(torch::randn({B, T, H, dk}, f32)).to(torch::kBFloat16);
      const auto v = torch::randn({B, T, H, dv}, f32).to(torch::kBFloat16);
      const auto beta = torch::sigmoid(torch::randn({B, T, H}, f32)), g = -torch::rand({B, T, H}, f32) * 0.5;
      const auto dO = torch::randn({2048, dv}, f32);  // as many rows as the output has, tokens or chunk rows
      const auto dH = torch::randn({n_docs, H, dk, dv}, f32);
      auto run = [&](bool zeros) {
        std::vector<torch::Tensor> x{q.clone(), k.clone(), v.clone(), beta.clone(), g.clone()};
        for (auto& t : x) t.requires_grad_(true);
        const torch::Tensor h0 = zeros ? torch::zeros({n_docs, H, dk, dv}, f32) : torch::Tensor();
        const int64_t in_scan = model::gdr_scan_output_launches();
        const auto out = model::gdr_forward_chunked(x[0], x[1], x[2], x[3], x[4], 0.125, h0, cu, 64, true, rows);
        // The rows' path: the scan with the output, which takes no tensor of zero states.
        EXPECT_EQ(model::gdr_scan_output_launches() - in_scan, rows ? 1 : 0) << name;
        const auto o = rows ? out.o_rows : out.o.reshape({-1, dv});
        auto loss = (o.to(torch::kFloat32) * dO.narrow(0, 0, o.size(0))).sum() + (out.h * dH).sum();
        loss.backward();
        return std::vector<torch::Tensor>{o, out.h, x[0].grad(), x[1].grad(), x[2].grad(), x[3].grad(), x[4].grad()};
      };
      const auto none = run(false), zeros = run(true);
      const char* const names[] = {"o", "h", "dq", "dk", "dv", "dbeta", "dg"};
      for (size_t i = 0; i < none.size(); ++i) {
        if (i >= 5) {
          EXPECT_LT(rel_norm_diff(none[i], zeros[i]), 1e-6) << name << ": " << names[i];
        } else {
          EXPECT_TRUE(torch::equal(none[i], zeros[i])) << name << ": " << names[i];
        }
      }
    }
  }
}

// The fused backward's five intermediates in bf16 (dU, dQg, dKd, dW, dRw; model::gdr_bf16_chunk_grads,
// the default on the 16-bit training path) against the same run with them in fp32: the forward is
// the same to the bit, and every gradient stays within the bf16 rounding the inputs' own gradients
// carry (4e-3, the bound the fused-vs-separate test gives 16-bit gradients). dβ and dg, fp32 sums
// over the chunk of terms each rounded in bf16 where they cancel, spread wider from run to run
// (2.0e-3 to 4.2e-3 for dβ on an H200, inputs fresh each run), so they get 8e-3. And the switch
// does change dβ and dg (a path not taken would give 0 difference).
TEST(GdrScanCuda, Bf16ChunkGradsStayCloseToFp32Ones) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] bf16 against fp32 chunk gradients:\n");
  for (const auto& d : switch_differences(model::gdr_bf16_chunk_grads, 613)) {
    for (size_t i = 0; i < d.size(); ++i) {
      const bool gate_sum = i == 5 || i == 6;  // dbeta, dg
      EXPECT_LT(d[i], i < 2 ? 1e-7 : gate_sum ? 8e-3 : 4e-3) << kChunkOutputNames[i];
    }
    EXPECT_GT(std::max(d[5], d[6]), 1e-7) << "dβ and dg did not change, so the bf16 path was not taken";
  }
}

// The reverse scan's products in bf16 (model::gdr_bf16_scan_products, the default on the 16-bit
// training path) against TF32 ones, through the whole op: the forward is the same to the bit (it
// does not run the reverse scan), every gradient within the 16-bit bound above (4e-3) but dβ and dg
// (8e-3, as above: with the warp-column reverse scan dβ measured 5.0e-3 in one run on an H200), dβ
// and dg changed, and the bf16 scan ran (its launch counter) only with the switch on.
TEST(GdrScanCuda, Bf16ScanProductsStayCloseToTf32Ones) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] bf16 against TF32 reverse-scan products:\n");
  const auto diffs = counted_switch_differences<model::gdr_bf16_scan_products,
                                                model::gdr_scan_bf16_product_launches>(877, "the bf16 scan");
  for (const auto& d : diffs) {
    for (size_t i = 0; i < d.size(); ++i) {
      const bool gate_sum = i == 5 || i == 6;  // dbeta, dg
      EXPECT_LT(d[i], i < 2 ? 1e-7 : gate_sum ? 8e-3 : 4e-3) << kChunkOutputNames[i];
    }
    EXPECT_GT(std::max(d[5], d[6]), 1e-7) << "dβ and dg did not change";
  }
}

// The forward scan's products in bf16 (model::gdr_bf16_forward_scan_products, the default on the
// 16-bit training path) against TF32 ones, through the whole op: the output, the final state and
// every gradient (which read the forward's states) within the 16-bit bound (4e-3), the output
// changed, and the bf16 forward scan ran (its launch counter) only with the switch on.
TEST(GdrScanCuda, Bf16ForwardScanProductsStayCloseToTf32Ones) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] bf16 against TF32 forward-scan products:\n");
  const auto diffs = counted_switch_differences<model::gdr_bf16_forward_scan_products,
                                                model::gdr_scan_bf16_forward_launches>(883, "the bf16 forward scan");
  for (const auto& d : diffs) {
    for (size_t i = 0; i < d.size(); ++i) EXPECT_LT(d[i], 4e-3) << kChunkOutputNames[i];
    EXPECT_GT(std::max(d[0], d[1]), 1e-7) << "o and h did not change";
  }
}

// The backward's products with the chunk states in bf16 (model::gdr_bf16_state_grads_products,
// the default on the 16-bit training path: dO rounded to bf16 as an operand) against TF32 ones,
// through the whole op: the forward the same to the bit (it does not run them), every gradient
// within the 16-bit bound (4e-3), dq changed (dQg and dP_raw come from those products), and the
// bf16 form ran (its launch counter) only with the switch on, once per backward.
TEST(GdrScanCuda, Bf16StateGradsProductsStayCloseToTf32Ones) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] bf16 against TF32 products with the chunk states:\n");
  const auto diffs = counted_switch_differences<model::gdr_bf16_state_grads_products,
                                                model::gdr_state_grads_bf16_launches>(887, "the bf16 state products");
  for (const auto& d : diffs) {
    for (size_t i = 0; i < d.size(); ++i) EXPECT_LT(d[i], i < 2 ? 1e-7 : 4e-3) << kChunkOutputNames[i];
    EXPECT_GT(d[2], 1e-7) << "dq did not change";
  }
}

// dq and dk's products in the backward's tail as bf16 mma (model::gdr_bf16_tail_products, the
// default on the 16-bit training path: dS and dPm rounded to bf16) against their split-TF32 form:
// the forward the same to the bit; dq and dk within the 16-bit bound (4e-3) and changed; the other
// gradients do not come from those products and differ only by the order of the tail's per-row
// shared-memory sums (1e-5).
TEST(GdrScanCuda, Bf16TailProductsStayCloseToSplitOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] bf16 against split-TF32 products in the backward's tail:\n");
  for (const auto& d : switch_differences(model::gdr_bf16_tail_products, 941)) {
    for (size_t i = 0; i < d.size(); ++i) {
      EXPECT_LT(d[i], i < 2 ? 1e-7 : (i == 2 || i == 3) ? 4e-3 : 1e-5) << kChunkOutputNames[i];
    }
    EXPECT_GT(std::max(d[2], d[3]), 1e-6) << "dq and dk did not change, so the bf16 products were not taken";
  }
}

// The chunk kernels' instances compiled for the model's head sizes (kernels::gdr_fixed_head_sizes:
// the front, the state products, the solve's backward and the tail on the 16-bit path) against the
// instances that read the sizes as arguments, through the whole op on that path at each of those
// sizes: bench gdr's dense with a ragged chunk, hybrid base's packed with an initial state, moe-1b's
// packed. The same arithmetic in the same order, so every output and gradient the same to the bit,
// but dβ and dg: the tail adds their per-row terms into shared memory by atomics, in an order that
// changes from run to run (1.7e-8 apart at most in these runs, on an H200), so they get 1e-6; and
// each of the six kernels' fixed instances launched (its counter) with the switch on, none off.
// The forward scan is its block kernel's here (the warp-column kernel off, whose only instances are
// fixed sizes; WarpColumnForwardScanMatchesTheRecurrence tests it), and the state products take a
// block for each half of dk, as the general instance does (a whole row a block sums ddecay in
// another order; GdrStateGradsCuda.WholeRowBlocksGiveTheSameTiles tests it).
TEST(GdrScanCuda, FixedHeadSizeKernelsMatchTheGeneralOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  struct Restore {
    ~Restore() {
      kernels::gdr_fixed_head_sizes(true);
      kernels::gdr_scan_warp_columns(true);
      kernels::gdr_chunk_solve_backward_overlap(true);
      kernels::gdr_chunk_state_grads_whole_row(true);
    }
  } restore;
  kernels::gdr_chunk_state_grads_whole_row(false);
  // The overlapped solve (its own test below) rounds differently from the general instance.
  kernels::gdr_chunk_solve_backward_overlap(false);
  kernels::gdr_scan_warp_columns(false);  // the forward scan's block kernel, whose fixed instances these are
  using K = kernels::GdrSizedKernel;
  const std::pair<K, const char*> kernels_named[] = {{K::kFront, "front"},
                                                     {K::kStateGrads, "state products"},
                                                     {K::kSolveBackward, "solve's backward"},
                                                     {K::kTail, "tail"},
                                                     {K::kScanForward, "forward scan"},
                                                     {K::kScanReverse, "reverse scan"}};
  const auto launches = [&] {
    std::vector<int64_t> n;
    for (const auto& kn : kernels_named) n.push_back(kernels::gdr_fixed_head_size_launches(kn.first));
    return n;
  };
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 953);
  const ChunkCase cases[] = {
      {2, 150, 3, 128, 128, 64, {}, true, true, false, 0, false, true},
      {1, 300, 2, 96, 192, 64, {0, 17, 150, 151, 300}, true, true, true, 0, false, true},
      {1, 200, 2, 128, 256, 64, {0, 70, 200}, true, true, true, 0, false, true},
  };
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    kernels::gdr_fixed_head_sizes(false);
    const auto before_off = launches();
    const auto want = r.run();
    EXPECT_EQ(launches(), before_off) << c.name() << ": fixed sizes launched with the switch off";
    kernels::gdr_fixed_head_sizes(true);
    const auto before_on = launches();
    const auto got = r.run();
    const auto after_on = launches();
    for (size_t k = 0; k < after_on.size(); ++k) {
      EXPECT_GE(after_on[k] - before_on[k], 1) << c.name() << ": the " << kernels_named[k].second
                                               << "'s fixed sizes not launched";
    }
    expect_same_bits_but_atomic_sums(c, got, want, 0);
  }
}

// The output in bf16 (model::gdr_bf16_output: on the 16-bit path, with the output as chunk rows, as
// the Gated DeltaNet takes it) against fp32: the output product's fp32 result rounded once, to the
// bit. The backward's readers of the output gradient, the reverse scan and the state products,
// round an fp32 one to bf16 (to nearest even) for their products, so they take the bf16 gradient
// with the same bits: every gradient the same, but dβ and dg (the tail's atomics, 1e-6). fp32 v
// (not the 16-bit path) keeps an fp32 output with the switch on.
TEST(GdrScanCuda, Bf16OutputIsTheFp32OutputRounded) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  struct Restore {
    ~Restore() {
      model::gdr_bf16_output(true);
      kernels::gdr_scan_warp_columns(true);
    }
  } restore;
  // The reverse scan's block kernel on both sides: the warp-column kernel takes only the bf16 one.
  kernels::gdr_scan_warp_columns(false);
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 959);
  const ChunkCase cases[] = {
      {1, 300, 2, 96, 192, 64, {0, 17, 150, 151, 300}, true, true, true, 0, false, true, true},
      {2, 150, 3, 128, 128, 64, {}, true, true, false, 0, false, true, true},
      {1, 200, 2, 64, 48, 64, {0, 70, 200}, true, true, false, 0, false, true, true},
      {1, 200, 2, 64, 48, 64, {0, 70, 200}, true, false, false, 0, false, true, true},
  };
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    model::gdr_bf16_output(false);
    const auto want = r.run();
    model::gdr_bf16_output(true);
    const int64_t bf16_dO_before = model::gdr_scan_bf16_output_grad_launches();
    const auto got = r.run();
    EXPECT_EQ(want[0].scalar_type(), torch::kFloat32) << c.name();
    if (!c.v_bf16) {
      EXPECT_EQ(got[0].scalar_type(), torch::kFloat32) << c.name() << ": fp32 v keeps an fp32 output";
      EXPECT_TRUE(torch::equal(got[0], want[0])) << c.name();
      continue;
    }
    ASSERT_EQ(got[0].scalar_type(), torch::kBFloat16) << c.name();
    EXPECT_EQ(model::gdr_scan_bf16_output_grad_launches() - bf16_dO_before, 1) << c.name() << ": the scan's bf16 dO";
    EXPECT_TRUE(torch::equal(got[0], want[0].to(torch::kBFloat16))) << c.name() << ": o";
    expect_same_bits_but_atomic_sums(c, got, want, 1);
  }
}

// The chunk output taken in the forward scan (model::gdr_output_in_scan: on the 16-bit path with
// a bf16 output in chunk rows, where the warp-column forward scan runs with three buffers) against
// the separate output product: o from the same bf16 operands, its sums in another order, rounded
// once to bf16 (bound 2e-3 of the norm: values a bf16 step apart here and there; measured 8.7e-5);
// everything else the same to the bit (the scan's states and values come from the same code, and
// the backward reads o's gradient, not o) but dβ and dg (the tail's atomics, 1e-6); one such launch
// a run with the switch on, none off. Hybrid base's heads (96-column blocks) and dv 64 (one 64-column
// block); at dk 128 the output's tiles leave two buffers, so the product runs: o the same bits too.
TEST(GdrScanCuda, ChunkOutputInTheScanMatchesTheProduct) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  struct Restore {
    ~Restore() { model::gdr_output_in_scan(true); }
  } restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 971);
  struct OutputCase {
    ChunkCase c;
    bool taken;
  };
  const OutputCase cases[] = {
      {{1, 300, 2, 96, 192, 64, {0, 17, 150, 151, 300}, true, true, true, 0, false, true, true}, true},
      {{1, 200, 2, 96, 64, 64, {0, 70, 200}, true, true, false, 0, false, true, true}, true},
      {{2, 150, 3, 128, 128, 64, {}, true, true, false, 0, false, true, true}, false},
  };
  for (const auto& [c, taken] : cases) {
    const ChunkCaseRun r(c);
    model::gdr_output_in_scan(false);
    const int64_t before_off = model::gdr_scan_output_launches();
    const auto want = r.run();
    EXPECT_EQ(model::gdr_scan_output_launches(), before_off) << c.name() << ": the output in the scan, switched off";
    model::gdr_output_in_scan(true);
    const int64_t before_on = model::gdr_scan_output_launches();
    const auto got = r.run();
    EXPECT_EQ(model::gdr_scan_output_launches() - before_on, taken ? 1 : 0) << c.name() << ": the output in the scan";
    ASSERT_EQ(got[0].scalar_type(), torch::kBFloat16) << c.name();
    if (!taken) {
      expect_same_bits_but_atomic_sums(c, got, want, 0);
      continue;
    }
    const double e = rel_norm_diff(got[0].to(torch::kFloat32), want[0].to(torch::kFloat32));
    EXPECT_LT(e, 2e-3) << c.name() << ": o";
    std::printf("[gdr_chunk] %s: o in the scan against the product %.1e\n", c.name().c_str(), e);
    expect_same_bits_but_atomic_sums(c, got, want, 1);
  }
}

// The solve's backward on bf16 tiles (model::gdr_bf16_solve_tiles, the default on the 16-bit
// training path with bf16 q, k, v) against its fp32 tiles: dTm's products multiply the same bf16
// values exactly either way and only the order of their fp32 sums changes. So the forward is the
// same to the bit, every gradient within a few bf16 roundings that land the other way (1e-3 of
// the norm), dβ and dg, fp32 sums downstream of dTm, differ, and the bf16 tiles ran (their launch
// counter) only with the switch on, once per backward.
TEST(GdrScanCuda, Bf16SolveTilesMatchFp32Ones) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] the solve's backward on bf16 against fp32 tiles:\n");
  const auto diffs = counted_switch_differences<model::gdr_bf16_solve_tiles,
                                                model::gdr_bf16_solve_tile_launches>(947, "the bf16 tiles");
  for (const auto& d : diffs) {
    for (size_t i = 0; i < d.size(); ++i) EXPECT_LT(d[i], i < 2 ? 1e-7 : 1e-3) << kChunkOutputNames[i];
    EXPECT_GT(std::max(d[5], d[6]), 0.0) << "dβ and dg the same to the bit: the bf16 tiles were not taken";
  }
}

// The solve's backward with its copies overlapped (kernels::gdr_chunk_solve_backward_overlap, hybrid
// base's heads) against the general bf16-tile instance: Tmᵀ dW and Tmᵀ dU take the same bf16 parts
// of Tm in the same order, so the forward, dq, dv and dh0 are the same bits; dTm is summed in
// registers (dW Kᵀ's columns scaled by exp γ, then three 64-column panels, b last) where the general
// instance scales each part as it adds it in shared memory, and X, dA take bf16 parts where TF32
// rounded, so dk, dβ and dg move by a few of TF32's roundings (1e-3 of the norm), dk measurably.
TEST(GdrScanCuda, OverlappedSolveStaysCloseToTheGeneralOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  std::printf("[gdr_chunk] the solve's backward overlapped against the general instance:\n");
  const auto diffs = switch_differences(kernels::gdr_chunk_solve_backward_overlap, 965);
  ASSERT_EQ(diffs.size(), 2u);
  const auto& d = diffs[1];  // hybrid base's heads (the first case, bench gdr's, runs the same kernel twice)
  for (size_t i = 0; i < d.size(); ++i) {
    const bool same = i < 3 || i == 4 || i == 7;  // o, h, dq, dv, dh0
    EXPECT_LT(d[i], same ? 1e-30 : 1e-3) << kChunkOutputNames[i];
  }
  EXPECT_GT(d[3], 0.0) << "dk the same to the bit: the overlapped instance did not run";
  // bench gdr's heads take the general instance either way: the same bits but the tail's atomic sums.
  for (size_t i = 0; i < diffs[0].size(); ++i) {
    EXPECT_LE(diffs[0][i], i == 5 || i == 6 ? 1e-6 : 0.0) << "bench gdr's heads: " << kChunkOutputNames[i];
  }
}

// The masks' decays e^(γ_i − γ_j) in the front's and the tail's fixed-size instances by ex2.approx
// (kernels::gdr_chunk_fast_decay, on by default) against expf, at hybrid base's and bench gdr's
// heads on the 16-bit training path: the two agree to a few ulp (often to the bit), which moves a
// value across a bf16 rounding now and then (P, W and U are stored in bf16; dS and dPm taken as
// bf16 products). In three runs on an H200 o differed by at most 1.2e-5 of its norm and the
// gradients by at most 4.4e-5 (dq); the bounds are 1e-4 for o and h and 1e-3 for the gradients,
// the bound the 16-bit path's other switches give a gradient. 4096 tokens a case, so that some
// deterministic output does differ (the fast decay ran), and expf ran (its counter) only with the
// switch off, in the front and the tail of every such run.
TEST(GdrScanCuda, FastDecayStaysCloseToExpf) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  struct Restore {
    ~Restore() { kernels::gdr_chunk_fast_decay(true); }
  } restore;
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 983);
  const ChunkCase cases[] = {
      {2, 2048, 2, 96, 192, 64, {}, true, true, true, 0, false, true},
      {1, 4096, 2, 96, 192, 64, {0, 17, 1500, 1501, 4096}, true, true, true, 0, false, true},
      {2, 2048, 2, 128, 128, 64, {}, true, true, false, 0, false, true},
  };
  std::printf("[gdr_chunk] the masks' decays by ex2.approx against expf:\n");
  double deterministic = 0.0;  // the largest difference of o, h, dq, dk, dv, dh0 over the cases
  for (const ChunkCase& c : cases) {
    const ChunkCaseRun r(c);
    kernels::gdr_chunk_fast_decay(false);
    const int64_t before_off = kernels::gdr_chunk_exact_decay_launches();
    const auto exact = r.run();
    EXPECT_GE(kernels::gdr_chunk_exact_decay_launches() - before_off, 2) << c.name() << ": expf not taken";
    kernels::gdr_chunk_fast_decay(true);
    const int64_t before_on = kernels::gdr_chunk_exact_decay_launches();
    const auto fast = r.run();
    EXPECT_EQ(kernels::gdr_chunk_exact_decay_launches(), before_on) << c.name() << ": expf taken with the switch on";
    std::printf("[gdr_chunk]   %s:", c.name().c_str());
    for (size_t i = 0; i < exact.size(); ++i) {
      ASSERT_TRUE(exact[i].defined() == fast[i].defined()) << c.name() << ": " << kChunkOutputNames[i];
      if (!exact[i].defined()) continue;
      const double d = rel_norm_diff(fast[i], exact[i]);
      std::printf(" %s %.1e", kChunkOutputNames[i], d);
      EXPECT_LT(d, i < 2 ? 1e-4 : 1e-3) << c.name() << ": " << kChunkOutputNames[i];
      if (i != 5 && i != 6) deterministic = std::max(deterministic, d);  // not dβ, dg (atomic sums)
    }
    std::printf("\n");
  }
  EXPECT_GT(deterministic, 0.0) << "every deterministic output the same to the bit: the fast decay did not run";
}

// The output product writing straight into token order (gdr_chunk_row_targets, the epilogue's row
// map) against the chunk rows copied into token order: bit for bit, forward and every input
// gradient, dense with a padded last chunk and packed, with TF32 products and bf16 states (the
// bf16-training path) and with split products.
TEST(GdrScanCuda, OutputWrittenIntoTokenOrderMatchesTheCopy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 917);
  struct Shape {
    int64_t B, T;
    std::vector<int64_t> cu;  // empty: dense
  };
  auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  for (const Shape& sh : {Shape{2, 200, {}}, Shape{1, 300, {0, 17, 150, 151, 300}}}) {
    for (const bool tf32 : {true, false}) {
      const int64_t H = 3, dk = 64, dv = 48, C = 64;
      const auto cu = sh.cu.empty() ? torch::Tensor() : torch::tensor(sh.cu, torch::kInt64);
      auto layout = model::gdr_chunk_layout(sh.B, sh.T, H, C, cu, torch::Device(torch::kCUDA));
      layout.scan.tf32_products = tf32;
      layout.scan.bf16_states = tf32;
      auto unit = [](const torch::Tensor& x) { return x / x.norm(2, -1, true); };
      const auto q = unit(torch::randn({sh.B, sh.T, H, dk}, opt)), k = unit(torch::randn({sh.B, sh.T, H, dk}, opt));
      const auto v = torch::randn({sh.B, sh.T, H, dv}, opt), beta = torch::rand({sh.B, sh.T, H}, opt);
      const auto g = -torch::rand({sh.B, sh.T, H}, opt) * 0.1;
      const auto grad_o = torch::randn({sh.B, sh.T, H, dv}, opt);
      const std::vector<torch::Tensor> x{q, k, v, beta, g};
      const auto copied = testing_support::gdr_token_output_and_grads(x, layout, 0.125, grad_o, false);
      const auto direct = testing_support::gdr_token_output_and_grads(x, layout, 0.125, grad_o, true);
      const std::string what = std::string(sh.cu.empty() ? "dense" : "packed") + (tf32 ? ", tf32" : ", split");
      ASSERT_EQ(direct[0].sizes(), (std::vector<int64_t>{sh.B, sh.T, H, dv})) << what;
      EXPECT_TRUE(torch::equal(direct[0], copied[0])) << what << ": o";
      // Some of the delta rule's backward kernels sum with atomics in whatever order the GPU runs
      // them, so the gradients are compared to fp32 rounding rather than bit for bit.
      for (size_t i = 1; i < direct.size(); ++i) {
        EXPECT_LT(rel_norm_diff(direct[i], copied[i]), 1e-6) << what << ": gradient " << i;
      }
    }
  }
}

// A fixed layout's row map (GdrChunkLayout::row_map) has the delta rule's backward skip the padding
// rows of its output's gradient (as chunk rows, the training path), which the output norm then
// leaves unwritten: with NaN in those rows the input gradients are the ones the zeroed rows give
// without the map (but dβ and dg, whose atomic sums differ by order: 1e-6), and without the map
// the NaN reaches them (what the zeroing was for).
TEST(GdrScanCuda, RowMapSkipsThePaddingRowsOfTheOutputGradient) {
#if !defined(DD_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 941);
  const int64_t B = 2, Trow = 300, T = B * Trow, C = 64, pieces = 8, H = 2, dk = 96, dv = 192;
  auto cu = torch::full({pieces + 1}, T, torch::kInt64);
  const std::vector<int64_t> packing{0, 17, 150, 151, 300, 420, 600};
  cu.narrow(0, 0, static_cast<int64_t>(packing.size())).copy_(torch::tensor(packing, torch::kInt64));
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  auto unit = [](const torch::Tensor& y) { return y / y.norm(2, -1, true); };
  const std::vector<torch::Tensor> in = {unit(torch::randn({1, T, H, dk}, f32)).to(torch::kBFloat16),
                                         unit(torch::randn({1, T, H, dk}, f32)).to(torch::kBFloat16),
                                         torch::randn({1, T, H, dv}, f32).to(torch::kBFloat16),
                                         torch::rand({1, T, H}, f32), -torch::rand({1, T, H}, f32) * 0.1};
  model::GdrPlanSlots slots(B, Trow, pieces, torch::Device(torch::kCUDA, 0));
  slots.set_batch(cu);
  const auto g_tokens = torch::randn({T * H, dv}, f32);
  // The switches back on however the test ends.
  struct Restore {
    ~Restore() {
      model::gdr_output_grad_row_map(true);
      model::gdr_use_kernels(true);
    }
  } restore;
  // The five input gradients with the output's gradient in chunk rows: the token rows' values, and
  // `pad` in the rows no token names.
  auto run = [&](bool row_map, float pad) {
    model::gdr_output_grad_row_map(row_map);
    std::vector<torch::Tensor> x;
    for (const auto& t : in) x.push_back(t.clone().requires_grad_(true));
    const auto r = model::gdr_forward_chunked(x[0], x[1], x[2], x[3], x[4], 0.125, {}, cu, C, true, true, &slots,
                                              /*final_state=*/false);
    EXPECT_EQ(r.o_pad_rows_unread, row_map);
    auto g_rows = torch::full({r.o_rows.size(0), dv}, pad, f32);
    g_rows.index_copy_(0, r.o_row.reshape({-1}).to(torch::kInt64), g_tokens);
    return torch::autograd::grad({(r.o_rows.to(torch::kFloat32) * g_rows).sum()}, x);
  };
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  // The kernels, and the ATen paths the core falls back to (which read the map as gathered rows).
  for (const bool kernels : {true, false}) {
    model::gdr_use_kernels(kernels);
    const std::string path = kernels ? "kernels" : "ATen paths";
    const auto skipped = run(true, nan), zeroed = run(false, 0.f), unskipped = run(false, nan);
    const char* const names[] = {"dq", "dk", "dv", "dbeta", "dg"};
    bool nan_reached = false;
    for (size_t i = 0; i < skipped.size(); ++i) {
      EXPECT_TRUE(torch::isfinite(skipped[i]).all().item<bool>()) << path << ", " << names[i] << ": NaN read";
      if (i >= 3 || !kernels) {
        EXPECT_LT(rel_norm_diff(skipped[i], zeroed[i]), 1e-6) << path << ", " << names[i];
      } else {
        EXPECT_TRUE(torch::equal(skipped[i], zeroed[i])) << path << ", " << names[i];
      }
      nan_reached = nan_reached || !torch::isfinite(unskipped[i]).all().item<bool>();
    }
    EXPECT_TRUE(nan_reached) << path << ": without the row map the padding rows' NaN should reach the gradients";
  }
#endif
}

// Packed batches through a fixed chunk plan (model/gdr_plan_slots.h), captured once in a CUDA graph
// with the forward and the backward and replayed for three packings: each replay gives what that
// batch's own plan gives eagerly, the output and all five input gradients. So the kernels read each
// batch's plan from the slots' buffers, its spare chunks (no tokens) and empty documents included.
// fp32 inputs with split products and token-order output; bf16 q, k, v with TF32 products and the
// output as chunk rows (the training path); and the training path at hybrid base's head sizes with
// q and k's L2Norm inside the core, whose backward's tail then writes the norm's input gradients
// (GdrQkNorm; counted).
TEST(GdrScanCuda, FixedPlanReplayedInAGraphMatchesEachBatchPlan) {
#if !defined(DD_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 933);
  const int64_t B = 4, Trow = 300, T = B * Trow, C = 64, pieces = 12;
  const std::vector<std::vector<int64_t>> packings = {
      {0, 300, 600, 900, 1200},
      {0, 17, 150, 151, 300, 364, 600, 700, 701, 702, 900, 1000, 1200},  // 12 pieces: the room full
      {0, 1, 300, 600, 899, 900, 1200}};
  auto padded = [&](const std::vector<int64_t>& p) {
    auto cu = torch::full({pieces + 1}, T, torch::kInt64);
    cu.narrow(0, 0, static_cast<int64_t>(p.size())).copy_(torch::tensor(p, torch::kInt64));
    return cu;
  };
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  torch::cuda::synchronize();
  c10::cuda::CUDAStreamGuard on_side(c10::cuda::getStreamFromPool());  // captures need a side stream
  struct Config {
    bool training_path, norm_in_core;
    int64_t H, dk, dv;
  };
  for (const Config& cfg : {Config{false, false, 3, 64, 48}, Config{true, false, 3, 64, 48},
                            Config{true, true, 2, 96, 192}}) {
    const bool training_path = cfg.training_path;
    const int64_t H = cfg.H, dk = cfg.dk, dv = cfg.dv;
    const auto in_dt = training_path ? torch::kBFloat16 : torch::kFloat32;
    const model::GdrQkNorm qk_norm{cfg.norm_in_core, 1e-6, in_dt};
    // The graph's inputs: leaves whose values each batch copies in before the replay.
    std::vector<torch::Tensor> x = {torch::zeros({1, T, H, dk}, f32.dtype(in_dt)), torch::zeros({1, T, H, dk}, f32.dtype(in_dt)),
                                    torch::zeros({1, T, H, dv}, f32.dtype(in_dt)), torch::zeros({1, T, H}, f32),
                                    torch::zeros({1, T, H}, f32)};
    for (auto& t : x) t.requires_grad_(true);
    auto grad_o = torch::zeros({1, T, H, dv}, f32);
    auto fill = [&] {
      torch::NoGradGuard no_grad;
      // Unit rows, or with the norm inside the core its inputs: rows of any length.
      auto unit = [&](const torch::Tensor& y) {
        return cfg.norm_in_core ? y * (torch::rand({1, T, H, 1}, f32) * 3.0 + 0.1) : y / y.norm(2, -1, true);
      };
      x[0].copy_(unit(torch::randn({1, T, H, dk}, f32)));
      x[1].copy_(unit(torch::randn({1, T, H, dk}, f32)));
      x[2].copy_(torch::randn({1, T, H, dv}, f32));
      x[3].copy_(torch::rand({1, T, H}, f32));
      x[4].copy_(-torch::rand({1, T, H}, f32) * 0.1);
      grad_o.copy_(torch::randn_like(grad_o));
    };
    // o in token order, then the five input gradients.
    auto run = [&](const torch::Tensor& cu, model::GdrPlanSlots* slots) {
      auto r = model::gdr_forward_chunked(x[0], x[1], x[2], x[3], x[4], 0.125, {}, cu, C, training_path, training_path,
                                          slots, /*final_state=*/true, qk_norm);
      auto o = training_path ? r.o_rows.index_select(0, r.o_row.reshape({-1}).to(torch::kInt64)).view({1, T, H, dv})
                             : r.o;
      auto out = torch::autograd::grad({(o.to(torch::kFloat32) * grad_o).sum()}, x);
      out.insert(out.begin(), o.detach());
      if (slots != nullptr) out.push_back(r.h.detach());  // the final states, every document of the room
      return out;
    };
    model::GdrPlanSlots slots(B, Trow, pieces, torch::Device(torch::kCUDA, 0));
    fill();
    slots.set_batch(padded(packings[0]));
    const int64_t tail_norms = model::gdr_tail_norm_launches();
    run(padded(packings[0]), &slots);  // the eager warm-up a capture needs
    EXPECT_EQ(model::gdr_tail_norm_launches() - tail_norms, cfg.norm_in_core ? 1 : 0) << "the tail took the norm";
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    const auto replayed = run(padded(packings[0]), &slots);
    graph.capture_end();
    const char* names[] = {"o", "dq", "dk", "dv", "dbeta", "dg"};
    const double tol = training_path ? 1e-3 : 1e-5;  // atomics' order, then bf16 gradients
    for (size_t p = 0; p < packings.size(); ++p) {
      fill();
      slots.set_batch(padded(packings[p]));
      graph.replay();
      const auto want = run(torch::tensor(packings[p], torch::kInt64), nullptr);
      // The dummy and empty documents after the batch's own keep zero states (the front gives a
      // spare chunk what a chunk of zero rows gives, without its products; the backward's chunk
      // kernels skip it).
      const int64_t n_docs = static_cast<int64_t>(packings[p].size()) - 1;
      const auto& h = replayed.back();
      EXPECT_EQ(h.narrow(0, n_docs, h.size(0) - n_docs).abs().max().item<double>(), 0.0)
          << "the dummy documents' states, packing " << p;
      for (size_t i = 0; i < want.size(); ++i) {
        const double e = rel_norm_diff(replayed[i], want[i]);
        EXPECT_LT(e, tol) << names[i] << ", packing " << p << (training_path ? ", bf16 inputs" : ", fp32 inputs")
                          << (cfg.norm_in_core ? ", L2Norm in the core" : "");
      }
      if (p > 0) {
        // The packings differ enough that the capture's plan would not pass for this one's.
        const auto other = run(torch::tensor(packings[0], torch::kInt64), nullptr);
        EXPECT_GT(rel_norm_diff(other[0], want[0]), 1e-2) << "packing " << p;
      }
      std::printf("fixed plan in a graph, packing %zu, %s%s: o %.2e, dq %.2e, dk %.2e, dg %.2e\n", p,
                  training_path ? "bf16 q, k, v" : "fp32", cfg.norm_in_core ? ", L2Norm in the core" : "",
                  rel_norm_diff(replayed[0], want[0]), rel_norm_diff(replayed[1], want[1]),
                  rel_norm_diff(replayed[2], want[2]), rel_norm_diff(replayed[5], want[5]));
    }
  }
#endif
}

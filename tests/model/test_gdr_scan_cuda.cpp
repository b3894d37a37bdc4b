// The gated delta rule's CUDA pieces against their ATen references on the same GPU, outputs and
// every input gradient: the chunk-state scan kernel (model/gdr_scan.h) on dense and ragged
// (varlen) chunk plans, with head sizes that are not multiples of its 32-column blocks and chunk
// sizes up to its limit; and the unit lower-triangular solve through the inverse kernel
// (model/tril_solve.h). Fresh random inputs each run, seeded from GoogleTest's seed. Skips
// without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "model/gdr.h"
#include "model/gdr_scan.h"
#include "model/tril_solve.h"
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

std::string describe(const Case& c) {
  std::string docs;
  for (const int64_t n : c.chunk_counts) docs += (docs.empty() ? "" : ",") + std::to_string(n);
  return "docs [" + docs + "] H=" + std::to_string(c.H) + " C=" + std::to_string(c.C) + " dk=" + std::to_string(c.dk) +
         " dv=" + std::to_string(c.dv);
}

}  // namespace

// fp32 on both sides; they differ only in summation order over dk and C (≤ 256 terms) and its
// growth through up to 9 chain steps: 2e-5 relative is about 100 ulp of headroom.
TEST(GdrScanCuda, KernelMatchesReferenceForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 907);
  const Case cases[] = {
      {{4, 4}, 3, 64, 128, 128},          // dense, the model's sizes
      {{9, 1, 3, 3, 2}, 2, 16, 36, 40},   // ragged; dk, dv not multiples of 32
      {{5, 2}, 1, 100, 64, 33},           // a chunk past 64 rows (the 16-rows-per-warp path)
      {{2, 3}, 2, 128, 256, 64},          // the kernel's largest chunk and key size
      {{1}, 4, 7, 4, 1},                  // a single step, tiny sizes
  };
  const double tol = 2e-5;
  for (const Case& c : cases) {
    int64_t N = 0;
    const auto plan = make_plan(c.chunk_counts, c.H, N);
    const int64_t R = N * c.H, S = plan.n_docs * c.H;
    auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
    // Magnitudes like the model's: W and Kd rows of L2-normalised keys times β ≤ 1 and decay ≤ 1.
    auto W0 = torch::randn({R, c.C, c.dk}, opt) / std::sqrt(static_cast<double>(c.dk));
    auto U0 = torch::randn({R, c.C, c.dv}, opt);
    auto K0 = torch::randn({R, c.C, c.dk}, opt) / std::sqrt(static_cast<double>(c.dk));
    auto d0 = torch::rand({R}, opt) * 0.5 + 0.5;
    auto h00 = torch::randn({S, c.dk, c.dv}, opt);
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
    std::printf("[gdr_scan] %s: fwd %.1e %.1e %.1e, worst grad %.1e\n", what.c_str(), e_hin, e_vn, e_fin, worst);
  }
}

// The whole chunked delta rule on the GPU (scan kernel inside) against the step-by-step reference
// in fp64 on the CPU, ragged documents and a given initial state: the kernel is wired in right.
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
  auto want = model::gdr_forward_ref(q, k, v, beta, g, scale, h0, cu);
  auto gpu = [](const torch::Tensor& t) { return t.to(torch::kCUDA, torch::kFloat32); };
  auto got = model::gdr_forward_chunked(gpu(q), gpu(k), gpu(v), gpu(beta), gpu(g), scale, gpu(h0), cu, 64);
  const double eo = rel_norm_diff(got.o, want.o), eh = rel_norm_diff(got.h, want.h);
  std::printf("[gdr_scan] chunked (GPU fp32) vs step-by-step (CPU fp64): o %.1e h %.1e\n", eo, eh);
  EXPECT_LT(eo, 1e-5);
  EXPECT_LT(eh, 1e-5);
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

// The gated delta rule core against MODEL.md §11: golden values (1), chunked vs reference in fp64
// and fp32 (2), closed forms (3), packed documents (4), gradients of the chunked path against
// autograd through the reference (5). Each measured error is printed as "[gdr] name: value".
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "model/fused_l2norm.h"
#include "model/gdr.h"
#include "model/gdr_chunk_core.h"
#include "model/gdr_chunk_layout.h"
#include "model/gdr_plan_slots.h"
#include "model/gdr_scan.h"
#include "tests/support/gdr_output_run.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;

[[maybe_unused]] ::testing::Environment* const single_thread_env =
    ::testing::AddGlobalTestEnvironment(new testing_support::SingleThreadEnvironment);

const auto F64 = torch::TensorOptions().dtype(torch::kFloat64);

torch::Tensor l2n(const torch::Tensor& x) { return x / torch::sqrt(x.square().sum(-1, true) + 1e-6); }

struct Inputs {
  torch::Tensor q, k, v, beta, g, h0;
};

// MODEL.md §11 random inputs: L2-normed q, k; v ~ N(0,1); β = σ(N(0,1));
// g = −A softplus(a + dt_bias) with A per head U(0.5,2) (mild) or U(0,16) (strong).
Inputs random_inputs(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, bool strong, int64_t n_state = -1) {
  Inputs in;
  in.q = l2n(torch::randn({B, T, H, dk}, F64));
  in.k = l2n(torch::randn({B, T, H, dk}, F64));
  in.v = torch::randn({B, T, H, dv}, F64);
  in.beta = torch::sigmoid(torch::randn({B, T, H}, F64));
  auto A = strong ? torch::rand({H}, F64) * 16.0 : torch::rand({H}, F64) * 1.5 + 0.5;
  auto dt_bias = torch::randn({H}, F64);
  in.g = -A * torch::softplus(torch::randn({B, T, H}, F64) + dt_bias);
  in.h0 = torch::randn({n_state < 0 ? B : n_state, H, dk, dv}, F64);
  return in;
}

model::GdrOutput run_ref(const Inputs& in, double scale, const torch::Tensor& h0, const torch::Tensor& cu = {}) {
  return model::gdr_forward_ref(in.q, in.k, in.v, in.beta, in.g, scale, h0, cu);
}

model::GdrOutput run_chunked(const Inputs& in, double scale, const torch::Tensor& h0, int64_t C,
                             const torch::Tensor& cu = {}) {
  return model::gdr_forward_chunked(in.q, in.k, in.v, in.beta, in.g, scale, h0, cu, C);
}

}  // namespace

// §11.1
TEST(Gdr, Golden) {
  Inputs in;
  in.q = torch::tensor({1.0, 0.0, 0.0, 1.0}, F64).view({1, 2, 1, 2});
  in.k = torch::tensor({1.0, 0.0, 0.6, 0.8}, F64).view({1, 2, 1, 2});
  in.v = torch::tensor({1.0, 2.0}, F64).view({1, 2, 1, 1});
  in.beta = torch::tensor({0.5, 1.0}, F64).view({1, 2, 1});
  in.g = torch::tensor({0.0, std::log(0.5)}, F64).view({1, 2, 1});
  auto o_want = torch::tensor({0.5, 1.48}, F64).view({1, 2, 1, 1});
  auto h_want = torch::tensor({1.36, 1.48}, F64).view({1, 1, 2, 1});
  auto ref = run_ref(in, 1.0, {});
  auto chk = run_chunked(in, 1.0, {}, 16);
  for (auto* r : {&ref, &chk}) {
    EXPECT_EQ(r->o.scalar_type(), torch::kFloat64);
    EXPECT_LE(max_abs_diff(r->o, o_want), 1e-12) << r->o;
    EXPECT_LE(max_abs_diff(r->h, h_want), 1e-12) << r->h;
  }
  std::printf("[gdr] golden ref o %.2e h %.2e, chunked o %.2e h %.2e\n", max_abs_diff(ref.o, o_want),
              max_abs_diff(ref.h, h_want), max_abs_diff(chk.o, o_want), max_abs_diff(chk.h, h_want));
}

// §11.2, fp64 part.
TEST(Gdr, ChunkedMatchesReferenceFp64) {
  torch::manual_seed(42);
  const int64_t B = 2, H = 3, dk = 16, dv = 24;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  double worst_o = 0, worst_h = 0;
  for (bool strong : {false, true}) {
    for (int64_t T : {1, 5, 63, 64, 65, 130, 200}) {
      auto in = random_inputs(B, T, H, dk, dv, strong);
      auto ref = run_ref(in, scale, in.h0);
      for (int64_t C : {16, 32, 64}) {
        auto chk = run_chunked(in, scale, in.h0, C);
        ASSERT_EQ(chk.o.sizes(), (std::vector<int64_t>{B, T, H, dv}));
        ASSERT_EQ(chk.h.sizes(), (std::vector<int64_t>{B, H, dk, dv}));
        const double eo = max_abs_diff(chk.o, ref.o), eh = max_abs_diff(chk.h, ref.h);
        EXPECT_LE(eo, 1e-10) << "T=" << T << " C=" << C << " strong=" << strong;
        EXPECT_LE(eh, 1e-10) << "T=" << T << " C=" << C << " strong=" << strong;
        worst_o = std::max(worst_o, eo);
        worst_h = std::max(worst_h, eh);
      }
    }
  }
  std::printf("[gdr] chunked vs ref fp64: max|do| %.2e max|dh| %.2e\n", worst_o, worst_h);
}

// §11.2, fp32 part: the fp32 chunked core (default C=64) against the fp64 reference.
TEST(Gdr, ChunkedFp32MatchesReferenceFp64) {
  torch::manual_seed(42);
  double worst = 0;
  for (auto [dk, dv] : std::vector<std::pair<int64_t, int64_t>>{{64, 128}, {128, 256}}) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    for (int64_t T : {64, 65, 300, 1000}) {
      for (bool strong : {false, true}) {
        auto in = random_inputs(1, T, 1, dk, dv, strong);
        auto ref = run_ref(in, scale, {});
        auto f = [](const torch::Tensor& x) { return x.to(torch::kFloat32); };
        auto chk = model::gdr_forward_chunked(f(in.q), f(in.k), f(in.v), f(in.beta), f(in.g), scale, {}, {}, 64);
        ASSERT_EQ(chk.o.scalar_type(), torch::kFloat32);
        const double e = max_abs_diff(chk.o, ref.o);
        EXPECT_LE(e, 1e-5) << "dk=" << dk << " T=" << T << " strong=" << strong;
        worst = std::max(worst, e);
      }
    }
  }
  std::printf("[gdr] chunked fp32 vs ref fp64: max|do| %.2e\n", worst);
}

// §11.3
TEST(Gdr, ClosedForms) {
  torch::manual_seed(42);
  const int64_t B = 2, H = 3, dk = 5, dv = 4;
  const double scale = 0.37;
  // T = 1 from h0 = 0: o = scale · β (q·k) v.
  {
    auto in = random_inputs(B, 1, H, dk, dv, true);
    auto want = scale * (in.beta * (in.q * in.k).sum(-1)).unsqueeze(-1) * in.v;
    const double er = max_abs_diff(run_ref(in, scale, {}).o, want);
    const double ec = max_abs_diff(run_chunked(in, scale, {}, 16).o, want);
    EXPECT_LE(er, 1e-12);
    EXPECT_LE(ec, 1e-12);
    std::printf("[gdr] closed form T=1: ref %.2e chunked %.2e\n", er, ec);
  }
  // β ≡ 0 from h0 = 0: nothing is ever written.
  {
    auto in = random_inputs(B, 70, H, dk, dv, false);
    in.beta.zero_();
    for (auto r : {run_ref(in, scale, {}), run_chunked(in, scale, {}, 16)}) {
      EXPECT_EQ(r.o.abs().max().item<double>(), 0.0);
      EXPECT_EQ(r.h.abs().max().item<double>(), 0.0);
    }
  }
  // Retrieval: k_t = e_t, β = 1, g = 0, q_t = e_0, scale = 1 gives o_t = v_0, across chunk borders.
  {
    const int64_t T = 12, D = 12;
    Inputs in;
    in.k = torch::eye(D, F64).view({1, T, 1, D});
    in.q = torch::zeros({1, T, 1, D}, F64);
    in.q.select(3, 0).fill_(1.0);
    in.v = torch::randn({1, T, 1, 3}, F64);
    in.beta = torch::ones({1, T, 1}, F64);
    in.g = torch::zeros({1, T, 1}, F64);
    auto want = in.v.narrow(1, 0, 1).expand({1, T, 1, 3});
    const double er = max_abs_diff(run_ref(in, 1.0, {}).o, want);
    const double ec = max_abs_diff(run_chunked(in, 1.0, {}, 4).o, want);
    EXPECT_LE(er, 1e-12);
    EXPECT_LE(ec, 1e-12);
    std::printf("[gdr] retrieval: ref %.2e chunked %.2e\n", er, ec);
  }
}

// §11.4: packed chunked output and per-document states equal the reference run on each document.
TEST(Gdr, VarlenMatchesPerDocumentReference) {
  torch::manual_seed(42);
  const std::vector<int64_t> cu_v = {0, 5, 69, 70, 200};
  auto cu = torch::tensor(cu_v, torch::kInt64);
  const int64_t H = 2, dk = 8, dv = 8, n_docs = 4;
  const double scale = 1.0 / std::sqrt(8.0);
  auto in = random_inputs(1, 200, H, dk, dv, true, n_docs);
  std::vector<torch::Tensor> o_docs, h_docs;
  for (int64_t n = 0; n < n_docs; ++n) {
    const int64_t s = cu_v[n], len = cu_v[n + 1] - cu_v[n];
    auto r = model::gdr_forward_ref(in.q.narrow(1, s, len), in.k.narrow(1, s, len), in.v.narrow(1, s, len),
                                    in.beta.narrow(1, s, len), in.g.narrow(1, s, len), scale,
                                    in.h0.narrow(0, n, 1), {});
    o_docs.push_back(r.o);
    h_docs.push_back(r.h);
  }
  auto o_want = torch::cat(o_docs, 1), h_want = torch::cat(h_docs, 0);
  double worst = 0;
  for (int64_t C : {16, 32, 64}) {
    auto r = run_chunked(in, scale, in.h0, C, cu);
    ASSERT_EQ(r.h.sizes(), (std::vector<int64_t>{n_docs, H, dk, dv}));
    const double eo = max_abs_diff(r.o, o_want), eh = max_abs_diff(r.h, h_want);
    EXPECT_LE(eo, 1e-10) << "C=" << C;
    EXPECT_LE(eh, 1e-10) << "C=" << C;
    worst = std::max({worst, eo, eh});
  }
  // Without h0 too, and the packed reference itself.
  auto r0 = run_chunked(in, scale, {}, 64, cu);
  auto ref0 = run_ref(in, scale, {}, cu);
  EXPECT_LE(max_abs_diff(r0.o, ref0.o), 1e-10);
  EXPECT_LE(max_abs_diff(r0.h, ref0.h), 1e-10);
  auto refp = run_ref(in, scale, in.h0, cu);
  EXPECT_LE(max_abs_diff(refp.o, o_want), 1e-12);
  // The documents really are separate: running the row as one document differs.
  EXPECT_GT(max_abs_diff(run_chunked(in, scale, {}, 64).o, r0.o), 1e-3);
  std::printf("[gdr] varlen vs per-document ref: max %.2e\n", worst);
}

namespace {

struct Grads {
  std::vector<torch::Tensor> g;  // q, k, v, beta, g, h0
};

// ∂(Σ o⊙R1 + Σ h⊙R2)/∂(q, k, v, β, g, h0) through `chunk` (0 = the reference).
Grads grads_of(const Inputs& base, double scale, int64_t chunk, const torch::Tensor& R1, const torch::Tensor& R2,
               const torch::Tensor& cu) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : {base.q, base.k, base.v, base.beta, base.g, base.h0})
    leaves.push_back(t.detach().clone().requires_grad_(true));
  Inputs in{leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5]};
  auto r = chunk == 0 ? run_ref(in, scale, in.h0, cu) : run_chunked(in, scale, in.h0, chunk, cu);
  auto loss = (r.o * R1).sum() + (r.h * R2).sum();
  auto g = torch::autograd::grad({loss}, leaves);
  return {g};
}

}  // namespace

// §11.5: gradients of the chunked path (autograd through it) against autograd through the reference.
TEST(Gdr, ChunkedGradientsMatchReference) {
  torch::manual_seed(42);
  const char* names[] = {"q", "k", "v", "beta", "g", "h0"};
  const int64_t T = 70, H = 2, dk = 6, dv = 5;
  const double scale = 1.0 / std::sqrt(6.0);
  double worst = 0;
  for (bool varlen : {false, true}) {
    for (bool strong : {false, true}) {
      const int64_t B = varlen ? 1 : 2;
      torch::Tensor cu = varlen ? torch::tensor({0, 17, 50, 51, 70}, torch::kInt64) : torch::Tensor();
      auto in = random_inputs(B, T, H, dk, dv, strong, varlen ? 4 : B);
      auto R1 = torch::randn({B, T, H, dv}, F64);
      auto R2 = torch::randn_like(in.h0);
      auto gr = grads_of(in, scale, 0, R1, R2, cu);
      auto gc = grads_of(in, scale, 16, R1, R2, cu);
      for (size_t i = 0; i < gr.g.size(); ++i) {
        ASSERT_TRUE(gc.g[i].defined()) << names[i];
        // Non-trivial gradients, so the comparison means something.
        EXPECT_GT(gr.g[i].abs().max().item<double>(), 1e-3) << names[i];
        const double e = max_abs_diff(gc.g[i], gr.g[i]);
        EXPECT_LE(e, 1e-8) << names[i] << " varlen=" << varlen << " strong=" << strong;
        worst = std::max(worst, e);
      }
    }
  }
  std::printf("[gdr] gradients chunked vs ref (fp64, T=70, C=16): max %.2e\n", worst);
}

// Packed rows planned at a fixed capacity through fixed buffers (model/gdr_plan_slots.h, for steps
// captured as CUDA graphs) give what each batch's own plan gives: the same outputs, final states
// and gradients, for three packings in turn through the same slots (one document per row; the
// room nearly full, with a dummy document and empty ones; one-token documents). The plan keeps the
// capacity's sizes whatever the batch, and a batch that does not fit is refused by name.
TEST(Gdr, FixedCapacityPlanMatchesTheBatchPlan) {
  torch::manual_seed(7);
  const int64_t B = 3, Trow = 40, T = B * Trow, H = 2, dk = 6, dv = 5, C = 16, pieces = 8;
  const double scale = 1.0 / std::sqrt(6.0);
  const auto cap = model::gdr_layout_capacity(B, Trow, C, pieces);
  EXPECT_EQ(cap.steps, 3);
  EXPECT_EQ(cap.chunks, 3 * 3 + pieces - B);
  model::GdrPlanSlots slots(B, Trow, pieces, torch::kCPU);
  const std::vector<std::vector<int64_t>> packings = {
      {0, 40, 80, 120}, {0, 17, 40, 41, 80, 100, 103, 120}, {0, 1, 40, 56, 80, 120}};
  double worst = 0;
  for (const auto& packing : packings) {
    const int64_t n_docs = static_cast<int64_t>(packing.size()) - 1;
    auto cu = torch::tensor(packing, torch::kInt64);
    auto padded = torch::full({pieces + 1}, T, torch::kInt64);
    padded.narrow(0, 0, n_docs + 1).copy_(cu);
    slots.set_batch(padded);
    const auto l = slots.layout(H, C);
    EXPECT_TRUE(l.fixed && l.table.defined());
    // The output rows' map the slots keep per head count, refilled with each batch, against the one
    // worked out from the plan's token slots (both head counts in turn).
    for (const int64_t heads : {H, H + 1}) {
      auto lh = slots.layout(heads, C), formula = lh;
      ASSERT_TRUE(lh.token_rows.defined());
      formula.token_rows = torch::Tensor();
      EXPECT_TRUE(torch::equal(model::gdr_chunk_token_rows(lh, heads, torch::kCPU),
                               model::gdr_chunk_token_rows(formula, heads, torch::kCPU)))
          << "packing with " << packing.size() - 1 << " pieces, " << heads << " heads";
      // The padding rows' list: ascending, the rows the map leaves out, all of them.
      const int64_t rows = lh.n_chunks * heads * C;
      ASSERT_TRUE(lh.pad_rows.defined());
      ASSERT_EQ(lh.pad_rows.numel(), rows - T * heads);
      auto both = torch::cat({lh.token_rows.reshape({-1}), lh.pad_rows}).to(torch::kInt64);
      EXPECT_TRUE(torch::equal(std::get<0>(both.sort()), torch::arange(rows, torch::kInt64)))
          << "token rows and padding rows together name every row once, " << heads << " heads";
      EXPECT_TRUE(torch::equal(lh.pad_rows, std::get<0>(lh.pad_rows.sort()))) << "ascending";
      // The row map: each row its own index, the padding rows −1.
      ASSERT_TRUE(lh.row_map.defined());
      auto want = torch::arange(rows, torch::kInt32);
      want.index_fill_(0, lh.pad_rows.to(torch::kInt64), -1);
      EXPECT_TRUE(torch::equal(lh.row_map, want)) << "row map, " << heads << " heads";
    }
    EXPECT_EQ(l.n_chunks, cap.chunks);
    EXPECT_EQ(l.scan.n_docs, cap.docs);
    int64_t tokens = 0;
    for (int32_t len : l.chunk_len) tokens += len;
    EXPECT_EQ(tokens, T);

    auto in = random_inputs(1, T, H, dk, dv, true);
    auto R1 = torch::randn({1, T, H, dv}, F64), R2 = torch::randn({n_docs, H, dk, dv}, F64);
    auto run = [&](bool fixed) {
      std::vector<torch::Tensor> leaves;
      for (const auto& t : {in.q, in.k, in.v, in.beta, in.g}) leaves.push_back(t.detach().clone().requires_grad_(true));
      auto r = model::gdr_forward_chunked(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], scale, {},
                                          fixed ? padded : cu, C, false, false, fixed ? &slots : nullptr);
      auto h = r.h.narrow(0, 0, n_docs);
      auto loss = (r.o * R1).sum() + (h * R2).sum();
      auto grads = torch::autograd::grad({loss}, leaves);
      grads.push_back(r.o.detach());
      grads.push_back(r.h.detach());
      return grads;
    };
    const auto plain = run(false), fixed = run(true);
    ASSERT_EQ(fixed.back().size(0), cap.docs);
    for (size_t i = 0; i + 1 < plain.size(); ++i) {
      const double e = max_abs_diff(fixed[i], plain[i]);
      EXPECT_LE(e, 1e-10) << "packing with " << n_docs << " pieces, tensor " << i;
      worst = std::max(worst, e);
    }
    EXPECT_LE(max_abs_diff(fixed.back().narrow(0, 0, n_docs), plain.back()), 1e-10);
    EXPECT_EQ(fixed.back().narrow(0, n_docs, cap.docs - n_docs).abs().max().item<double>(), 0.0)
        << "the dummy and empty documents' states";
  }
  std::printf("[gdr] fixed-capacity plan vs the batch's own plan (fp64, 3 packings): max %.2e\n", worst);

  // More pieces than the room, and a document across a row boundary (4 chunks > 3 steps); a
  // refused batch leaves the plan on the last one.
  const auto last = slots.layout(H, C).chunk_len;
  EXPECT_THROW(slots.set_batch(torch::arange(0, T + 1, 10, torch::kInt64)), c10::Error);
  EXPECT_EQ(slots.layout(H, C).chunk_len, last);
  try {
    model::gdr_chunk_layout_fixed(T, H, C, torch::tensor({0, 60, 120}, torch::kInt64), cap, torch::kCPU);
    ADD_FAILURE() << "a 60-token document fit a layout of 3 steps of 16";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("document 0 has 4 chunks"), std::string::npos)
        << e.what_without_backtrace();
  }
}

// L2Norm of q and k taken into the chunked rule's op (model::GdrQkNorm, the Gated DeltaNet's path
// on a GPU) against the norm as an op of its own before it (autograd through its ATen formula,
// model::l2_norm_reference):
// the same normalised q and k, so the same outputs and final states to the bit; the gradients of
// the norm's inputs, from the formula the op applies after its own backward here (on the CPU), equal
// to 1e-12 in fp64, and every other gradient to the bit. Dense and packed, unnormalised inputs of
// several scales.
TEST(Gdr, L2NormInsideTheCoreMatchesTheNormBefore) {
  torch::manual_seed(57);
  const char* names[] = {"q", "k", "v", "beta", "g", "h0"};
  const int64_t T = 70, H = 2, dk = 6, dv = 5;
  const double scale = 1.0 / std::sqrt(6.0);
  double worst = 0;
  for (const bool varlen : {false, true}) {
    const int64_t B = varlen ? 1 : 2;
    const torch::Tensor cu = varlen ? torch::tensor({0, 17, 50, 51, 70}, torch::kInt64) : torch::Tensor();
    auto in = random_inputs(B, T, H, dk, dv, /*strong=*/false, varlen ? 4 : B);
    // The norm's inputs: rows of any length, as the short conv gives them.
    in.q = torch::randn({B, T, H, dk}, F64) * torch::rand({B, T, H, 1}, F64) * 3.0;
    in.k = torch::randn({B, T, H, dk}, F64) * torch::rand({B, T, H, 1}, F64) * 3.0;
    const auto R1 = torch::randn({B, T, H, dv}, F64);
    const auto R2 = torch::randn_like(in.h0);
    std::vector<torch::Tensor> outs[2], grads[2];
    for (const bool inside : {false, true}) {
      std::vector<torch::Tensor> x{in.q, in.k, in.v, in.beta, in.g, in.h0};
      for (auto& t : x) t = t.clone().requires_grad_(true);
      const model::GdrQkNorm norm{inside, 1e-6, torch::kFloat64};
      auto before = [](const torch::Tensor& t) { return model::l2_norm_reference(t, 1e-6, torch::kFloat64); };
      const auto q = inside ? x[0] : before(x[0]), k = inside ? x[1] : before(x[1]);
      const auto out = model::gdr_forward_chunked(q, k, x[2], x[3], x[4], scale, x[5], cu, 16, false, false, nullptr,
                                                  true, norm);
      ((out.o * R1).sum() + (out.h * R2).sum()).backward();
      outs[inside] = {out.o.detach(), out.h.detach()};
      for (auto& t : x) grads[inside].push_back(t.grad());
    }
    EXPECT_TRUE(torch::equal(outs[1][0], outs[0][0])) << "o, varlen=" << varlen;
    EXPECT_TRUE(torch::equal(outs[1][1], outs[0][1])) << "h, varlen=" << varlen;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      ASSERT_TRUE(grads[1][i].defined()) << names[i];
      EXPECT_GT(grads[0][i].abs().max().item<double>(), 1e-3) << names[i];
      const double e = max_abs_diff(grads[1][i], grads[0][i]);
      if (i < 2) {
        EXPECT_LE(e, 1e-12) << names[i] << " varlen=" << varlen;
        worst = std::max(worst, e);
      } else {
        EXPECT_TRUE(torch::equal(grads[1][i], grads[0][i])) << names[i] << " varlen=" << varlen << " differs by " << e;
      }
    }
  }
  std::printf("[gdr] L2Norm inside the core vs before it (fp64): q, k gradients max %.2e\n", worst);
}

// model.gdn_scan_precision: "auto" takes the scan's plain-TF32 products exactly when the layer's
// matmuls run in a 16-bit type; the explicit values ignore the dtype; anything else is refused by
// name.
TEST(Gdr, ScanPrecisionSetting) {
  EXPECT_TRUE(model::gdr_scan_uses_tf32("auto", torch::kBFloat16));
  EXPECT_TRUE(model::gdr_scan_uses_tf32("auto", torch::kHalf));
  EXPECT_FALSE(model::gdr_scan_uses_tf32("auto", torch::kFloat32));
  EXPECT_FALSE(model::gdr_scan_uses_tf32("auto", torch::kFloat64));
  EXPECT_TRUE(model::gdr_scan_uses_tf32("tf32", torch::kFloat32));
  EXPECT_FALSE(model::gdr_scan_uses_tf32("fp32", torch::kBFloat16));
  try {
    model::gdr_scan_uses_tf32("bf16", torch::kBFloat16);
    ADD_FAILURE() << "an unknown precision was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.gdn_scan_precision"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

namespace {

// The output layouts' cases: dense rows whose length is not a multiple of the chunk (64), so
// padding rows exist, and one packed row of four documents.
struct OutputCase {
  int64_t B, T;
  std::vector<int64_t> cu;  // empty: dense
  const char* name() const { return cu.empty() ? "dense" : "packed"; }
  torch::Tensor cu_seqlens() const { return cu.empty() ? torch::Tensor() : torch::tensor(cu, torch::kInt64); }
  int64_t n_states() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
};
const OutputCase kOutputCases[] = {{2, 150, {}}, {1, 300, {0, 17, 150, 151, 300}}};

}  // namespace

// o_as_rows: the chunk layout's rows picked by o_row are exactly the token-order output, for dense
// rows whose length is not a multiple of the chunk (padding rows exist) and for a packed row; every
// (token, head) names its own row, and the final state does not change (and is not formed when not
// asked for).
TEST(Gdr, OutputAsChunkRowsMatchesTokenOrder) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 17);
  const double scale = 0.3;
  for (const OutputCase& c : kOutputCases) {
    const int64_t H = 3, dk = 8, dv = 5, C = 64;
    const auto in = random_inputs(c.B, c.T, H, dk, dv, false, c.n_states());
    const auto cu = c.cu_seqlens();
    const auto plain = run_chunked(in, scale, in.h0, C, cu);
    const auto rows = model::gdr_forward_chunked(in.q, in.k, in.v, in.beta, in.g, scale, in.h0, cu, C, false, true);
    ASSERT_FALSE(rows.o.defined());
    ASSERT_EQ(rows.o_row.sizes(), (std::vector<int64_t>{c.B, c.T, H}));
    ASSERT_EQ(rows.o_row.scalar_type(), torch::kInt32);
    const auto idx = rows.o_row.reshape({-1}).to(torch::kInt64);
    const auto sorted = std::get<0>(idx.sort());
    EXPECT_TRUE((sorted.slice(0, 1) > sorted.slice(0, 0, -1)).all().item<bool>()) << "two (token, head) pairs share a row";
    EXPECT_GT(rows.o_rows.size(0), idx.numel()) << "the case should have padding rows";
    const auto picked = rows.o_rows.index_select(0, idx).view({c.B, c.T, H, dv});
    EXPECT_EQ(max_abs_diff(picked, plain.o), 0.0) << c.name();
    EXPECT_EQ(max_abs_diff(rows.h, plain.h), 0.0);
    // A training forward asks for no final state: the same rows, and h left undefined.
    const auto no_state = model::gdr_forward_chunked(in.q, in.k, in.v, in.beta, in.g, scale, in.h0, cu, C, false, true,
                                                     nullptr, /*final_state=*/false);
    EXPECT_FALSE(no_state.h.defined()) << c.name();
    EXPECT_EQ(max_abs_diff(no_state.o_rows, rows.o_rows), 0.0) << c.name();
  }
}

// The chunk core's output written straight into token order (how gdr_forward_chunked runs on a
// GPU: the output product scatters its rows through gdr_chunk_row_targets) against the chunk-row
// output copied into token order: bit for bit forward, and the same input gradients (the token
// gradient gathered back into chunk rows), dense with a padded last chunk and packed. The map
// covers every (token, head) once and is kept for its layout.
TEST(Gdr, OutputWrittenIntoTokenOrderMatchesTheCopy) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 19);
  const double scale = 0.3;
  for (const OutputCase& c : kOutputCases) {
    const int64_t H = 3, dk = 8, dv = 5, C = 64;
    const auto in = random_inputs(c.B, c.T, H, dk, dv, false, c.n_states());
    const auto cu = c.cu_seqlens();
    const auto layout = model::gdr_chunk_layout(c.B, c.T, H, C, cu, torch::kCPU);
    const auto targets = model::gdr_chunk_row_targets(layout, H, torch::kCPU);
    ASSERT_EQ(targets.scalar_type(), torch::kInt32);
    // Kept: the same chunk table and heads give the same map back, other heads their own.
    EXPECT_EQ(model::gdr_chunk_row_targets(layout, H, torch::kCPU).data_ptr(), targets.data_ptr());
    EXPECT_EQ(model::gdr_chunk_row_targets(layout, H + 1, torch::kCPU).numel(), layout.n_chunks * (H + 1) * C);
    ASSERT_EQ(targets.numel(), layout.n_chunks * H * C);
    // Every (token, head) row is the target of exactly one chunk row; the rest are padding (−1).
    const auto kept = targets.masked_select(targets.ge(0)).to(torch::kInt64);
    ASSERT_EQ(kept.numel(), c.B * c.T * H);
    EXPECT_TRUE(torch::equal(std::get<0>(kept.sort()), torch::arange(c.B * c.T * H, torch::kInt64)));
    const auto grad_o = torch::randn({c.B, c.T, H, dv}, F64);
    const std::vector<torch::Tensor> x{in.q, in.k, in.v, in.beta, in.g};
    const auto copied = testing_support::gdr_token_output_and_grads(x, layout, scale, grad_o, false);
    const auto direct = testing_support::gdr_token_output_and_grads(x, layout, scale, grad_o, true);
    ASSERT_EQ(direct[0].sizes(), (std::vector<int64_t>{c.B, c.T, H, dv}));
    EXPECT_EQ(max_abs_diff(direct[0], copied[0]), 0.0) << c.name() << ": o";
    for (size_t i = 1; i < direct.size(); ++i) EXPECT_EQ(max_abs_diff(direct[i], copied[i]), 0.0) << c.name() << ": gradient " << i;
  }
}

// The state scan given W, U and Kd in bf16 (as the chunk core's fused front writes them under
// 16-bit training) where only fp32 runs — the CPU, and the ATen loop everywhere: the inputs are
// widened first, so the results equal those of the widened values exactly, forward and backward.
TEST(Gdr, ScanWidensBf16InputsWhereOnlyFp32Runs) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 23);
  const int64_t H = 2, C = 16, dk = 8, dv = 12;
  // Two documents of 3 and 1 chunks, step-major: step 0 runs both, steps 1 and 2 the first.
  model::GdrScanPlan plan;
  plan.n_docs = 2;
  plan.heads = H;
  plan.step_count = {2, 1, 1};
  plan.step_off = {0, 2, 3};
  plan.tf32_products = true;
  plan.bf16_states = true;
  const int64_t R = 4 * H;
  auto W = torch::randn({R, C, dk}).to(torch::kBFloat16), U = torch::randn({R, C, dv}).to(torch::kBFloat16);
  auto Kd = torch::randn({R, C, dk}).to(torch::kBFloat16);
  auto decay = torch::rand({R}) * 0.5 + 0.5, h0 = torch::randn({2 * H, dk, dv});
  EXPECT_FALSE(model::gdr_scan_takes_bf16_inputs(plan, C, dk, dv));  // on the CPU
  const auto f32 = [](const torch::Tensor& x) { return x.to(torch::kFloat32); };
  const auto got = model::gdr_scan(W, U, Kd, decay, h0, plan);
  const auto want = model::gdr_scan_reference(f32(W), f32(U), f32(Kd), decay, h0, plan);
  EXPECT_TRUE(torch::equal(got.h_in, want.h_in));
  EXPECT_TRUE(torch::equal(got.v_new, want.v_new));
  EXPECT_TRUE(torch::equal(got.h_final, want.h_final));
  auto d_vnew = torch::randn({R, C, dv}), d_hin = torch::randn({R, dk, dv}), d_hfinal = torch::randn({2 * H, dk, dv});
  const auto bg = model::gdr_scan_backward(W, Kd, decay, d_hin, d_vnew, d_hfinal, plan);
  const auto bw = model::gdr_scan_backward_reference(f32(W), f32(Kd), decay, d_hin, d_vnew, d_hfinal, plan);
  EXPECT_TRUE(torch::equal(bg.dh_next, bw.dh_next));
  EXPECT_TRUE(torch::equal(bg.dU, bw.dU));
  EXPECT_TRUE(torch::equal(bg.dh0, bw.dh0));
}

// The documents' worth of full-length scans the scan kernel's block width is picked for
// (model::gdr_scan_busy_docs, kernels::GdrScanArgs::busy_docs): Σ chunks / steps rounded up. Dense
// rows count each row; a packed row of one long document and short pieces counts about one; a
// fixed layout's dummy and empty documents add only the chunks they run.
TEST(Gdr, ScanWidthCountsBusyDocuments) {
  const int64_t H = 6, C = 64, T = 2048;
  const auto dense = model::gdr_chunk_layout(8, T, H, C, torch::Tensor(), torch::kCPU);
  EXPECT_EQ(dense.scan.n_docs, 8);
  EXPECT_EQ(model::gdr_scan_busy_docs(dense.scan), 8);
  // 1900 tokens (30 chunks), then three pieces of one chunk: 33 chunks over 30 steps.
  const auto cu = torch::tensor({int64_t{0}, int64_t{1900}, int64_t{1950}, int64_t{2000}, T}, torch::kInt64);
  const auto packed = model::gdr_chunk_layout(1, T, H, C, cu, torch::kCPU);
  EXPECT_EQ(packed.scan.n_docs, 4);
  EXPECT_EQ(model::gdr_scan_busy_docs(packed.scan), 2);
  // The same row at a fixed capacity of 8 pieces: its dummies carry the spare chunks.
  const auto cap = model::gdr_layout_capacity(1, T, C, 8);
  const auto fixed = model::gdr_chunk_layout_fixed(T, H, C, cu, cap, torch::kCPU);
  EXPECT_EQ(fixed.scan.n_docs, cap.docs);
  int64_t steps = static_cast<int64_t>(fixed.scan.step_count.size());
  EXPECT_EQ(model::gdr_scan_busy_docs(fixed.scan), (cap.chunks + steps - 1) / steps);
  EXPECT_LT(model::gdr_scan_busy_docs(fixed.scan), cap.docs);
  EXPECT_EQ(model::gdr_scan_busy_docs(model::GdrScanPlan{}), 0);
}

// cuDNN's packed causal attention (model/cudnn_attention.h) against the block-diagonal masked
// reference in fp32 (model::causal_attention_masked): outputs and the three input gradients at
// MLA's widths (V narrower than q and k), at GPT's (q, k and v strided views into one fused
// projection, GQA) and at odd small widths, with one-token pieces and pieces rounded up with empty
// ones; that nothing outside the pieces' rows is read (NaN guard rows around the inputs) or
// written (sentinel guard rows around the outputs); that model::causal_attention and MLA route
// packed rows to it, agree with the flash kernel and leave it the rows cuDNN cannot take. Fresh
// random inputs each run. Skips without a GPU; on Hopper cuDNN must take every shape here.
#include <gtest/gtest.h>
#include <torch/torch.h>
#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "model/cudnn_attention.h"
#include "model/fused_rope.h"
#include "model/layers.h"
#include "model/mla.h"
#include "model/model_config.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::rel_norm_diff;

// Two rows of 100 tokens cut into 7 pieces (one-token pieces included, none crossing a row).
const std::vector<int64_t> kCuts = {0, 7, 40, 41, 100, 130, 131, 200};
constexpr int64_t kB = 2, kT = 100, kN = 200;

bool on_hopper() {
#if defined(DD_HAVE_CUDA)
  return at::cuda::getCurrentDeviceProperties()->major == 9;
#else
  return false;
#endif
}

torch::Tensor cu_int32(const std::vector<int64_t>& cu) {
  return torch::tensor(cu, torch::kInt64).to(torch::kInt32).cuda();
}

// How q, k and v lie in memory: each contiguous, all three views into one [N, (H + 2 Hkv) · D]
// projection (dqk == dv), or GPT's QK-norm path: q and k contiguous, v such a view.
enum class Layout { Separate, Fused, ValueView };
struct Case {
  std::string name;
  int64_t H, Hkv, dqk, dv;
  Layout layout;
};

// q, k, v [N,·,·] bf16 for a case: separate contiguous tensors, or views into one fused buffer.
struct Qkv {
  torch::Tensor q, k, v;
};
Qkv random_qkv(const Case& c) {
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  if (c.layout == Layout::Separate) {
    return {torch::randn({kN, c.H, c.dqk}, bf16), torch::randn({kN, c.Hkv, c.dqk}, bf16),
            torch::randn({kN, c.Hkv, c.dv}, bf16)};
  }
  auto all = torch::randn({kN, c.H + 2 * c.Hkv, c.dqk}, bf16);
  if (c.layout == Layout::ValueView) {
    return {all.narrow(1, 0, c.H).contiguous(), all.narrow(1, c.H, c.Hkv).contiguous(),
            all.narrow(1, c.H + c.Hkv, c.Hkv)};
  }
  return {all.narrow(1, 0, c.H), all.narrow(1, c.H, c.Hkv), all.narrow(1, c.H + c.Hkv, c.Hkv)};
}

// The fp32 masked reference of [N,heads,D] inputs: o [N,H,dv] and, for the output gradient gy,
// dq, dk and dv.
struct Reference {
  torch::Tensor o, dq, dk, dv;
};
Reference reference(const Qkv& in, const torch::Tensor& gy, double scale) {
  const auto p = model::packed_positions(torch::tensor(kCuts, torch::kInt64), kB, kT, torch::kCUDA);
  auto rows = [](const torch::Tensor& t) {  // [N,h,D] -> fp32 leaf [B,h,T,D]
    return t.to(torch::kFloat32).view({kB, kT, t.size(1), t.size(2)}).transpose(1, 2).detach().requires_grad_(true);
  };
  auto q = rows(in.q), k = rows(in.k), v = rows(in.v);
  auto o = model::causal_attention_masked(q, k, v, scale, p).transpose(1, 2).reshape({kN, in.q.size(1), -1});
  (o * gy).sum().backward();
  auto back = [](const torch::Tensor& g) { return g.transpose(1, 2).reshape({kN, g.size(1), g.size(3)}); };
  return {o.detach(), back(q.grad()), back(k.grad()), back(v.grad())};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"MLA widths (96/64)", 4, 4, 96, 64, Layout::Separate},
      {"odd widths 48/32, GQA 3/1", 3, 1, 48, 32, Layout::Separate},
      {"fused q|k|v views, GQA 4/2, 64", 4, 2, 64, 64, Layout::Fused},
      {"q, k contiguous and v a view (GPT with QK-norm), GQA 6/2, 64", 6, 2, 64, 64, Layout::ValueView},
      {"q, k contiguous and v a view, no GQA, 64", 4, 4, 64, 64, Layout::ValueView}};
  return all;
}

}  // namespace

TEST(CudnnPackedAttention, PieceCountsRoundUp) {
  EXPECT_EQ(model::packed_attention_pieces(1), 8);
  EXPECT_EQ(model::packed_attention_pieces(8), 8);
  EXPECT_EQ(model::packed_attention_pieces(9), 16);
  EXPECT_EQ(model::packed_attention_pieces(64), 64);
  EXPECT_EQ(model::packed_attention_pieces(65), 80);    // past 64: steps of 1/8 of the next power of two
  EXPECT_EQ(model::packed_attention_pieces(129), 160);
  EXPECT_EQ(model::packed_attention_pieces(160), 160);  // a rounded count stays (CUDA graphs' padded cu_seqlens)
}

// Through cudnn_packed_attention (its autograd function): against the fp32 reference.
TEST(CudnnPackedAttention, MatchesMaskedReference) {
  DD_REQUIRE_GPU();
  if (!model::cudnn_frontend_built()) GTEST_SKIP() << "built without the cuDNN frontend";
  testing_support::seed_from_gtest(71);
  for (const auto& c : cases()) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dqk));
    auto in = random_qkv(c);
    auto q = in.q.detach().requires_grad_(true), k = in.k.detach().requires_grad_(true),
         v = in.v.detach().requires_grad_(true);
    const auto o = model::cudnn_packed_attention(q, k, v, cu_int32(kCuts), kT, scale);
    if (!o.defined()) {
      EXPECT_FALSE(on_hopper()) << c.name << ": cuDNN refused the shape on Hopper";
      continue;
    }
    ASSERT_EQ(o.sizes(), torch::IntArrayRef({kN, c.H, c.dv})) << c.name;
    auto gy = torch::randn({kN, c.H, c.dv}, torch::kCUDA);
    (o.to(torch::kFloat32) * gy).sum().backward();
    const auto ref = reference(in, gy, scale);
    const double eo = rel_norm_diff(o, ref.o), eq = rel_norm_diff(q.grad(), ref.dq),
                 ek = rel_norm_diff(k.grad(), ref.dk), ev = rel_norm_diff(v.grad(), ref.dv);
    std::printf("[measured] cuDNN packed attention %s vs fp32 masked: o %.2e, dq %.2e, dk %.2e, dv %.2e\n",
                c.name.c_str(), eo, eq, ek, ev);
    // bf16 inputs (the reference gets the same values in fp32), fp32 softmax statistics: the output
    // rounds to bf16 (2^-9 relative), the gradients accumulate a few such steps.
    EXPECT_LT(eo, 8e-3) << c.name;
    EXPECT_LT(eq, 1.5e-2) << c.name;
    EXPECT_LT(ek, 1.5e-2) << c.name;
    EXPECT_LT(ev, 1.5e-2) << c.name;
  }
}

// The forward and backward into caller-given tensors whose neighbouring rows are guards: NaN rows
// before and after q, k, v and dO (a read past a piece's rows would reach the output through the
// P·V product or the gradients), sentinel rows around o, dq, dk, dv and after the statistics (a
// write past them would change one). cu_seqlens is padded with empty pieces to 16, as the trainer
// pads it for a captured CUDA graph. The statistics are [N,H] fp32 rows with guards of their own.
TEST(CudnnPackedAttention, StaysInsideItsRows) {
  DD_REQUIRE_GPU();
  if (!model::cudnn_frontend_built()) GTEST_SKIP() << "built without the cuDNN frontend";
  testing_support::seed_from_gtest(72);
  constexpr int64_t G = 64, pieces = 16;
  std::vector<int64_t> cuts = kCuts;
  cuts.resize(pieces + 1, kN);
  const float nan = std::numeric_limits<float>::quiet_NaN(), sentinel = 3.0f;
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  // [G + N + G, h, D] filled with `fill`, and its middle N rows.
  auto guarded = [&](int64_t h, int64_t D, float fill, torch::ScalarType dt = torch::kBFloat16) {
    auto buf = torch::full({G + kN + G, h, D}, fill, bf16.dtype(dt));
    return std::make_pair(buf, buf.narrow(0, G, kN));
  };
  auto guards_hold = [&](const torch::Tensor& buf, float fill) {
    auto g = torch::cat({buf.narrow(0, 0, G), buf.narrow(0, G + kN, G)}).to(torch::kFloat32);
    return (g == fill).all().item<bool>();
  };
  for (const auto& c : {cases()[0], cases()[1]}) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dqk));
    auto [qb, q] = guarded(c.H, c.dqk, nan);
    auto [kb, k] = guarded(c.Hkv, c.dqk, nan);
    auto [vb, v] = guarded(c.Hkv, c.dv, nan);
    auto [dob, dO] = guarded(c.H, c.dv, nan);
    q.normal_();
    k.normal_();
    v.normal_();
    dO.normal_();
    auto [ob, o] = guarded(c.H, c.dv, sentinel);
    auto [dqb, dq] = guarded(c.H, c.dqk, sentinel);
    auto [dkb, dk] = guarded(c.Hkv, c.dqk, sentinel);
    auto [dvb, dv] = guarded(c.Hkv, c.dv, sentinel);
    auto [statsb, stats3] = guarded(c.H, 1, sentinel, torch::kFloat32);
    auto stats = stats3.squeeze(2);  // [N,H]
    const auto cu = cu_int32(cuts);
    model::PackedAttentionShape shape;
    shape.tokens = kN;
    shape.pieces = pieces;
    shape.S = kT;
    shape.H = c.H;
    shape.Hkv = c.Hkv;
    shape.dqk = c.dqk;
    shape.dv = c.dv;
    shape.q_token_stride = q.stride(0);
    shape.q_head_stride = q.stride(1);
    shape.k_token_stride = k.stride(0);
    shape.k_head_stride = k.stride(1);
    shape.v_token_stride = v.stride(0);
    shape.v_head_stride = v.stride(1);
    shape.scale = scale;
    shape.backward = true;
    if (!model::cudnn_packed_attention_supported(shape)) {
      EXPECT_FALSE(on_hopper()) << c.name << ": cuDNN refused the shape on Hopper";
      continue;
    }
    model::cudnn_packed_attention_forward(q, k, v, cu, kT, scale, o, stats);
    model::cudnn_packed_attention_backward(q, k, v, o, dO, stats, cu, kT, scale, dq, dk, dv);
    torch::cuda::synchronize();
    const std::vector<std::pair<const char*, torch::Tensor>> outputs = {{"o", o}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
    for (const auto& [name, t] : outputs)
      EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << c.name << ": " << name << " read a guard row";
    EXPECT_TRUE(guards_hold(ob, sentinel)) << c.name << ": o written outside its rows";
    EXPECT_TRUE(guards_hold(dqb, sentinel)) << c.name << ": dq written outside its rows";
    EXPECT_TRUE(guards_hold(dkb, sentinel)) << c.name << ": dk written outside its rows";
    EXPECT_TRUE(guards_hold(dvb, sentinel)) << c.name << ": dv written outside its rows";
    EXPECT_TRUE(guards_hold(statsb, sentinel)) << c.name << ": statistics written outside their rows";
    const auto ref = reference({q, k, v}, dO.to(torch::kFloat32), scale);
    const double eo = rel_norm_diff(o, ref.o), eq = rel_norm_diff(dq, ref.dq), ek = rel_norm_diff(dk, ref.dk),
                 ev = rel_norm_diff(dv, ref.dv);
    std::printf("[measured] cuDNN packed attention %s, 16 pieces (9 empty), guarded: o %.2e, dq %.2e, dk %.2e, "
                "dv %.2e\n",
                c.name.c_str(), eo, eq, ek, ev);
    EXPECT_LT(eo, 8e-3) << c.name;
    EXPECT_LT(std::max({eq, ek, ev}), 1.5e-2) << c.name;
  }
}

// model::causal_attention routes packed bf16 rows to cuDNN (V unpadded: its output is [B,T,H,dv]
// memory holding exactly N·H·dv values) and agrees with the flash kernel (switch off).
TEST(CudnnPackedAttention, CausalAttentionRoutesPackedRows) {
  DD_REQUIRE_GPU();
  if (!model::cudnn_frontend_built()) GTEST_SKIP() << "built without the cuDNN frontend";
  testing_support::seed_from_gtest(73);
  const auto& c = cases()[0];
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dqk));
  const auto p = model::packed_positions(torch::tensor(kCuts, torch::kInt64), kB, kT, torch::kCUDA);
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  auto q = torch::randn({kB, kT, c.H, c.dqk}, bf16).transpose(1, 2);
  auto k = torch::randn({kB, kT, c.H, c.dqk}, bf16).transpose(1, 2);
  auto v = torch::randn({kB, kT, c.H, c.dv}, bf16).transpose(1, 2);
  const auto fast = model::causal_attention(q, k, v, scale, p);
  // Switched off after V was made narrow (as when MLA's early ask and the call disagree): flash
  // must pad V itself.
  model::packed_attention_cudnn(false);
  const auto flash = model::causal_attention(q, k, v, scale, p);
  model::packed_attention_cudnn(true);
  ASSERT_EQ(fast.sizes(), flash.sizes());
  const bool unpadded = fast.storage().nbytes() == static_cast<size_t>(kN * c.H * c.dv) * fast.element_size();
  if (on_hopper()) {
    EXPECT_TRUE(unpadded) << "packed rows should run on cuDNN with V unpadded";
  }
  const double e = rel_norm_diff(fast, flash);
  std::printf("[measured] causal_attention packed rows, %s vs flash varlen: %.2e\n",
              unpadded ? "cuDNN" : "flash (cuDNN refused)", e);
  EXPECT_LT(e, 1e-2);
  // Token rows whose stride is not a multiple of 16 bytes: cuDNN is not asked, flash takes them.
  auto rows = torch::randn({kN, c.H * c.dqk + 4}, bf16).narrow(1, 0, c.H * c.dqk).view({kN, c.H, c.dqk});
  const auto v_rows = v.transpose(1, 2).reshape({kN, c.H, c.dv});
  EXPECT_FALSE(model::cudnn_packed_attention(rows, rows, v_rows, p.cu_seqlens_device, kT, scale).defined())
      << "an unaligned token stride must leave cuDNN out";
}

namespace {

// A layer's output on u0 and the gradients of its input and of every weight for the output gradient
// gy, over packed rows p: on cuDNN's kernel or flash's, under bf16 autocast or in fp32. `inside`
// runs in the autocast scope before the forward (to look at the layer's attention inputs).
std::vector<torch::Tensor> layer_output_and_grads(torch::nn::Module& m,
                                                  const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                                  const torch::Tensor& u0, const torch::Tensor& gy, bool cudnn,
                                                  bool autocast,
                                                  const std::function<void(const torch::Tensor&)>& inside = {}) {
  model::packed_attention_cudnn(cudnn);
  m.zero_grad();
  auto u = u0.clone().requires_grad_(true);
  torch::Tensor y;
  {
    std::optional<testing_support::CudaAutocast> ac;
    if (autocast) ac.emplace(torch::kBFloat16);
    if (inside) inside(u);
    y = forward(u);
  }
  model::packed_attention_cudnn(true);
  (y.to(torch::kFloat32) * gy).sum().backward();
  std::vector<torch::Tensor> r{y.detach().to(torch::kFloat32), u.grad()};
  for (auto& w : m.parameters()) r.push_back(w.grad().clone());
  return r;
}

// The cuDNN run against the flash run (bound 2e-2) and the fp32 run (3e-2), tensor by tensor; prints
// the worst of each under `what`.
void expect_close_to_flash_and_fp32(const std::vector<torch::Tensor>& fast, const std::vector<torch::Tensor>& flash,
                                    const std::vector<torch::Tensor>& exact, const std::string& what) {
  ASSERT_EQ(fast.size(), flash.size());
  ASSERT_EQ(fast.size(), exact.size());
  double worst_flash = 0, worst_exact = 0;
  for (size_t i = 0; i < fast.size(); ++i) {
    const double ef = rel_norm_diff(fast[i], flash[i]), ee = rel_norm_diff(fast[i], exact[i]);
    EXPECT_LT(ef, 2e-2) << what << ", tensor " << i << " (0: y, 1: du, then the weights' gradients)";
    EXPECT_LT(ee, 3e-2) << what << ", tensor " << i;
    worst_flash = std::max(worst_flash, ef);
    worst_exact = std::max(worst_exact, ee);
  }
  std::printf("[measured] %s: cuDNN vs flash %.2e, vs fp32 %.2e\n", what.c_str(), worst_flash, worst_exact);
}

}  // namespace

// MLA over packed rows: V unpadded into cuDNN's kernel against V padded into flash's, and against
// fp32 (the masked reference): the layer's output and the gradients of its input and weights. On
// cuDNN V is kv's own columns (a strided view), and the backward takes Q's gradient and the K|V
// rows V's gradient comes back in as they are (counted); against V copied out of kv
// (model::mla_values_in_kv off) the results are the same (1e-6: the same kernels on the same
// values, only V's strides differ; measured equal).
TEST(CudnnPackedAttention, MlaPackedRowsMatchFlash) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(74);
  auto c = *model::make_preset("base", model::Family::Hybrid);
  c.d = 256;  // base's MLA head widths on a narrower layer
  c.mla_heads = 4;
  c.mla_q_rank = 64;
  c.mla_kv_rank = 64;
  model::MLA m(c);
  m->to(torch::kCUDA);
  const auto p = model::packed_positions(torch::tensor(kCuts, torch::kInt64), kB, kT, torch::kCUDA);
  auto u0 = torch::randn({kB, kT, c.d}, torch::kCUDA), gy = torch::randn({kB, kT, c.d}, torch::kCUDA);
  auto forward = [&](const torch::Tensor& u) { return m->forward(u, p); };
  const bool cudnn_here = on_hopper() && model::cudnn_frontend_built();
  auto run = [&](bool cudnn, bool autocast, bool v_in_kv = true) {
    model::mla_values_in_kv(v_in_kv);
    auto check_v = [&](const torch::Tensor& u) {
      const auto qkv = m->attention_inputs(u, p, /*pad_v=*/false);
      if (autocast && cudnn_here) {
        EXPECT_EQ(qkv.v.size(3), cudnn ? c.mla_v_dim : m->qk_dim()) << "V's width, cuDNN " << cudnn;
        const int64_t kv_row = c.mla_nope_dim + c.mla_v_dim;
        EXPECT_EQ(qkv.v.stride(2), cudnn && v_in_kv ? kv_row : qkv.v.size(3)) << "V in kv's rows, cuDNN " << cudnn;
      }
    };
    const int64_t in_place_before = model::mla_gradients_in_place();
    auto r = layer_output_and_grads(*m, forward, u0, gy, cudnn, autocast, check_v);
    const int64_t in_place = model::mla_gradients_in_place() - in_place_before;
    if (autocast && cudnn && cudnn_here) {
      EXPECT_EQ(in_place, v_in_kv ? 2 : 1) << "dq in place, and dkv in V's gradient rows when V is kv's columns";
    }
    model::mla_values_in_kv(true);
    return r;
  };
  const auto fast = run(true, true), flash = run(false, true), exact = run(true, false);
  expect_close_to_flash_and_fp32(fast, flash, exact, "MLA packed rows bf16, V unpadded on cuDNN, padded on flash");
  const auto copied = run(true, true, /*v_in_kv=*/false);
  double worst = 0;
  for (size_t i = 0; i < fast.size(); ++i) {
    const double e = rel_norm_diff(fast[i], copied[i]);
    EXPECT_LT(e, 1e-6) << "V in kv against V copied, tensor " << i;
    worst = std::max(worst, e);
  }
  std::printf("[measured] MLA packed rows bf16 on cuDNN, V in kv's rows vs copied: %.2e\n", worst);
}

// A GPT attention layer over packed rows under bf16 autocast, cuDNN against flash and against fp32
// (the masked reference): output and the gradients of the input and every weight. With QK-norm
// (the presets' path: q and k come out of their own kernel, v is a view of the q|k|v projection)
// and without (rope_qkv's one node), GQA as the presets have it.
TEST(CudnnPackedAttention, GptPackedRowsMatchFlash) {
  DD_REQUIRE_GPU();
  testing_support::seed_from_gtest(75);
  for (const bool qk_norm : {true, false}) {
    auto c = *model::make_preset("tiny", model::Family::Gpt);
    c.attn_heads = 6;
    c.attn_kv_heads = 2;
    c.attn_head_dim = 64;
    c.qk_norm = qk_norm;
    model::Attention m(c);
    m->to(torch::kCUDA);
    const auto p = model::packed_positions(torch::tensor(kCuts, torch::kInt64), kB, kT, torch::kCUDA);
    auto u0 = torch::randn({kB, kT, c.d}, torch::kCUDA), gy = torch::randn({kB, kT, c.d}, torch::kCUDA);
    auto forward = [&](const torch::Tensor& u) { return m->forward(u, p); };
    auto run = [&](bool cudnn, bool autocast) { return layer_output_and_grads(*m, forward, u0, gy, cudnn, autocast); };
    const auto fast = run(true, true), flash = run(false, true), exact = run(true, false);
    expect_close_to_flash_and_fp32(fast, flash, exact,
                                   std::string("GPT attention packed rows bf16 (QK-norm ") + (qk_norm ? "on" : "off") +
                                       ", GQA 6/2)");
  }
}

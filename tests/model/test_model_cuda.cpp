// MODEL.md §11.18 and the CUDA side of §11: the chunked GDR core on the GPU against the fp64 CPU
// reference, every tiny model on CUDA against the CPU, bf16 autocast logits against fp32, the
// varlen flash attention against the masked reference, packed = separate and the overfit smoke
// test under bf16 autocast. Each test prints its measured error (for the issue notes) and skips
// itself where no GPU is present.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cmath>
#include <cstdio>
#include <optional>

#include "model/decoder_lm.h"
#include "model/gated_deltanet.h"
#include "model/gdr.h"
#include "model/gdr_chunk_core.h"
#include "model/fused_rmsnorm.h"
#include "model/fused_rope.h"
#include "model/fused_short_conv.h"
#include "model/linear_cross_entropy.h"
#include "model/mixed_linear.h"
#include "model/mla.h"
#include "tests/support/torch_compare.h"

namespace {

using testing_support::max_abs_diff;
using testing_support::numel_sum;
using testing_support::rel_norm_diff;

using model::Family;

// bf16 autocast on CUDA for the scope, as the trainer will run it.
struct AutocastBf16 {
  AutocastBf16() {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  ~AutocastBf16() {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
};

// Exact fp32 matmuls for the comparisons that promise 1e-5.
struct NoTf32 {
  NoTf32() { at::globalContext().setAllowTF32CuBLAS(false); }
};

std::vector<std::pair<std::string, model::ModelConfig>> tiny_models() {
  return {{"hybrid", *model::make_preset("tiny", Family::Hybrid)},
          {"gpt", *model::make_preset("tiny", Family::Gpt)},
          {"tiny-moe", *model::make_preset("tiny-moe", Family::Hybrid)}};
}

// Random GDR inputs as MODEL.md §11 draws them (mild decay), on the CPU in fp64.
struct GdrInputs {
  torch::Tensor q, k, v, beta, g, h0;
};
GdrInputs gdr_inputs(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv) {
  auto o = torch::TensorOptions().dtype(torch::kFloat64);
  auto l2 = [](const torch::Tensor& x) { return x / torch::sqrt((x * x).sum(-1, true) + 1e-6); };
  GdrInputs in;
  in.q = l2(torch::randn({B, T, H, dk}, o));
  in.k = l2(torch::randn({B, T, H, dk}, o));
  in.v = torch::randn({B, T, H, dv}, o);
  in.beta = torch::sigmoid(torch::randn({B, T, H}, o));
  auto A = torch::rand({H}, o) * 1.5 + 0.5;
  in.g = -A * torch::softplus(torch::randn({B, T, H}, o) + torch::randn({H}, o));
  in.h0 = torch::randn({B, H, dk, dv}, o);
  return in;
}

// A Gated DeltaNet layer at hybrid base's head dims (dk 96, dv 192; two heads, d 192) on the GPU,
// seeded, with an input (drawn in fp32, held in u_dtype), an output gradient and one packed row
// of 300 tokens: the layer tests below compare two paths of it.
struct GdnLayerCase {
  model::GatedDeltaNet m{nullptr};
  torch::Tensor u, dy;
  model::Positions p;
};

GdnLayerCase gdn_layer_case(uint64_t seed, torch::ScalarType u_dtype) {
  model::ModelConfig c;
  c.d = 192;
  c.gdn_heads = 2;
  c.gdn_dk = 96;
  c.gdn_dv = 192;
  torch::manual_seed(seed);
  GdnLayerCase k;
  k.m = model::GatedDeltaNet(c);
  k.m->reset_parameters(0.02, 0.02);
  k.m->to(torch::kCUDA);
  const int64_t T = 300;
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  k.u = torch::randn({1, T, c.d}, f32).to(u_dtype);
  k.dy = torch::randn({1, T, c.d}, f32);
  k.p = model::packed_positions(torch::tensor(std::vector<int64_t>{0, 17, 150, 151, 300}), T, torch::kCUDA);
  return k;
}

// Every parameter's gradient of m, cloned, by name.
std::map<std::string, torch::Tensor> parameter_grads(model::GatedDeltaNet& m) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& kv : m->named_parameters()) grads[kv.key()] = kv.value().grad().clone();
  return grads;
}

}  // namespace

TEST(ModelCuda, ChunkedGdrFp32MatchesFp64Reference) {
  DD_REQUIRE_GPU();
  NoTf32 exact;
  torch::manual_seed(1);
  double worst = 0;
  for (auto [dk, dv] : std::vector<std::pair<int64_t, int64_t>>{{64, 128}, {128, 256}}) {
    for (int64_t T : {64, 65, 300, 1000}) {
      auto in = gdr_inputs(1, T, 2, dk, dv);
      const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
      auto ref = model::gdr_forward_ref(in.q, in.k, in.v, in.beta, in.g, scale, in.h0, {});
      auto cu = [](const torch::Tensor& t) { return t.to(torch::kCUDA, torch::kFloat32); };
      auto got = model::gdr_forward_chunked(cu(in.q), cu(in.k), cu(in.v), cu(in.beta), cu(in.g), scale, cu(in.h0), {}, 64);
      const double e = std::max(max_abs_diff(got.o, ref.o), max_abs_diff(got.h, ref.h));
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << "T=" << T << " dk=" << dk << " dv=" << dv;
    }
  }
  std::printf("[measured] chunked GDR fp32 on CUDA vs fp64 reference: max|d| = %.3g\n", worst);
}

TEST(ModelCuda, ChunkedGdrBf16InputsStayClose) {
  DD_REQUIRE_GPU();
  torch::manual_seed(2);
  auto in = gdr_inputs(1, 1000, 2, 64, 128);
  auto ref = model::gdr_forward_ref(in.q, in.k, in.v, in.beta, in.g, 0.125, in.h0, {});
  auto bf = [](const torch::Tensor& t) { return t.to(torch::kCUDA, torch::kBFloat16); };
  // β and g stay fp32 in the layer (gate math is fp32); q, k, v arrive in bf16 from the projections.
  auto f32 = [](const torch::Tensor& t) { return t.to(torch::kCUDA, torch::kFloat32); };
  auto got = model::gdr_forward_chunked(bf(in.q), bf(in.k), bf(in.v), f32(in.beta), f32(in.g), 0.125, f32(in.h0), {}, 64);
  const double rel = max_abs_diff(got.o, ref.o) / ref.o.abs().max().item<double>();
  std::printf("[measured] chunked GDR with bf16 q/k/v on CUDA vs fp64 reference: max|d|/max|o| = %.3g\n", rel);
  EXPECT_LT(rel, 2e-2);
}

TEST(ModelCuda, Fp32ModelsMatchCpu) {
  DD_REQUIRE_GPU();
  NoTf32 exact;
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(3);
    model::DecoderLM m(cfg);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab_size, {2, 150}, torch::kInt64);
    auto z_cpu = m->forward(tokens);
    m->to(torch::kCUDA);
    auto z_gpu = m->forward(tokens.cuda());
    const double e = max_abs_diff(z_gpu, z_cpu);
    std::printf("[measured] %s fp32 logits CUDA vs CPU: max|d| = %.3g\n", name.c_str(), e);
    EXPECT_LE(e, 1e-4) << name;
  }
}

TEST(ModelCuda, Bf16AutocastLogitsCloseToFp32) {
  DD_REQUIRE_GPU();
  NoTf32 exact;
  const std::vector<int64_t> cu = {0, 5, 69, 70, 200};
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(4);
    model::DecoderLM m(cfg);
    m->to(torch::kCUDA);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab_size, {1, 200}, torch::kInt64).cuda();
    auto cu_t = torch::tensor(cu, torch::kInt64);
    auto z32 = m->forward(tokens), p32 = m->forward_packed(tokens, cu_t);
    torch::Tensor z16, p16;
    {
      AutocastBf16 ac;
      z16 = m->forward(tokens);
      p16 = m->forward_packed(tokens, cu_t);  // the varlen flash path
    }
    EXPECT_EQ(z16.scalar_type(), torch::kFloat32) << name;
    const double dense = max_abs_diff(z16, z32) / z32.abs().max().item<double>();
    const double packed = max_abs_diff(p16, p32) / p32.abs().max().item<double>();
    std::printf("[measured] %s bf16 autocast vs fp32 logits: dense %.3g, packed %.3g (max|d|/max|z|)\n", name.c_str(),
                dense, packed);
    EXPECT_LT(dense, 3e-2) << name;
    EXPECT_LT(packed, 3e-2) << name;
  }
}

TEST(ModelCuda, PackedEqualsSeparateFp32) {
  DD_REQUIRE_GPU();
  NoTf32 exact;
  const std::vector<int64_t> cu = {0, 5, 69, 70, 200};
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(5);
    model::DecoderLM m(cfg);
    m->to(torch::kCUDA);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab_size, {1, 200}, torch::kInt64).cuda();
    auto packed = m->forward_packed(tokens, torch::tensor(cu, torch::kInt64));
    double worst = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      auto alone = m->forward(tokens.narrow(1, cu[n], cu[n + 1] - cu[n]));
      worst = std::max(worst, max_abs_diff(packed.narrow(1, cu[n], cu[n + 1] - cu[n]), alone));
    }
    std::printf("[measured] %s packed vs separate on CUDA fp32: max|d| = %.3g\n", name.c_str(), worst);
    EXPECT_LE(worst, 1e-5) << name;
  }
}

// Two packed rows under bf16 autocast (the flash varlen path over B*T tokens) against the same
// documents run one by one, relative to the logits' scale.
TEST(ModelCuda, PackedRowsBf16MatchSeparate) {
  DD_REQUIRE_GPU();
  const std::vector<int64_t> cu = {0, 30, 100, 101, 140, 200};
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(15);
    model::DecoderLM m(cfg);
    m->to(torch::kCUDA);
    torch::NoGradGuard ng;
    AutocastBf16 ac;
    auto tokens = torch::randint(0, cfg.vocab_size, {2, 100}, torch::kInt64).cuda();
    auto packed = m->forward_packed(tokens, torch::tensor(cu, torch::kInt32)).reshape({200, -1});
    auto flat = tokens.reshape({1, 200});
    double worst = 0, scale = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      auto alone = m->forward(flat.narrow(1, cu[n], cu[n + 1] - cu[n]))[0];
      worst = std::max(worst, max_abs_diff(packed.narrow(0, cu[n], cu[n + 1] - cu[n]), alone));
      scale = std::max(scale, alone.abs().max().item<double>());
    }
    std::printf("[measured] %s packed rows (B=2) vs separate, bf16 on CUDA: max|d|/max|z| = %.3g\n", name.c_str(),
                worst / scale);
    EXPECT_LT(worst / scale, 3e-2) << name;
  }
}

TEST(ModelCuda, FlashVarlenMatchesMaskedReference) {
  DD_REQUIRE_GPU();
  torch::manual_seed(6);
  const std::vector<int64_t> cu = {0, 7, 40, 41, 100};
  auto p = model::packed_positions(torch::tensor(cu, torch::kInt64), 100, torch::kCUDA);
  auto o = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  // 4 query heads over 2 KV heads, dqk = 48 and dv = 32 (the MLA shape: V gets padded).
  auto q = torch::randn({1, 4, 100, 48}, o).requires_grad_(true);
  auto k = torch::randn({1, 2, 100, 48}, o).requires_grad_(true);
  auto v = torch::randn({1, 2, 100, 32}, o).requires_grad_(true);
  auto fast = model::causal_attention(q, k, v, 0.144, p);
  auto ref = model::causal_attention_masked(q.to(torch::kFloat32), k.to(torch::kFloat32), v.to(torch::kFloat32), 0.144, p);
  const double e = max_abs_diff(fast, ref);
  std::printf("[measured] varlen flash (bf16) vs masked fp32 reference: max|d| = %.3g\n", e);
  EXPECT_LT(e, 2e-2);
  ASSERT_EQ(fast.size(-1), 32);
  fast.sum().backward();  // the flash path is differentiable
  EXPECT_TRUE(q.grad().defined() && k.grad().defined() && v.grad().defined());
  EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>());
}

// Dense MLA attention with V unpadded (cuDNN's kernel, where LibTorch's SDPA picks it; on Hopper it
// must) against V zero-padded to the q/k head width, on cuDNN's kernel and on the flash kernel
// (cuDNN switched off), under bf16 autocast at hybrid base's head widths (dn 64, dr 32, dva 64): the
// layer's output and the gradients of its input and of every weight, each also against an fp32 run
// (no autocast: the memory-efficient or math kernel, V padded). The bf16 kernels keep fp32 softmax
// statistics, so they agree with each other and with fp32 to a few bf16 steps. The unpadded run
// must hand SDPA the unpadded V: its attention output's storage holds exactly B·H·T·dva values.
TEST(ModelCuda, MlaNarrowValuesMatchPadded) {
  DD_REQUIRE_GPU();
  torch::manual_seed(21);
  auto c = *model::make_preset("base", Family::Hybrid);
  c.d = 256;  // base's MLA head widths; fewer heads and a narrower model to keep the test small
  c.mla_heads = 4;
  c.mla_q_rank = 64;
  c.mla_kv_rank = 64;
  const int64_t dva = c.mla_v_dim, nh = c.mla_heads;
  ASSERT_LT(dva, c.mla_nope_dim + c.mla_rope_dim);
  model::MLA m(c);
  m->to(torch::kCUDA);
  const int64_t B = 2, T = 300;
  const auto p = model::dense_positions(B, T, torch::kCUDA);
  auto u0 = torch::randn({B, T, c.d}, torch::kCUDA), gy = torch::randn({B, T, c.d}, torch::kCUDA);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const bool narrow = model::dense_attention_takes_narrow_values(B, T, nh, m->qk_dim(), dva, bf16, m->scale());
  std::printf("[measured] MLA dense bf16 B%lld T%lld: V %s\n", (long long)B, (long long)T,
              narrow ? "unpadded (cuDNN)" : "padded (cuDNN not picked)");
#if defined(DD_HAVE_CUDA)
  if (at::cuda::getCurrentDeviceProperties()->major == 9) {
    EXPECT_TRUE(narrow) << "Hopper: SDPA should pick cuDNN";
  }
#endif
  const bool cudnn_was_on = at::globalContext().userEnabledCuDNNSDP();
  auto run = [&](bool narrow_values, bool autocast, bool cudnn) {
    model::attention_narrow_values(narrow_values);
    at::globalContext().setSDPUseCuDNN(cudnn);
    m->zero_grad();
    auto u = u0.clone().requires_grad_(true);
    torch::Tensor y;
    {
      std::optional<AutocastBf16> ac;
      if (autocast) ac.emplace();
      const bool expect_narrow = narrow_values && narrow && autocast && cudnn;
      const auto qkv = m->attention_inputs(u, p, /*pad_v=*/false);
      EXPECT_EQ(qkv.v.size(3), expect_narrow ? dva : m->qk_dim()) << "V's width";
      const auto o = model::causal_attention(qkv.q.transpose(1, 2), qkv.k.transpose(1, 2), qkv.v.transpose(1, 2),
                                             m->scale(), p);
      EXPECT_EQ(o.size(3), qkv.v.size(3));  // a padded V's output keeps its padding (MLA cuts it off)
      EXPECT_EQ(o.storage().nbytes() == static_cast<size_t>(B * nh * T * dva) * o.element_size(), expect_narrow)
          << "whether SDPA got V unpadded";
      y = m->forward(u, p);
    }
    (y.to(torch::kFloat32) * gy).sum().backward();
    std::vector<torch::Tensor> r{y.detach().to(torch::kFloat32), u.grad()};
    for (auto& w : m->parameters()) r.push_back(w.grad().clone());
    return r;
  };
  const auto fast = run(true, true, true), padded = run(false, true, true), flash = run(true, true, false),
             exact = run(true, false, true);
  model::attention_narrow_values(true);
  at::globalContext().setSDPUseCuDNN(cudnn_was_on);
  ASSERT_EQ(fast.size(), padded.size());
  double worst_padded = 0, worst_flash = 0, worst_exact = 0;
  for (size_t i = 0; i < fast.size(); ++i) {
    const double ep = rel_norm_diff(fast[i], padded[i]), ef = rel_norm_diff(fast[i], flash[i]),
                 ee = rel_norm_diff(fast[i], exact[i]);
    EXPECT_LT(ep, 2e-2) << "tensor " << i << " (0: y, 1: du, then the weights' gradients)";
    EXPECT_LT(ef, 2e-2) << "tensor " << i;
    EXPECT_LT(ee, 3e-2) << "tensor " << i;
    EXPECT_LT(rel_norm_diff(flash[i], exact[i]), 3e-2) << "tensor " << i;
    worst_padded = std::max(worst_padded, ep);
    worst_flash = std::max(worst_flash, ef);
    worst_exact = std::max(worst_exact, ee);
  }
  std::printf("[measured] MLA dense bf16, V unpadded (cuDNN) vs padded on cuDNN %.2e, padded on flash %.2e, "
              "fp32 %.2e\n",
              worst_padded, worst_flash, worst_exact);
}

TEST(ModelCuda, CachedDecodeEqualsForward) {
  DD_REQUIRE_GPU();
  NoTf32 exact;
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(7);
    model::DecoderLM m(cfg);
    m->to(torch::kCUDA);
    m->eval();
    torch::NoGradGuard ng;
    auto tokens = torch::randint(0, cfg.vocab_size, {2, 70}, torch::kInt64).cuda();
    auto full = m->forward(tokens);
    auto state = m->new_decode_state();
    double worst = 0;
    for (int64_t t = 0; t < 70; ++t) worst = std::max(worst, max_abs_diff(m->step(tokens.narrow(1, t, 1), state), full.narrow(1, t, 1)));
    std::printf("[measured] %s cached decode vs forward on CUDA fp32: max|d| = %.3g\n", name.c_str(), worst);
    EXPECT_LE(worst, 1e-4) << name;
  }
}

// The Gated DeltaNet layer with its L2Norm inside the delta rule's op (model::gdn_l2norm_in_core,
// the default on a GPU) against the norm as an op of its own, under bf16 autocast at hybrid base's
// head sizes (dk 96, dv 192, where the rule's tail kernel takes the norm's backward: counted), on
// a packed row: the same output to the bit (the same forward kernels); the gradients of the
// parameters q and k come from (wq, wk, conv_q, conv_k) within 1e-2 of the other path (bf16
// rounding in different places); every other parameter's within 1e-5 (the tail's atomic sums).
TEST(ModelCuda, GdnL2NormInsideTheRuleMatchesTheSeparateNorm) {
  DD_REQUIRE_GPU();
  auto k = gdn_layer_case(59, torch::kFloat32);
  auto& m = k.m;
  auto run = [&](bool inside) {
    model::gdn_l2norm_in_core(inside);
    m->zero_grad();
    torch::Tensor y;
    {
      AutocastBf16 ac;
      y = m->forward(k.u, k.p);
    }
    (y.to(torch::kFloat32) * k.dy).sum().backward();
    return std::make_pair(y.detach(), parameter_grads(m));
  };
  const auto separate = run(false);
  const int64_t taken = model::gdr_tail_norm_launches();
  const auto inside = run(true);
  EXPECT_EQ(model::gdr_tail_norm_launches() - taken, 1) << "the tail did not take the norm's backward";
  EXPECT_TRUE(torch::equal(inside.first, separate.first)) << "the output differs";
  for (const auto& [name, g] : separate.second) {
    const bool via_qk = name == "wq.weight" || name == "wk.weight" || name == "conv_q" || name == "conv_k";
    const double e = rel_norm_diff(inside.second.at(name), g);
    EXPECT_LT(e, via_qk ? 1e-2 : 1e-5) << name;
    EXPECT_GT(g.abs().max().item<double>(), 0.0) << name << ": no gradient to compare";
    if (via_qk) std::printf("[measured] GDN layer, L2Norm inside the rule vs separate: %s %.1e\n", name.c_str(), e);
  }
}

// The Gated DeltaNet's a|b gate projection in the q|k|v|g product's GEMM (model::
// gdn_gates_in_projection, the default) against a GEMM of its own, as the trainer runs the layer
// (bf16 input and autocast inside a WeightGradInPlaceScope, so the products take mixed_linear) at
// hybrid base's head dims (dk 96, dv 192; two heads) on a packed row: the output, the input's
// gradient and every parameter's gradient within 1e-2 (the same sums in other GEMM kernels; bf16 rounding). The one product's
// backward takes the conv's gradient buffer for its own, counted, and the conv still fills the
// output gate's gradient buffer in place either way (with an fp32 input the output norm's kernels
// do not run, so neither does).
TEST(ModelCuda, GdnGatesInTheProjectionMatchTheirOwnProduct) {
  DD_REQUIRE_GPU();
  auto k = gdn_layer_case(60, torch::kBFloat16);
  auto& m = k.m;
  auto run = [&](bool one_product) {
    model::gdn_gates_in_projection(one_product);
    m->zero_grad();
    auto u = k.u.clone().requires_grad_(true);
    torch::Tensor y;
    {
      model::WeightGradInPlaceScope in_place(true);
      AutocastBf16 ac;
      y = m->forward(u, k.p);
    }
    (y.to(torch::kFloat32) * k.dy).sum().backward();
    auto grads = parameter_grads(m);
    grads["input"] = u.grad().clone();
    return std::make_pair(y.detach(), grads);
  };
  const int64_t split0 = model::mixed_linear_split_gradients_in_place();
  const int64_t conv0 = model::short_conv_parts_gradients_in_place();
  const auto apart = run(false);
  EXPECT_EQ(model::mixed_linear_split_gradients_in_place(), split0) << "apart, the one product ran";
  const auto one = run(true);
  model::gdn_gates_in_projection(true);
  EXPECT_EQ(model::mixed_linear_split_gradients_in_place() - split0, 1) << "the product's gradient was copied";
  EXPECT_EQ(model::short_conv_parts_gradients_in_place() - conv0, 2) << "the conv copied the gate's gradient";
  const double ey = rel_norm_diff(one.first, apart.first);
  EXPECT_LT(ey, 1e-2) << "the output";
  std::printf("[measured] GDN layer, gates in the projection vs apart: y %.1e", ey);
  for (const auto& [name, g] : apart.second) {
    const double e = rel_norm_diff(one.second.at(name), g);
    EXPECT_LT(e, 1e-2) << name;
    EXPECT_GT(g.abs().max().item<double>(), 0.0) << name << ": no gradient to compare";
    if (name == "input" || name == "wa.weight" || name == "wb.weight" || name == "wq.weight")
      std::printf(", %s %.1e", name.c_str(), e);
  }
  std::printf("\n");
}

// MLA's first products as one GEMM each way against one a group (model::mla_first_products_in_one_gemm),
// as the trainer runs the layer (bf16 input, autocast, in-place weight gradients), at hybrid base's
// ranks and head widths (q rank 384, kv rank 256, rope key 32; four heads) on a packed row: the
// output, the input's gradient and every weight's gradient within 1e-2 (other GEMM kernels, bf16
// rounding), and the one product counted once a forward, only when switched on.
TEST(ModelCuda, MlaFirstProductsInOneGemmMatchOneAGroup) {
  DD_REQUIRE_GPU();
  torch::manual_seed(61);
  auto c = *model::make_preset("base", Family::Hybrid);
  c.d = 256;
  c.mla_heads = 4;
  ASSERT_EQ(c.mla_q_rank, 384);
  ASSERT_EQ(c.mla_kv_rank + c.mla_rope_dim, 288);
  model::MLA m(c);
  m->to(torch::kCUDA);
  const int64_t T = 300;
  const auto p = model::packed_positions(torch::tensor(std::vector<int64_t>{0, 17, 150, 151, 300}), T, torch::kCUDA);
  const auto u0 = torch::randn({1, T, c.d}, torch::kCUDA).to(torch::kBFloat16);
  const auto gy = torch::randn({1, T, c.d}, torch::kCUDA);
  auto run = [&](bool one_gemm) {
    model::mla_first_products_in_one_gemm(one_gemm);
    m->zero_grad();
    auto u = u0.clone().requires_grad_(true);
    const int64_t products = model::mixed_linear_split_products();
    torch::Tensor y;
    {
      model::WeightGradInPlaceScope in_place(true);
      AutocastBf16 ac;
      y = m->forward(u, p);
    }
    EXPECT_EQ(model::mixed_linear_split_products() - products, one_gemm ? 1 : 0) << "one GEMM: " << one_gemm;
    (y.to(torch::kFloat32) * gy).sum().backward();
    std::map<std::string, torch::Tensor> out{{"y", y.detach().to(torch::kFloat32)}, {"input", u.grad().clone()}};
    for (const auto& kv : m->named_parameters()) out[kv.key()] = kv.value().grad().clone();
    return out;
  };
  const auto groups = run(false), one = run(true);
  model::mla_first_products_in_one_gemm(true);
  std::printf("[measured] MLA first products in one GEMM vs one a group:");
  for (const auto& [name, t] : groups) {
    const double e = rel_norm_diff(one.at(name), t);
    EXPECT_LT(e, 1e-2) << name;
    EXPECT_GT(t.abs().max().item<double>(), 0.0) << name << ": nothing to compare";
    std::printf(" %s %.1e", name.c_str(), e);
  }
  std::printf("\n");
}

TEST(ModelCuda, OverfitsOneBatchUnderBf16Autocast) {
  DD_REQUIRE_GPU();
  for (const auto& [name, cfg] : tiny_models()) {
    torch::manual_seed(8);
    model::DecoderLM m(cfg);
    m->to(torch::kCUDA);
    auto data = torch::randint(0, cfg.vocab_size, {2, 129}, torch::kInt64).cuda();
    auto x = data.narrow(1, 0, 128), y = data.narrow(1, 1, 128);
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
    double best_late = 1e9;
    for (int step = 1; step <= 300; ++step) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        AutocastBf16 ac;
        loss = m->loss(x, y);
      }
      loss.backward();
      opt.step();
      const double v = loss.item<double>();
      ASSERT_TRUE(std::isfinite(v)) << name << " step " << step;
      if (step >= 250) best_late = std::min(best_late, v);
    }
    std::printf("[measured] %s bf16 overfit: min loss over steps 250-300 = %.4f\n", name.c_str(), best_late);
    EXPECT_LT(best_late, 0.5) << name;
  }
}

// The chunked head + loss with the fused kernel (bf16 autocast on the GPU) against the plain head on
// the same GPU, and against the same chunks through ATen ops (use_kernel = false).
TEST(ModelCuda, LinearCrossEntropyKernelMatchesPlainHead) {
  DD_REQUIRE_GPU();
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 41);
  const int64_t N = 3000, d = 256, V = 50304;
  auto h0 = torch::randn({N, d}, torch::kCUDA), w0 = torch::randn({V, d}, torch::kCUDA) * 0.05;
  auto t = torch::randint(0, V, {N}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA));
  t.index_put_({torch::rand({N}, torch::kCUDA) < 0.1}, -1);
  auto run = [&](int path) {
    auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      AutocastBf16 ac;
      model::LinearCrossEntropyOptions o;
      o.chunk_rows = 1024;  // three chunks, the last partial
      o.use_kernel = path == 0;
      loss = path == 2 ? model::linear_cross_entropy_reference(h, w, t) : model::linear_cross_entropy(h, w, t, o);
    }
    loss.backward();
    return std::vector<torch::Tensor>{loss.detach(), h.grad(), w.grad()};
  };
  auto kernel = run(0), aten = run(1), plain = run(2);
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm()).item<double>();
  };
  std::printf("[measured] chunked kernel vs plain head (bf16): loss %.3g, dh %.3g, dW %.3g; vs ATen chunks: %.3g %.3g %.3g\n",
              rel(kernel[0], plain[0]), rel(kernel[1], plain[1]), rel(kernel[2], plain[2]), rel(kernel[0], aten[0]),
              rel(kernel[1], aten[1]), rel(kernel[2], aten[2]));
  EXPECT_LT(rel(kernel[0], plain[0]), 1e-4);
  EXPECT_LT(rel(kernel[1], plain[1]), 2e-2);
  EXPECT_LT(rel(kernel[2], plain[2]), 2e-2);
  EXPECT_LT(rel(kernel[0], aten[0]), 1e-4);
  EXPECT_LT(rel(kernel[1], aten[1]), 1e-2);
  EXPECT_LT(rel(kernel[2], aten[2]), 1e-2);
}

// The fused RMSNorm kernels against the ATen formula on the same GPU: output, dx and dw, fp32 and
// bf16 inputs, with and without a weight, odd widths, non-contiguous input, random data each run.
TEST(ModelCuda, FusedRmsNormMatchesReference) {
  DD_REQUIRE_GPU();
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 51);
  struct Shape {
    int64_t rows, C;
  };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const Shape sh : {Shape{1, 37}, Shape{1000, 768}, Shape{333, 4097}, Shape{4096, 2048}}) {
      for (const bool with_weight : {true, false}) {
        auto x0 = (torch::randn({sh.rows, sh.C + 3}, torch::kCUDA) * 2.0).narrow(1, 1, sh.C).to(dtype);  // strided
        auto w0 = with_weight ? torch::rand({sh.C}, torch::kCUDA) + 0.5 : torch::Tensor();
        auto dy = torch::randn({sh.rows, sh.C}, torch::kCUDA).to(dtype);
        auto run = [&](bool fused) {
          auto x = x0.detach().clone().requires_grad_(true);
          auto w = with_weight ? w0.detach().clone().requires_grad_(true) : torch::Tensor();
          auto y = fused ? model::fused_rms_norm(x, w, 1e-6) : model::rms_norm_reference(x, w, 1e-6);
          y.backward(dy);
          return std::vector<torch::Tensor>{y.detach(), x.grad(), with_weight ? w.grad() : torch::zeros({1})};
        };
        auto f = run(true), r = run(false);
        auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
          return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm().clamp_min(1e-30))
              .item<double>();
        };
        // fp32: summation order only. bf16: both round y and dx to bf16 (2^-8) from fp32 math.
        const double tol = dtype == torch::kFloat32 ? 1e-5 : 8e-3;
        const std::string what = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + " rows=" +
                                 std::to_string(sh.rows) + " C=" + std::to_string(sh.C) + (with_weight ? " w" : " no-w");
        EXPECT_EQ(f[0].scalar_type(), dtype) << what;
        EXPECT_LT(rel(f[0], r[0]), tol) << what;
        EXPECT_LT(rel(f[1], r[1]), tol) << what;
        if (with_weight) {
          EXPECT_LT(rel(f[2], r[2]), dtype == torch::kFloat32 ? 1e-5 : 1e-2) << what;
        }
        if (sh.C == 4097) std::printf("[measured] fused RMSNorm %s: y %.3g dx %.3g dw %.3g\n", what.c_str(),
                                      rel(f[0], r[0]), rel(f[1], r[1]), with_weight ? rel(f[2], r[2]) : 0.0);
      }
    }
  }
}

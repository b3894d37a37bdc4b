// The engine's GPU paths against their references, on the GPU machine (label gpu; each test skips
// itself without a GPU): FP8 linear products against fp32 products, the fused CUDA AdamW against
// the written-out single-tensor AdamW, and short runs on CUDA in every precision. Each prints its
// measured figures for the issue notes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "kernels/adamw.h"
#include "kernels/kernel_image.h"
#include "model/expert_grads_in_pieces.h"
#include "model/expert_product.h"
#include "model/fp8_linear.h"
#include "model/fused_gated_norm.h"
#include "model/grad_square_sums.h"
#include "model/grouped_linear.h"
#include "model/kernel_dtype.h"
#include "model/linear.h"
#include "model/mixed_linear.h"
#include "model/weight_shadow.h"
#include "tests/support/torch_compare.h"
#include "tests/trainer/train_harness.h"
#include "trainer/adamw.h"
#include "trainer/device.h"
#include "trainer/muon.h"

using namespace train_harness;

namespace {

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  auto g = got.to(torch::kCPU, torch::kFloat64), w = want.to(torch::kCPU, torch::kFloat64);
  return ((g - w).norm() / w.norm()).item<double>();
}

}  // namespace

// The check for GPUs our kernels have no image for (kernels/kernel_image.h; before compute
// capability 9.0 the first launch would fail inside a training step): every GPU of the GPU machine
// (Hopper) takes them, so trainer::check_device accepts run.devices = "all" there, the thread's
// current device stays as it was, and an index past the last GPU is an error of its own, not a
// missing image. (The refusal itself needs an older GPU, which the GPU machine does not have.)
TEST(TrainerCuda, KernelImageCheckAcceptsThisMachinesGpus) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU on this machine";
  const int n = static_cast<int>(torch::cuda::device_count());
  const auto before = c10::cuda::current_device();
  EXPECT_EQ(kernels::kernel_arch(), 90);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(kernels::kernel_image_status(i), 0) << "cuda:" << i;
    EXPECT_FALSE(kernels::kernel_image_missing(i)) << "cuda:" << i;
  }
  EXPECT_NE(kernels::kernel_image_status(n), 0) << "a device past the last";
  EXPECT_FALSE(kernels::kernel_image_missing(n)) << "a device past the last is not a missing image";
  EXPECT_EQ(c10::cuda::current_device(), before) << "the current device left alone";
  trainer::RunConfig cfg;
  cfg.run.devices = "all";
  cfg.train.precision = "bf16";
  const auto errors = trainer::check_device(cfg);
  EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors.front());
}

// train.precision "auto" (the default) is bf16 on this machine's GPUs (compute capability 9.0), one
// or all of them, and fp32 for CPU ranks; a precision given is kept.
TEST(TrainerCuda, PrecisionAutoIsBf16OnTheGpu) {
  DD_REQUIRE_GPU();
  auto resolved = [](const std::string& devices, const std::string& precision) {
    trainer::RunConfig cfg;
    EXPECT_EQ(cfg.train.precision, "auto");
    cfg.run.devices = devices;
    cfg.train.precision = precision;
    trainer::resolve_precision(cfg);
    return cfg.train.precision;
  };
  EXPECT_EQ(resolved("auto", "auto"), "bf16");
  EXPECT_EQ(resolved("0", "auto"), "bf16");
  EXPECT_EQ(resolved("all", "auto"), "bf16");
  EXPECT_EQ(resolved("cpu", "auto"), "fp32");
  EXPECT_EQ(resolved("0", "fp32"), "fp32");
}

// Quantisation puts amax on the format's largest value; every element of a normal-range value comes
// back within half an e4m3 step (2^-4 relative).
TEST(TrainerCuda, Fp8QuantizeRoundTrip) {
  DD_REQUIRE_GPU();
  torch::manual_seed(1);
  auto x = torch::randn({97, 160}, torch::kCUDA) * 3.0;
  auto [q, scale] = model::quantize_fp8(x, at::kFloat8_e4m3fn);
  EXPECT_EQ(q.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_NEAR(scale.item<double>(), x.abs().max().item<double>() / model::kFp8E4m3Max, 1e-6);
  auto back = q.to(torch::kFloat) * scale;
  auto normal = x.abs() > scale * std::pow(2.0, -6);  // e4m3's smallest normal, in x's units
  const double worst = ((back - x).abs() / x.abs()).masked_select(normal).max().item<double>();
  std::printf("fp8 e4m3 round trip: worst relative error %.4f (bound 0.0625)\n", worst);
  EXPECT_LE(worst, 0.0625 + 1e-6);
  EXPECT_EQ(model::take_fp8_saturations(torch::Device(torch::kCUDA, 0)), 0);
}

// y = x Wᵀ and both gradients through float8 against fp32 products, on odd leading shapes:
// relative Frobenius error below 5% forward (e4m3) and 10% for the gradients (e5m2 incoming).
TEST(TrainerCuda, Fp8LinearMatchesFp32Products) {
  DD_REQUIRE_GPU();
  torch::manual_seed(2);
  for (auto shape : std::vector<std::vector<int64_t>>{{3, 48, 256}, {1, 112, 64}}) {
    const int64_t in = shape.back(), out = 384;
    auto x = torch::randn(shape, torch::kCUDA).requires_grad_(true);
    auto w = (torch::randn({out, in}, torch::kCUDA) / std::sqrt(static_cast<double>(in))).requires_grad_(true);
    auto gy = torch::randn({shape[0], shape[1], out}, torch::kCUDA);
    ASSERT_TRUE(model::fp8_linear_fits(x, w));
    auto y = model::fp8_linear(x, w);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    y.backward(gy.to(torch::kBFloat16));
    auto x_ref = x.detach().clone().requires_grad_(true), w_ref = w.detach().clone().requires_grad_(true);
    auto y_ref = torch::matmul(x_ref, w_ref.t());
    y_ref.backward(gy);
    const double ey = rel_error(y, y_ref), ex = rel_error(x.grad(), x_ref.grad()), ew = rel_error(w.grad(), w_ref.grad());
    std::printf("fp8 linear %s: rel error y %.4f, dx %.4f, dW %.4f\n", c10::str(x.sizes()).c_str(), ey, ex, ew);
    EXPECT_LT(ey, 0.05);
    EXPECT_LT(ex, 0.10);
    EXPECT_LT(ew, 0.10);
    EXPECT_EQ(x.grad().scalar_type(), torch::kFloat);
    EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);
  }
  // Shapes fp8 cannot take fall back to the plain product inside an Fp8Scope.
  model::Linear odd(24, 40);
  odd->to(torch::kCUDA);
  auto xo = torch::randn({5, 24}, torch::kCUDA);
  model::Fp8Scope fp8;
  EXPECT_TRUE(torch::allclose(odd(xo), torch::linear(xo, odd->weight)));
}

// Both fused kernels (ours, kernels/adamw.h, and ATen's) against the single-tensor path (the same
// values on the CPU), five steps with weight decay on some tensors, two of them with a gradient
// divisor: equal to 1e-6. The shapes cover several chunks per tensor, lengths not divisible by 4,
// an unaligned tensor (a slice) and more tensors than one launch of ours takes.
TEST(TrainerCuda, FusedAdamWMatchesTheReference) {
  DD_REQUIRE_GPU();
  for (const bool ours : {true, false}) {
    trainer::AdamW::use_own_kernel(ours);
    torch::manual_seed(3);
    std::vector<std::vector<int64_t>> shapes = {{64, 48}, {129}, {7, 3, 5}, {1}, {40001}, {300, 129}};
    for (int i = 0; i < 70; ++i) shapes.push_back({1 + i % 9});
    std::vector<std::pair<std::string, at::Tensor>> gpu, cpu;
    std::vector<bool> decay;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto p = torch::randn(shapes[i]);
      cpu.emplace_back("p" + std::to_string(i), p.clone().requires_grad_(true));
      // One parameter starts 4 bytes past a 16-byte boundary: the element-wise path.
      auto on_gpu = i == 1 ? torch::zeros({p.numel() + 1}, torch::kCUDA).narrow(0, 1, p.numel()).view(p.sizes())
                           : torch::empty(p.sizes(), torch::kCUDA);
      on_gpu.copy_(p);
      gpu.emplace_back("p" + std::to_string(i), on_gpu.requires_grad_(true));
      decay.push_back(i % 2 == 0);
    }
    trainer::AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
    trainer::AdamW fused(gpu, decay, o), ref(cpu, decay, o);
    double worst = 0;
    for (int step = 0; step < 5; ++step) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        auto g = torch::randn(shapes[i]);
        cpu[i].second.mutable_grad() = g.clone();
        gpu[i].second.mutable_grad() = g.to(torch::kCUDA);
      }
      // Steps 3 and 4 divide the gradients as they are read (clipping folded into the update).
      const double divisor = step == 3 ? 2.5 : step == 4 ? 1.0 : 0.0;
      if (divisor > 0) {
        fused.step(1e-2, torch::full({}, divisor, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA)));
        ref.step(1e-2, torch::full({}, divisor, torch::kFloat));
      } else {
        fused.step(1e-2);
        ref.step(1e-2);
      }
      for (size_t i = 0; i < shapes.size(); ++i)
        worst = std::max(worst, (gpu[i].second.detach().cpu() - cpu[i].second.detach()).abs().max().item<double>());
    }
    std::printf("fused AdamW (%s kernel) vs reference, 5 steps (two with a gradient divisor): max |diff| %.3g\n",
                ours ? "our" : "ATen's", worst);
    EXPECT_LT(worst, 1e-6) << (ours ? "our kernel" : "ATen's kernel");
  }
  trainer::AdamW::use_own_kernel(true);
}

// Muon's two multi-tensor passes (kernels/muon_update.h) against ATen's ops (the reference, the same
// Muon with use_own_kernels off) on the same GPU: wide, tall, square, odd-sized and stacked
// matrices, one starting 4 bytes past a 16-byte boundary (the element-by-element path), one without
// a gradient in a step; the iteration in fp32 and in bf16, with and without Nesterov, weight
// decay on; the bf16 shadows written by the pass though not asked (a raw write bumps no version).
// Three steps, each taken by the kernels. The momenta are ATen's bit for bit; the update fuses a
// multiply and an add that ATen rounds apart, so weights agree within 1e-5. With a bf16 iteration
// and Nesterov a direction value may round to bf16 the other way, which moves the orthogonalised u
// by about a bf16 ulp (2⁻⁸ below 1): weights within 3 steps × lr 0.02 × scale 1.55 × 2⁻⁸ = 3.6e-4
// (6.0e-5 measured, before the momenta matched). The shadows are bf16(w) exactly.
TEST(TrainerCuda, MuonKernelsMatchAtensSteps) {
  DD_REQUIRE_GPU();
  // Two 33 × 33: a group of two, the second's slice of the stack past its start (and its gradient
  // skipped in a step).
  const std::vector<std::vector<int64_t>> shapes = {{64, 96}, {96, 40}, {33, 33}, {7, 130}, {3, 17, 9}, {5, 12},
                                                    {33, 33}};
  for (const bool bf16 : {false, true}) {
    for (const bool nesterov : {true, false}) {
      torch::manual_seed(12);
      std::vector<std::pair<std::string, at::Tensor>> ours, aten;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const auto w = torch::randn(shapes[i]);
        const int64_t n = w.numel();
        auto a = i == 3 ? torch::zeros({n + 1}, torch::kCUDA).narrow(0, 1, n).view(w.sizes())
                        : torch::empty(w.sizes(), torch::kCUDA);
        a.copy_(w);
        ours.emplace_back("w" + std::to_string(i), a);
        aten.emplace_back("w" + std::to_string(i), w.to(torch::kCUDA));
      }
      const trainer::MuonOptions o{0.9, nesterov, 5, 0.1, bf16 ? torch::kBFloat16 : torch::kFloat};
      trainer::Muon by_kernels(ours, o), by_aten(aten, o);
      model::clear_weight_shadows();
      std::vector<at::Tensor> shadows;
      for (auto& [name, w] : ours) {
        if (w.dim() == 2 && w.is_contiguous()) shadows.push_back(model::shadowed_weight_blocks({w}, torch::kBFloat16));
      }
      double worst_w = 0, worst_m = 0;
      for (int step = 0; step < 3; ++step) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          const bool skipped = step == 1 && (i == 5 || i == 6);
          const auto g = torch::randn(shapes[i], torch::kCUDA);
          ours[i].second.mutable_grad() = skipped ? at::Tensor() : g.clone();
          aten[i].second.mutable_grad() = skipped ? at::Tensor() : g.clone();
        }
        trainer::Muon::use_own_kernels(true);
        const int64_t taken = trainer::Muon::kernel_updates_taken();
        by_kernels.step(0.02);
        EXPECT_EQ(trainer::Muon::kernel_updates_taken(), taken + 1) << "the kernels did not take the step";
        trainer::Muon::use_own_kernels(false);
        by_aten.step(0.02);
        trainer::Muon::use_own_kernels(true);
        for (size_t i = 0; i < shapes.size(); ++i)
          worst_w = std::max(worst_w, (ours[i].second - aten[i].second).abs().max().item<double>());
        const auto mk = by_kernels.state_tensors(), ma = by_aten.state_tensors();
        for (size_t i = 0; i < mk.size(); ++i)
          worst_m = std::max(worst_m, (mk[i].second - ma[i].second).abs().max().item<double>());
        size_t s = 0;
        for (auto& [name, w] : ours) {
          if (w.dim() != 2 || !w.is_contiguous()) continue;
          EXPECT_TRUE(torch::equal(shadows[s++], w.to(torch::kBFloat16))) << name << " step " << step;
        }
      }
      std::printf("Muon kernels vs ATen (%s iteration, %s): 3 steps, max |diff| weights %.3g, momenta %.3g\n",
                  bf16 ? "bf16" : "fp32", nesterov ? "Nesterov" : "plain", worst_w, worst_m);
      EXPECT_LT(worst_w, bf16 && nesterov ? 3.6e-4 : 1e-5);
      EXPECT_EQ(worst_m, 0.0);  // the momenta rounded as ATen's two passes round them
      model::clear_weight_shadows();
    }
  }
}

// Our AdamW reading MoE expert gradients from their bf16 pieces (kernels/adamw.h's
// AdamWGradPieces) updates exactly as it does from the fp32 .grad the pieces would have been
// scattered into: three steps, one with a clip divisor, unsplit and in pieces of 7 rows, weights,
// moments and bf16 shadows bit for bit. A plain weight in the same optimizer keeps its .grad path.
TEST(TrainerCuda, AdamWReadsExpertGradientsFromPieces) {
  DD_REQUIRE_GPU();
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the device-offset grouped GEMM needs sm90/sm100";
  torch::manual_seed(11);
  const std::vector<int64_t> rows = {300, 0, 41, 1000, 64, 7};
  const int64_t E = static_cast<int64_t>(rows.size()), K = 256, M = 1412;
  const at::Device gpu(torch::kCUDA, 0);
  auto offsets = torch::tensor(rows, torch::kInt64).cumsum(0).to(torch::kInt32).to(gpu);
  auto x = torch::randn({M, K}, torch::TensorOptions().device(gpu).dtype(torch::kBFloat16));
  const std::vector<torch::Tensor> w0 = {torch::randn({E, 96, K}, gpu) / 8, torch::randn({E, 32, K}, gpu) / 8,
                                         torch::randn({33, 5}, gpu)};
  for (const int64_t piece : {int64_t{0}, int64_t{7}}) {
    model::expert_grad_piece_rows(piece);
    model::clear_weight_shadows();
    std::vector<std::pair<std::string, at::Tensor>> a, b;
    for (size_t i = 0; i < w0.size(); ++i) {
      a.emplace_back("w" + std::to_string(i), w0[i].clone().requires_grad_(true));
      b.emplace_back("w" + std::to_string(i), w0[i].clone().requires_grad_(true));
    }
    trainer::AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
    trainer::AdamW opt_a(a, {true, true, false}, o), opt_b(b, {true, true, false}, o);
    for (int step = 0; step < 3; ++step) {
      const auto dy = torch::randn({M, 128}, x.options());
      const auto g_plain = torch::randn({33, 5}, gpu);
      const auto divisor = torch::full({}, step == 1 ? 2.5 : 1.0, torch::TensorOptions().dtype(torch::kFloat).device(gpu));
      auto backward = [&](std::vector<std::pair<std::string, at::Tensor>>& ps) {
        model::WeightGradInPlaceScope scope;
        std::vector<torch::Tensor> w = {ps[0].second, ps[1].second};
        model::expert_product(x, w, offsets, torch::kBFloat16).backward(dy);
        ps[2].second.mutable_grad() = g_plain.clone();
      };
      backward(a);
      opt_a.step(1e-2, divisor);
      opt_a.zero_grad();
      {
        model::ExpertGradsInPiecesScope scope(gpu, true);
        backward(b);
        ASSERT_NE(model::expert_grad_pieces_of(b[0].second), nullptr);
        ASSERT_FALSE(b[0].second.grad().defined());
        opt_b.step(1e-2, divisor);
      }
      opt_b.zero_grad();
      for (size_t i = 0; i < w0.size(); ++i) {
        const std::string what = "piece " + std::to_string(piece) + " step " + std::to_string(step) + " w" + std::to_string(i);
        EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what;
        const auto sa = opt_a.state_tensors(), sb = opt_b.state_tensors();
        for (size_t k = 0; k < sa.size(); ++k) EXPECT_TRUE(torch::equal(sa[k].second, sb[k].second)) << what << " " << sa[k].first;
        if (i < 2) {
          ASSERT_TRUE(model::weight_shadow_of(b[i].second).defined()) << what;
          EXPECT_TRUE(torch::equal(model::weight_shadow_of(b[i].second), b[i].second.detach().to(torch::kBFloat16))) << what;
        }
      }
    }
    EXPECT_NE(a[0].second.detach().sub(w0[0]).abs().max().item<float>(), 0.f) << "the weights did not move";
  }
  model::expert_grad_piece_rows(-1);
  model::clear_weight_shadows();
}

// Our AdamW kernel reading a weight's gradient from its 16-bit pieces (kernels::adamw_update_from_pieces)
// against the same kernel reading the fp32 sum of those pieces, added in piece order as the kernel
// adds them: weights, moments and bf16 shadows bit for bit. The cases take the 4-wide path (block
// and piece stride multiples of 4, aligned source) and the element-by-element one (an odd block, a
// source one element off alignment), bf16 and fp16 pieces, pieces listed per expert (none for some
// experts: a zero gradient) and one piece an expert (no tables), with a clip divisor. Descriptions
// the kernel cannot read are refused before anything is written.
TEST(TrainerCuda, AdamWFromPiecesMatchesTheSummedGradient) {
  DD_REQUIRE_GPU();
  torch::manual_seed(23);
  const at::Device gpu(torch::kCUDA, 0);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(gpu);
  struct Case {
    int64_t experts, block, stride_pad, src_offset;
    at::ScalarType dt;
    bool tables;
    const char* what;
  };
  const Case cases[] = {{5, 768, 0, 0, torch::kBFloat16, true, "4-wide, bf16, pieces listed per expert"},
                        {5, 768, 4, 0, torch::kHalf, true, "4-wide, fp16"},
                        {4, 15, 3, 0, torch::kBFloat16, true, "odd block: element by element"},
                        {4, 64, 0, 1, torch::kBFloat16, true, "source off alignment: element by element"},
                        {3, 40, 8, 0, torch::kHalf, false, "one piece an expert, no tables"}};
  const auto lr = torch::full({}, 1e-2, f32), step = torch::full({}, 3.0, f32), divisor = torch::full({}, 2.5, f32);
  for (const Case& c : cases) {
    const int64_t stride = c.block + c.stride_pad, n = c.experts * c.block;
    std::vector<int32_t> first, count;
    int32_t pieces = 0;
    for (int64_t e = 0; e < c.experts; ++e) {
      first.push_back(pieces);
      count.push_back(c.tables ? static_cast<int32_t>((e + 1) % 3) : 1);  // 1, 2, 0, 1, 2 pieces
      pieces += count.back();
    }
    auto storage = torch::randn({(pieces + 1) * stride + c.src_offset}, f32).to(c.dt);  // one piece more, unread
    auto src = storage.narrow(0, c.src_offset, pieces * stride);
    auto want_grad = torch::zeros({c.experts, c.block}, f32);
    for (int64_t e = 0; e < c.experts; ++e)
      for (int32_t q = first[e]; q < first[e] + count[e]; ++q)
        want_grad[e] += src.narrow(0, q * stride, c.block).to(torch::kFloat);
    want_grad = want_grad.reshape({n});
    auto p0 = torch::randn({n}, f32), m0 = torch::randn({n}, f32) * 1e-2, v0 = torch::rand({n}, f32) * 1e-3;
    auto make = [&](torch::Tensor& p, torch::Tensor& m, torch::Tensor& v, torch::Tensor& shadow) {
      p = p0.clone();
      m = m0.clone();
      v = v0.clone();
      shadow = torch::zeros({n}, f32.dtype(torch::kBFloat16));
      kernels::AdamWTensor t;
      t.p = p.data_ptr<float>();
      t.m = m.data_ptr<float>();
      t.v = v.data_ptr<float>();
      t.n = n;
      t.weight_decay = 0.1f;
      t.shadow = shadow.data_ptr();
      return t;
    };
    torch::Tensor pa, ma, va, sa, pb, mb, vb, sb;
    kernels::AdamWTensor ta = make(pa, ma, va, sa), tb = make(pb, mb, vb, sb);
    ta.g = want_grad.data_ptr<float>();
    auto first_d = torch::tensor(first, torch::kInt32).to(gpu), count_d = torch::tensor(count, torch::kInt32).to(gpu);
    kernels::AdamWGradPieces g;
    g.src = src.data_ptr();
    g.dt = c.dt == torch::kHalf ? kernels::DType::F16 : kernels::DType::BF16;
    g.block = static_cast<int32_t>(c.block);
    g.piece_stride = stride;
    if (c.tables) {
      g.first = first_d.data_ptr<int32_t>();
      g.count = count_d.data_ptr<int32_t>();
    }
    void* st = model::stream_of(pa);
    auto update = [&](const kernels::AdamWGradPieces& gp, kernels::AdamWTensor t) {
      return kernels::adamw_update_from_pieces(&t, &gp, 1, lr.data_ptr<float>(), step.data_ptr<float>(),
                                               divisor.data_ptr<float>(), 0.9f, 0.95f, 1e-8f, st);
    };
    model::check_kernel_launch(kernels::adamw_update(&ta, 1, lr.data_ptr<float>(), step.data_ptr<float>(),
                                                     divisor.data_ptr<float>(), 0.9f, 0.95f, 1e-8f, st),
                               "adamw_update");
    model::check_kernel_launch(update(g, tb), "adamw_update_from_pieces");
    EXPECT_TRUE(torch::equal(pa, pb)) << c.what << ": weights";
    EXPECT_TRUE(torch::equal(ma, mb)) << c.what << ": first moments";
    EXPECT_TRUE(torch::equal(va, vb)) << c.what << ": second moments";
    EXPECT_TRUE(torch::equal(sa, sb)) << c.what << ": shadows";
    EXPECT_FALSE(torch::equal(pb, p0)) << c.what << ": the weights did not move";

    // Refused: nothing is launched, so the weights keep the values they have now.
    const auto p_now = pb.clone();
    auto refused = [&](const char* why, kernels::AdamWGradPieces bad, int64_t tensor_n) {
      kernels::AdamWTensor t = tb;
      t.n = tensor_n;
      EXPECT_NE(update(bad, t), 0) << c.what << ": " << why;
    };
    kernels::AdamWGradPieces bad = g;
    bad.dt = kernels::DType::F32;
    refused("fp32 pieces", bad, n);
    bad = g;
    bad.src = nullptr;
    refused("no source", bad, n);
    bad = g;
    bad.block = 0;
    refused("an empty block", bad, n);
    bad = g;
    bad.piece_stride = c.block - 1;
    refused("pieces closer than a block", bad, n);
    bad = g;
    bad.first = first_d.data_ptr<int32_t>();
    bad.count = nullptr;
    refused("first without count", bad, n);
    refused("a weight that is not whole blocks", g, n - 1);
    EXPECT_TRUE(torch::equal(pb, p_now)) << c.what << ": a refused update wrote the weights";
  }
}

// Our AdamW kernel keeps the linear layers' bf16 weight shadows current (model/weight_shadow.h):
// after every step each shadow equals its updated weight cast to bf16, bit for bit, and the
// forwards after the first reuse them without a cast. ATen's AdamW writes no shadows, so the
// forward after it recasts, and the values stay right.
TEST(TrainerCuda, AdamWKeepsTheWeightShadowsCurrent) {
  DD_REQUIRE_GPU();
  torch::manual_seed(11);
  model::clear_weight_shadows();
  model::Linear a(64, 96), b(64, 40);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  trainer::AdamW opt({{"a", a->weight}, {"b", b->weight}}, {true, false}, trainer::AdamWOptions{});
  auto x = torch::randn({5, 7, 64}, torch::kCUDA);
  auto step = [&] {
    torch::Tensor y;
    {
      testing_support::CudaAutocast autocast(at::kBFloat16);
      model::WeightGradInPlaceScope scope;
      y = model::linear_cat(x, {a, b});
    }
    y.to(torch::kFloat).pow(2).mean().backward();
    opt.step(1e-2);
    opt.zero_grad();
    return y;
  };
  auto matches = [&] {
    for (const auto& w : {a->weight, b->weight}) {
      auto shadow = model::weight_shadow_of(w);
      if (!shadow.defined() || !torch::equal(shadow, w.detach().to(torch::kBFloat16))) return false;
    }
    return true;
  };
  step();
  const int64_t casts = model::weight_shadow_casts();
  for (int i = 0; i < 3; ++i) {
    step();
    EXPECT_TRUE(matches()) << "after step " << i + 2;
  }
  EXPECT_EQ(model::weight_shadow_casts(), casts) << "a forward recast a shadow AdamW had kept current";
  // The forward's output is the product with the current weights' cast.
  // (A stale shadow, one step behind, would differ by about 10%; another GEMM kernel by bf16's rounding.)
  torch::Tensor y;
  {
    testing_support::CudaAutocast autocast(at::kBFloat16);
    model::WeightGradInPlaceScope scope;
    y = model::linear_cat(x, {a, b}).detach();
  }
  auto want = torch::matmul(x.to(torch::kBFloat16), torch::cat({a->weight, b->weight}).detach().to(torch::kBFloat16).t());
  EXPECT_LT(testing_support::rel_norm_diff(y, want), 5e-3);
  trainer::AdamW::use_own_kernel(false);
  step();
  EXPECT_FALSE(matches()) << "ATen's AdamW does not write the shadows (else this test would not see the recast)";
  step();
  EXPECT_EQ(model::weight_shadow_casts(), casts + 1) << "the forward after ATen's AdamW did not recast";
  trainer::AdamW::use_own_kernel(true);
  model::clear_weight_shadows();
}

// The same for stacked MoE expert weights (model/expert_product.h): gate and up [E, n, K] share one
// shadow [E, 2n, K], each weight's block strided across the experts, which our AdamW writes in
// runs (AdamWTensor::shadow_block); down has one of its own.
TEST(TrainerCuda, AdamWKeepsStackedExpertShadowsCurrent) {
  DD_REQUIRE_GPU();
  torch::manual_seed(13);
  model::clear_weight_shadows();
  auto opt32 = torch::TensorOptions().device(torch::kCUDA);
  auto gate = (torch::randn({6, 24, 40}, opt32) / 8).requires_grad_(true);
  auto up = (torch::randn({6, 24, 40}, opt32) / 8).requires_grad_(true);
  auto down = (torch::randn({6, 40, 24}, opt32) / 8).requires_grad_(true);
  trainer::AdamW opt({{"gate", gate}, {"up", up}, {"down", down}}, {true, true, false}, trainer::AdamWOptions{});
  auto matches = [&] {
    for (const auto& w : {gate, up, down}) {
      auto shadow = model::weight_shadow_of(w);
      if (!shadow.defined() || !torch::equal(shadow, w.detach().to(torch::kBFloat16))) return false;
    }
    return true;
  };
  model::shadowed_expert_blocks({gate, up}, torch::kBFloat16);
  model::shadowed_expert_blocks({down}, torch::kBFloat16);
  ASSERT_TRUE(matches());
  ASSERT_FALSE(model::weight_shadow_of(gate).is_contiguous()) << "gate's block should be strided across the experts";
  const int64_t casts = model::weight_shadow_casts();
  for (int i = 0; i < 3; ++i) {
    for (const auto& w : {gate, up, down}) w.mutable_grad() = torch::randn_like(w);
    opt.step(1e-2);
    opt.zero_grad();
    EXPECT_TRUE(matches()) << "after step " << i + 1;
    model::shadowed_expert_blocks({gate, up}, torch::kBFloat16);
    model::shadowed_expert_blocks({down}, torch::kBFloat16);
  }
  EXPECT_EQ(model::weight_shadow_casts(), casts) << "a use recast a shadow AdamW had kept current";
  model::clear_weight_shadows();
}

// The tiny GPT learns on CUDA in every precision; the run reports memory, MFU against the known peak,
// the loss scale (fp16 scales dynamically, the others keep 1) and no FP8 saturations.
TEST(TrainerCuda, TrainsInEveryPrecision) {
  DD_REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16", "fp16", "fp8"}) {
    TempDir dir;
    auto cfg = make_config(dir, 80, {"run.devices=\"0\"", std::string("train.precision=\"") + precision + "\""});
    auto r = run(cfg, dir.path() + "/run");
    ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << precision << ": " << r.ended.message;
    double last10 = 0;
    for (size_t i = r.losses.size() - 10; i < r.losses.size(); ++i) last10 += r.losses[i] / 10;
    std::printf("%s on CUDA: loss %.3f -> %.3f (mean of last 10), scale %.0f, peak mem %.3f GiB, mfu %.5f\n",
                precision, r.losses.front(), last10, r.metrics["loss_scale"].back(),
                r.metrics["mem_peak_gib"].back(), r.metrics["mfu"].empty() ? 0.0 : r.metrics["mfu"].back());
    EXPECT_LT(last10, r.losses.front() - 2.0) << precision;
    EXPECT_FALSE(r.metrics["mem_peak_gib"].empty()) << precision;
    EXPECT_GT(r.metrics["mem_peak_gib"].back(), 0.0) << precision;
    const double scale = r.metrics["loss_scale"].back();
    if (std::string(precision) == "fp16") {
      EXPECT_TRUE(std::isfinite(scale) && scale >= 1.0) << precision << " scale " << scale;
    } else {
      EXPECT_EQ(scale, 1.0) << precision;
    }
    if (std::string(precision) == "fp8") {
      ASSERT_FALSE(r.metrics["fp8_saturations"].empty());
      EXPECT_EQ(r.metrics["fp8_saturations"].back(), 0.0);
    }
  }
}

// The step captured as a CUDA graph trains like the eager step: the same loss at every step and the
// same validation losses (bf16, EMA weights swapped in for validation between replays): a GPT, a
// hybrid and a hybrid with MoE layers (on GPUs whose grouped GEMM takes device offsets) on
// fixed-shape batches with two micro-batches per step, and a GPT and a hybrid on packed batches
// whose cu_seqlens are padded to a fixed length, where one step (the 4th, after the capture at the
// 3rd) has more document pieces than the padding's room and runs eagerly in between replays. The replays
// run the eager step's kernels on the same data, so they agree to rounding; a replay that missed the
// inputs, the positions, the lr or the update would not.
TEST(TrainerCuda, CudaGraphStepMatchesTheEagerStep) {
  DD_REQUIRE_GPU();
  struct Case {
    const char* name;
    std::vector<std::string> options;
    bool overflows;
  };
  const std::vector<Case> cases = {
      {"gpt, fixed shape", {"model.family=\"gpt\"", "data.document_attention=false", "train.grad_accum=2"}, false},
      {"hybrid, fixed shape", {"model.family=\"hybrid\"", "data.document_attention=false", "train.grad_accum=2"}, false},
      // MoE in bf16 (sm90/sm100): its grouped GEMMs take device offsets, so nothing is read on the host.
      {"hybrid MoE, fixed shape",
       {"model.family=\"hybrid\"", "model.preset=\"tiny-moe\"", "data.document_attention=false", "train.grad_accum=2"},
       false},
      {"gpt, packed", {"model.family=\"gpt\"", "data.document_attention=true", "train.grad_accum=1", "train.cuda_graph_pieces=16"},
       true},
      // The Gated DeltaNet layers plan each packed batch's chunks at a fixed size into fixed buffers.
      {"hybrid, packed",
       {"model.family=\"hybrid\"", "data.document_attention=true", "train.grad_accum=1", "train.cuda_graph_pieces=16"},
       true},
      // fp8: the quantisations' delayed scales and amax records live on the device, so replays
      // update them as the eager steps do.
      {"gpt fp8, fixed shape",
       {"model.family=\"gpt\"", "data.document_attention=false", "train.grad_accum=2", "train.precision=\"fp8\""},
       false},
      // Muon reads its lr from the device and writes the linear layers' bf16 weight shadows inside
      // the graph (a replay bumps no version, so a stale shadow would go unseen and stop learning).
      {"gpt muon, fixed shape",
       {"model.family=\"gpt\"", "data.document_attention=false", "train.grad_accum=2", "train.optimizer=\"muon\"",
        "train.weight_decay=0.1"},
       false},
      {"hybrid MoE muon, fixed shape",  // the experts' stacked shadows too
       {"model.family=\"hybrid\"", "model.preset=\"tiny-moe\"", "data.document_attention=false", "train.grad_accum=2",
        "train.optimizer=\"muon\"", "train.muon_experts=true"},
       false},
      {"hybrid muon, packed",
       {"model.family=\"hybrid\"", "data.document_attention=true", "train.grad_accum=1", "train.cuda_graph_pieces=16",
        "train.optimizer=\"muon\""},
       true},
  };
  for (const auto& c : cases) {
    if (std::string(c.name).find("MoE") != std::string::npos && !model::grouped_mm_device_ok(0)) {
      std::printf("%s: skipped (the MoE grouped GEMM needs host counts on this GPU)\n", c.name);
      continue;
    }
    TempDir dir;
    if (c.overflows) {
      // Short documents among the alphabet ones: about 14 pieces per batch of 8 rows, 19 at step 4.
      std::string shorts;
      for (int i = 0; i < 200; ++i) shorts += "xy" + std::to_string(i % 10) + "\n%\n";
      dir.write("corpus/short.txt", shorts);
    }
    auto with = [&](const char* mode) {
      std::vector<std::string> o = {"run.devices=\"0\"", "train.precision=\"bf16\"", "train.ema_decay=0.9",
                                    "run.eval_interval=10", "model.L=3"};
      o.insert(o.end(), c.options.begin(), c.options.end());
      o.push_back(std::string("train.cuda_graph=\"") + mode + "\"");
      return make_config(dir, 30, o);
    };
    const int64_t by_list_0 = model::gated_norm_padding_rows_by_list();
    const int64_t unread_0 = model::gated_norm_padding_rows_unread();
    auto eager = run(with("off"), dir.path() + "/eager");
    const int64_t by_list_1 = model::gated_norm_padding_rows_by_list();
    const int64_t unread_1 = model::gated_norm_padding_rows_unread();
    auto graph = run(with("on"), dir.path() + "/graph");
    // Packed hybrid rows: the captured step's fixed chunk layouts have the delta rule's backward
    // skip their padding rows by a row map, so the output norm leaves those rows of its gradient
    // unwritten (model/gdr_plan_slots.h); the eager step's layouts do neither (the norm zeroes
    // them after marking the named rows).
    const std::string name = c.name;
    const bool packed_hybrid = name.find("hybrid") == 0 && name.find("packed") != std::string::npos;
    EXPECT_EQ(by_list_1 - by_list_0, 0) << c.name << ": the eager step zeroed padding rows by a list";
    EXPECT_EQ(unread_1 - unread_0, 0) << c.name << ": the eager step left padding rows unwritten";
    EXPECT_EQ(model::gated_norm_padding_rows_by_list(), by_list_1) << c.name << ": padding rows zeroed by list";
    if (packed_hybrid) {
      EXPECT_GT(model::gated_norm_padding_rows_unread(), unread_1) << c.name << ": padding rows written";
    }
    ASSERT_EQ(eager.ended.status, trainer::RunStatus::Finished) << c.name << ": " << eager.ended.message;
    ASSERT_EQ(graph.ended.status, trainer::RunStatus::Finished) << c.name << ": " << graph.ended.message;
    ASSERT_EQ(graph.losses.size(), 30u);
    ASSERT_EQ(eager.losses.size(), graph.losses.size());
    bool captured = false, overflowed = false;
    for (const auto& l : graph.logs) {
      captured = captured || l.find("captured") != std::string::npos;
      overflowed = overflowed || l.find("run eagerly") != std::string::npos;
    }
    EXPECT_TRUE(captured) << c.name << ": no capture in the log";
    EXPECT_EQ(overflowed, c.overflows) << c.name;
    double worst = 0;
    for (size_t i = 0; i < eager.losses.size(); ++i)
      worst = std::max(worst, std::abs(graph.losses[i] - eager.losses[i]) / std::abs(eager.losses[i]));
    ASSERT_EQ(eager.val_losses.size(), graph.val_losses.size());
    double worst_val = 0;
    for (size_t i = 0; i < eager.val_losses.size(); ++i)
      worst_val = std::max(worst_val, std::abs(graph.val_losses[i] - eager.val_losses[i]) / eager.val_losses[i]);
    std::printf("%s: CUDA graph vs eager over 30 steps: worst loss difference %.2e, val %.2e; loss %.3f -> %.3f\n",
                c.name, worst, worst_val, graph.losses.front(), graph.losses.back());
    EXPECT_LT(worst, 1e-2) << c.name;
    EXPECT_LT(worst_val, 1e-2) << c.name;
    EXPECT_LT(graph.losses.back(), graph.losses.front() - 1.0) << c.name << ": the replayed steps did not learn";
  }
}

// The clipping norm from the MoE experts' recorded sums of squares (model/grad_square_sums.h)
// against the norm that reads every gradient, and the experts' gradients left in their pieces for
// AdamW (model/expert_grads_in_pieces.h) against writing them to .grad: a bf16 tiny-moe hybrid, 12
// steps, eager and as a CUDA graph; two micro-batches a step for the norm (the second backward adds
// into .grad), one for the pieces (which need one). Each pair is one path off, then on, and the on
// run must have taken it. The first step's norms agree to fp32 summation order (1e-5; the pieces'
// update is the same arithmetic, 1e-6); later steps differ by rounding fed back through training
// (loose bounds).
TEST(TrainerCuda, GradNormFromRecordedSquareSumsMatchesReadingTheGradients) {
  DD_REQUIRE_GPU();
  if (!model::grouped_mm_device_ok(0)) GTEST_SKIP() << "the MoE grouped GEMM needs host counts on this GPU";
  struct Path {
    const char* name;
    int64_t grad_accum;
    void (*allow)(bool);
    int64_t (*uses)();
    double first_step_tolerance;
  };
  const Path paths[] = {
      {"grad norm from recorded sums vs read", 2, model::producer_grad_square_sums, model::grad_square_sums_taken, 1e-5},
      {"experts' gradients in pieces vs in .grad", 1, model::expert_grads_in_pieces_allowed,
       model::expert_grad_pieces_recorded, 1e-6},
  };
  auto worst_relative = [](const std::vector<double>& got, const std::vector<double>& want) {
    double worst = 0;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    return worst;
  };
  for (const char* graph : {"off", "on"}) {
    for (const Path& path : paths) {
      TempDir dir;
      auto cfg = make_config(dir, 12, {"run.devices=\"0\"", "train.precision=\"bf16\"", "model.family=\"hybrid\"",
                                       "model.preset=\"tiny-moe\"", "model.L=3", "data.document_attention=false",
                                       "train.grad_accum=" + std::to_string(path.grad_accum), "train.grad_clip=0.5",
                                       std::string("train.cuda_graph=\"") + graph + "\""});
      const std::string what = std::string(path.name) + ", graph " + graph;
      path.allow(false);
      const int64_t uses_before = path.uses();
      auto off = run(cfg, dir.path() + "/off");
      EXPECT_EQ(path.uses(), uses_before) << what;
      path.allow(true);
      auto on = run(cfg, dir.path() + "/on");
      EXPECT_GT(path.uses(), uses_before) << what << ": the path was never taken";
      ASSERT_EQ(off.ended.status, trainer::RunStatus::Finished) << what << ": " << off.ended.message;
      ASSERT_EQ(on.ended.status, trainer::RunStatus::Finished) << what << ": " << on.ended.message;
      const auto& want = off.metrics["grad_norm"];
      const auto& got = on.metrics["grad_norm"];
      ASSERT_EQ(want.size(), got.size()) << what;
      ASSERT_FALSE(want.empty()) << what;
      ASSERT_EQ(off.losses.size(), on.losses.size()) << what;
      const double worst_norm = worst_relative(got, want), worst_loss = worst_relative(on.losses, off.losses);
      std::printf("%s: step 1 %.3e vs %.3e (%.1e), worst over %zu steps: norm %.1e, loss %.1e\n", what.c_str(),
                  got[0], want[0], std::abs(got[0] - want[0]) / want[0], want.size(), worst_norm, worst_loss);
      EXPECT_NEAR(got[0], want[0], path.first_step_tolerance * want[0]) << what;
      EXPECT_LT(worst_norm, 1e-2) << what;
      EXPECT_LT(worst_loss, 1e-2) << what;
    }
  }
}

// fp8 with delayed scaling resumes exactly: the checkpoint carries every fp8 layer's amax records.
// The first resumed step's loss (a forward from the saved weights and records) matches the 2N-step
// run's bit for bit; without the records it would take its scales from current amaxes instead and
// differ. Later steps agree to the GPU backward's rounding (attention's backward sums in any order).
TEST(TrainerCuda, Fp8ResumeIsBitIdentical) {
  DD_REQUIRE_GPU();
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  TempDir dir;
  const int64_t N = 8;
  auto cfg = make_config(dir, 2 * N, {"run.devices=\"0\"", "train.precision=\"fp8\"", "run.save_interval=8",
                                      "data.document_attention=false"});
  auto full = run(cfg, dir.path() + "/full");
  ASSERT_EQ(full.ended.status, trainer::RunStatus::Finished) << full.ended.message;
  ASSERT_EQ(full.checkpoints.size(), 2u);
  auto mid = trainer::load_checkpoint(full.checkpoints[0]);
  int records = 0;
  for (const auto& [name, t] : mid.state) {
    if (name.rfind("fp8_amax.", 0) != 0) continue;
    ++records;
    EXPECT_GT(t.narrow(1, 0, 1).min().item<float>(), 0.f) << name << ": no amax filed";
  }
  EXPECT_GE(records, 4) << "fp8 amax records in the checkpoint";  // per block: q|k|v, o, gate|up, down
  auto resumed = run(cfg, dir.path() + "/resumed", full.checkpoints[0]);
  ASSERT_EQ(resumed.ended.status, trainer::RunStatus::Finished) << resumed.ended.message;
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(N));
  EXPECT_EQ(resumed.losses[0], full.losses[N]) << "step " << N + 1;
  double worst = 0;
  for (int64_t i = 0; i < N; ++i)
    worst = std::max(worst, std::abs(resumed.losses[i] - full.losses[N + i]) / std::abs(full.losses[N + i]));
  std::printf("fp8 resume: %d amax records; step %lld's loss %s, worst relative difference over steps %lld..%lld %.2e\n",
              records, static_cast<long long>(N + 1), resumed.losses[0] == full.losses[N] ? "identical" : "DIFFERS",
              static_cast<long long>(N + 1), static_cast<long long>(2 * N), worst);
  EXPECT_LT(worst, 1e-3);
}

// fp8 on two GPUs: each rank's delayed scales come from its own data's amaxes, so the checkpoint
// carries every rank's records (fp8_amax.<module> for rank 0, fp8_amax_rank1.<module> for rank 1,
// which differ), and a resumed run repeats the uninterrupted one: step 9's loss (the mean over both
// ranks) bit-identical, steps 9..16 within 1e-3.
TEST(TrainerCuda, TwoGpuFp8ResumeIsBitIdentical) {
  DD_REQUIRE_GPU();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  if (!model::fp8_supported(torch::Device(torch::kCUDA, 0))) GTEST_SKIP() << "no fp8 on this GPU";
  TempDir dir;
  const int64_t N = 8;
  auto cfg = make_config(dir, 2 * N, {"run.devices=\"0,1\"", "train.precision=\"fp8\"", "run.save_interval=8",
                                      "data.document_attention=false"});
  auto full = run(cfg, dir.path() + "/full");
  ASSERT_EQ(full.ended.status, trainer::RunStatus::Finished) << full.ended.message;
  ASSERT_EQ(full.checkpoints.size(), 2u);
  auto mid = trainer::load_checkpoint(full.checkpoints[0]);
  std::map<std::string, at::Tensor> rank0, rank1;
  for (const auto& [name, t] : mid.state) {
    if (name.rfind("fp8_amax.", 0) == 0) rank0[name.substr(9)] = t;
    if (name.rfind("fp8_amax_rank1.", 0) == 0) rank1[name.substr(15)] = t;
  }
  EXPECT_GE(rank0.size(), 4u);
  EXPECT_EQ(rank1.size(), rank0.size()) << "rank 1's records in the checkpoint";
  int differ = 0;
  for (const auto& [module, t] : rank1) differ += rank0.count(module) && !torch::equal(t, rank0[module]);
  EXPECT_GT(differ, 0) << "rank 1's amaxes (its own data's) differ from rank 0's somewhere";
  auto resumed = run(cfg, dir.path() + "/resumed", full.checkpoints[0]);
  ASSERT_EQ(resumed.ended.status, trainer::RunStatus::Finished) << resumed.ended.message;
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(N));
  EXPECT_EQ(resumed.losses[0], full.losses[N]) << "step " << N + 1;
  double worst = 0;
  for (int64_t i = 0; i < N; ++i)
    worst = std::max(worst, std::abs(resumed.losses[i] - full.losses[N + i]) / std::abs(full.losses[N + i]));
  std::printf("2-GPU fp8 resume: %zu + %zu amax records (%d differ); step %lld's loss %s, worst relative difference "
              "over steps %lld..%lld %.2e\n",
              rank0.size(), rank1.size(), differ, static_cast<long long>(N + 1),
              resumed.losses[0] == full.losses[N] ? "identical" : "DIFFERS", static_cast<long long>(N + 1),
              static_cast<long long>(2 * N), worst);
  EXPECT_LT(worst, 1e-3);
}

// Two GPUs as two rank threads (NCCL), on a machine that has them: the run ends with its validation
// (summed across ranks on the devices) and learns; it trains the tokens of both ranks.
TEST(TrainerCuda, TwoGpuRunValidatesAndLearns) {
  DD_REQUIRE_GPU();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  TempDir dir;
  auto cfg = make_config(dir, 40, {"run.devices=\"0,1\"", "train.precision=\"bf16\"", "run.eval_interval=20"});
  auto r = run(cfg, dir.path() + "/two");
  ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
  ASSERT_GE(r.val_losses.size(), 2u);  // at step 20 and at the end
  std::printf("2 GPUs: loss %.3f -> %.3f, val %.3f -> %.3f\n", r.losses.front(), r.losses.back(), r.val_losses.front(),
              r.val_losses.back());
  EXPECT_LT(r.losses.back(), r.losses.front() - 2.0);
  EXPECT_LT(r.val_losses.back(), r.val_losses.front());
}

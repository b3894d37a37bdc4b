// Engine parts against hand-computed cases: the dynamic loss scaler's state sequence (GradScaler
// semantics) and step skipping, EMA updates and the swap that restores weights bit for bit (also
// after an exception), Newton–Schulz orthogonalisation and Muon's steps (a stack of matrices too).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "trainer/adamw.h"
#include "trainer/comm.h"
#include "trainer/ema.h"
#include "trainer/fp8_checkpoint.h"
#include "trainer/grad_clip.h"
#include "trainer/loss_scaler.h"
#include "trainer/muon.h"
#include "trainer/step_profile.h"
#include "trainer/zero1.h"
#include "model/grad_square_sums.h"
#include "model/weight_shadow.h"

TEST(LossScaler, FollowsGradScalerStateSequence) {
  trainer::LossScaler s({/*enabled=*/true, /*init_scale=*/8.0, 2.0, 0.5, /*growth_interval=*/3});
  // (found_inf, scale after, growth tracker after, skipped after)
  struct Step {
    bool inf;
    double scale;
    int64_t tracker, skipped;
  };
  const std::vector<Step> script = {
      {false, 8, 1, 0}, {false, 8, 2, 0}, {false, 16, 0, 0},  // three finite steps: ×2
      {true, 8, 0, 1},                                         // inf: ×0.5, tracker reset, skipped
      {false, 8, 1, 1}, {true, 4, 0, 2}, {true, 2, 0, 3},      // a finite step does not protect
      {false, 2, 1, 3}, {false, 2, 2, 3}, {false, 4, 0, 3}, {false, 4, 1, 3},
  };
  for (size_t i = 0; i < script.size(); ++i) {
    s.update(script[i].inf);
    EXPECT_EQ(s.scale(), script[i].scale) << "step " << i;
    EXPECT_EQ(s.growth_tracker(), script[i].tracker) << "step " << i;
    EXPECT_EQ(s.skipped_steps(), script[i].skipped) << "step " << i;
  }
  trainer::LossScaler restored({true});
  restored.load_state(s.state());
  EXPECT_EQ(restored.scale(), 4.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
  EXPECT_EQ(restored.skipped_steps(), 3);
  // Disabled: scale 1, updates change nothing.
  trainer::LossScaler off({false});
  off.update(true);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_EQ(off.skipped_steps(), 0);
}

TEST(LossScaler, NanGradientSkipsTheStepAndLeavesWeights) {
  trainer::LossScaler s({true, 1024.0, 2.0, 0.5, 2000});
  auto w = torch::randn({4, 3}).requires_grad_(true);
  auto before = w.detach().clone();
  auto loss = s.scale_loss((w * w).sum());
  loss.backward();
  // Finite case first: the gradient comes back unscaled, exactly 2w.
  ASSERT_FALSE(s.unscale_and_check({w}));
  EXPECT_TRUE(torch::allclose(w.grad(), 2 * before, 0, 1e-6));
  // Inject a NaN: the step must be skipped.
  w.mutable_grad().index_put_({1, 2}, NAN);
  const bool found = s.unscale_and_check({w});
  EXPECT_TRUE(found);
  if (!found) {
    torch::NoGradGuard ng;
    w.sub_(w.grad(), 0.1);
  }
  s.update(found);
  EXPECT_TRUE(torch::equal(w.detach(), before));
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.skipped_steps(), 1);
}

// Every defined gradient is divided by the scale in one pass; an inf in any one of them is found,
// and a parameter without a gradient is passed over.
TEST(LossScaler, UnscalesEveryGradientAndFindsAnInfAnywhere) {
  trainer::LossScaler s({true, 256.0, 2.0, 0.5, 2000});
  auto a = torch::randn({5, 7}).requires_grad_(true);
  auto b = torch::randn({33}).requires_grad_(true);
  auto unused = torch::randn({2}).requires_grad_(true);
  s.scale_loss((a * a).sum() + (3 * b).sum()).backward();
  ASSERT_FALSE(s.unscale_and_check({a, unused, b}));
  EXPECT_TRUE(torch::allclose(a.grad(), 2 * a.detach(), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(b.grad(), torch::full_like(b, 3.0), 0, 1e-6));
  EXPECT_FALSE(unused.grad().defined());
  b.mutable_grad().index_put_({32}, -INFINITY);
  EXPECT_TRUE(s.unscale_and_check({a, unused, b}));
}

// "auto" scales the loss for fp16 only; "dynamic" always, "off" never.
TEST(LossScaler, AutoScalesFp16Only) {
  using trainer::loss_scaling_enabled;
  EXPECT_TRUE(loss_scaling_enabled("auto", "fp16"));
  for (const char* p : {"fp32", "bf16", "fp8"}) {
    EXPECT_FALSE(loss_scaling_enabled("auto", p)) << p;
    EXPECT_TRUE(loss_scaling_enabled("dynamic", p)) << p;
    EXPECT_FALSE(loss_scaling_enabled("off", p)) << p;
  }
  EXPECT_FALSE(loss_scaling_enabled("off", "fp16"));
}

TEST(Ema, UpdateMatchesTheFormula) {
  auto p = torch::tensor({1.0f, 2.0f}).requires_grad_(true);
  trainer::Ema ema({{"w", p}}, 0.9);
  {
    torch::NoGradGuard ng;
    p.copy_(torch::tensor({3.0f, -2.0f}));
  }
  ema.update();
  // 0.9·old + 0.1·new = (0.9 + 0.3, 1.8 - 0.2) = (1.2, 1.6)
  auto shadow = ema.state_tensors()[0].second;
  EXPECT_NEAR(shadow[0].item<float>(), 1.2f, 1e-6);
  EXPECT_NEAR(shadow[1].item<float>(), 1.6f, 1e-6);
  EXPECT_EQ(ema.state_tensors()[0].first, "ema.w");
}

TEST(Ema, SwapRestoresBitIdenticalWeightsWithoutCopies) {
  torch::manual_seed(1);
  auto a = torch::randn({64, 32}).requires_grad_(true), b = torch::randn({32}).requires_grad_(true);
  trainer::Ema ema({{"a", a}, {"b", b}}, 0.99);
  {
    torch::NoGradGuard ng;
    a.add_(1.0);
    b.mul_(3.0);
  }
  ema.update();
  const auto a_trained = a.detach().clone(), b_trained = b.detach().clone();
  const void* a_ptr = a.data_ptr();
  const void* shadow_ptr = ema.state_tensors()[0].second.data_ptr();
  {
    trainer::Ema::Swap swap(ema);
    // The parameter now points at the EMA storage: swapped, not copied.
    EXPECT_EQ(a.data_ptr(), shadow_ptr);
    EXPECT_FALSE(torch::equal(a.detach(), a_trained));
  }
  EXPECT_EQ(a.data_ptr(), a_ptr);
  EXPECT_TRUE(torch::equal(a.detach(), a_trained));
  EXPECT_TRUE(torch::equal(b.detach(), b_trained));
  // An exception during evaluation still restores the trained weights.
  try {
    trainer::Ema::Swap swap(ema);
    throw std::runtime_error("evaluation failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(torch::equal(a.detach(), a_trained));
  EXPECT_TRUE(torch::equal(b.detach(), b_trained));
  EXPECT_TRUE(a.requires_grad());
}

TEST(Muon, NewtonSchulzSingularValuesNearOne) {
  torch::manual_seed(2);
  for (auto shape : std::vector<std::vector<int64_t>>{{64, 32}, {32, 64}, {48, 48}}) {
    auto G = torch::randn(shape);
    auto X = trainer::newton_schulz_orthogonalize(G, 5);
    auto sv = torch::linalg_svdvals(X);
    EXPECT_GT(sv.min().item<double>(), 0.6) << shape[0] << "x" << shape[1];
    EXPECT_LT(sv.max().item<double>(), 1.25) << shape[0] << "x" << shape[1];
    // Orthogonalisation keeps the singular vectors: X is aligned with G.
    EXPECT_GT((X * G).sum().item<double>(), 0.0);
  }
}

// The iteration as MODEL.md writes it, one matrix at a time, with plain products and sums: the
// reference for newton_schulz_orthogonalize's fused products (its sums in the GEMMs' epilogues) and
// batched stacks.
static at::Tensor newton_schulz_by_the_formula(const at::Tensor& G, int64_t steps) {
  const bool tall = G.size(0) > G.size(1);
  auto X = tall ? G.t() : G;
  X = X / (X.norm() + 1e-7);
  for (int64_t i = 0; i < steps; ++i) {
    const auto A = torch::mm(X, X.t());
    X = 3.4445 * X + torch::mm(-4.7750 * A + 2.0315 * torch::mm(A, A), X);
  }
  return tall ? X.t() : X;
}

TEST(Muon, NewtonSchulzMatchesTheFormula) {
  torch::manual_seed(4);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{24, 40}, std::vector<int64_t>{40, 24},
                                             std::vector<int64_t>{3, 24, 40}, std::vector<int64_t>{2, 33, 17}}) {
    const auto G = torch::randn(shape);
    const auto X = trainer::newton_schulz_orthogonalize(G, 5);
    ASSERT_EQ(X.sizes(), G.sizes());
    const auto Xs = X.dim() == 2 ? X.unsqueeze(0) : X;
    const auto Gs = G.dim() == 2 ? G.unsqueeze(0) : G;
    for (int64_t e = 0; e < Gs.size(0); ++e) {
      const auto want = newton_schulz_by_the_formula(Gs[e], 5);
      EXPECT_TRUE(torch::allclose(Xs[e], want, 1e-5, 1e-5))
          << c10::str(shape) << " matrix " << e << ": " << (Xs[e] - want).abs().max().item<double>();
    }
  }
}

TEST(Muon, OneStepOnADiagonalGradientByHand) {
  // For G = diag(3, 0.5) every Newton–Schulz step acts on each singular value alone:
  // x ← a x + b x³ + c x⁵, starting from x / ||G||_F.
  auto w = torch::zeros({2, 2}).requires_grad_(true);
  trainer::Muon opt({{"w", w}}, {/*momentum=*/0.95, /*nesterov=*/true, /*ns_steps=*/5, /*weight_decay=*/0.0});
  w.mutable_grad() = torch::tensor({{3.0f, 0.0f}, {0.0f, 0.5f}});
  opt.step(/*lr=*/0.1);
  auto poly = [](double x) {
    for (int i = 0; i < 5; ++i) x = 3.4445 * x - 4.7750 * x * x * x + 2.0315 * x * x * x * x * x;
    return x;
  };
  // Nesterov direction g + μ·m = 1.95·g: the normalisation removes the factor.
  const double norm = std::sqrt(9.0 + 0.25);
  EXPECT_NEAR(w[0][0].item<double>(), -0.1 * poly(3.0 / norm), 1e-5);
  EXPECT_NEAR(w[1][1].item<double>(), -0.1 * poly(0.5 / norm), 1e-5);
  EXPECT_NEAR(w[0][1].item<double>(), 0.0, 1e-7);
  auto s = opt.state_tensors();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(torch::allclose(s[0].second, w.grad()));  // m = g after one step
  EXPECT_THROW(trainer::Muon({{"bias", torch::zeros({3})}}, {}), std::invalid_argument);
}

// The halves of a step for a CUDA graph: update() applies the lr the last begin_step wrote, each
// time it runs (a replay runs update() alone), and equals step(). With write_shadows it writes the
// updated weights' bf16 shadows (model/weight_shadow.h), which a replay could not otherwise refresh;
// without, it leaves them as they were (the forward's version check recasts them).
TEST(Muon, UpdateAppliesTheLrBeginStepWroteAndWritesShadowsWhenAsked) {
  torch::manual_seed(4);
  const trainer::MuonOptions o{0.9, true, 5, 0.1};
  const auto w0 = torch::randn({6, 10});
  auto by_step = w0.clone(), by_halves = w0.clone();
  trainer::Muon a({{"w", by_step}}, o), b({{"w", by_halves}}, o);
  model::clear_weight_shadows();
  const auto shadow = model::shadowed_weight_blocks({by_halves}, torch::kBFloat16);
  ASSERT_TRUE(model::weight_shadow_of(by_halves).defined());
  const std::vector<double> lrs = {0.05, 0.05, 0.02};  // begin_step before the first and third only
  for (size_t i = 0; i < lrs.size(); ++i) {
    const auto g = torch::randn({6, 10});
    by_step.mutable_grad() = g.clone();
    by_halves.mutable_grad() = g.clone();
    a.step(lrs[i]);
    if (i != 1) b.begin_step(lrs[i]);
    const auto before = shadow.clone();
    b.update(/*write_shadows=*/i != 2);
    EXPECT_TRUE(torch::allclose(by_halves, by_step, 1e-6, 1e-6)) << "step " << i;
    if (i != 2) EXPECT_TRUE(torch::equal(shadow, by_halves.to(torch::kBFloat16))) << "step " << i;
    else EXPECT_TRUE(torch::equal(shadow, before)) << "step " << i;
  }
  model::clear_weight_shadows();
}

// The update written out, for the paths the tests above do not take: no Nesterov, the iteration in
// bf16 (the GPU's default), a tall stack of experts [E, rows, cols] with weight decay, and its
// stacked bf16 shadow (model::shadowed_expert_blocks) written by update(write_shadows). Per step:
// m = μ m + g, X = bf16(m), u = NS(X), w = w (1 − lr wd) − lr sqrt(rows / cols) u.
TEST(Muon, Bf16IterationWithoutNesterovOnAStackMatchesTheUpdateWrittenOut) {
  torch::manual_seed(6);
  const trainer::MuonOptions o{/*momentum=*/0.8, /*nesterov=*/false, /*ns_steps=*/5, /*weight_decay=*/0.2,
                               torch::kBFloat16};
  auto w = torch::randn({3, 10, 4});  // tall: rows / cols = 2.5
  auto want = w.clone();
  auto m = torch::zeros_like(w);
  trainer::Muon opt({{"experts", w}}, o);
  model::clear_weight_shadows();
  const auto shadow = model::shadowed_expert_blocks({w}, torch::kBFloat16);
  ASSERT_TRUE(model::weight_shadow_of(w).defined());
  for (const double lr : {0.05, 0.03}) {
    const auto g = torch::randn({3, 10, 4});
    w.mutable_grad() = g.clone();
    opt.begin_step(lr);
    opt.update(/*write_shadows=*/true);
    m = 0.8 * m + g;
    const auto u = trainer::newton_schulz_orthogonalize(m.to(torch::kBFloat16), 5).to(torch::kFloat);
    want = want * (1.0 - lr * 0.2) - lr * std::sqrt(2.5) * u;
    EXPECT_TRUE(torch::allclose(w, want, 1e-6, 1e-6)) << "lr " << lr << ": " << (w - want).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(shadow, w.to(torch::kBFloat16))) << "lr " << lr;
  }
  EXPECT_TRUE(torch::equal(opt.state_tensors()[0].second, m));
  model::clear_weight_shadows();
  // One lr scalar serves every parameter: they must share a device.
  EXPECT_THROW(trainer::Muon({{"a", torch::zeros({2, 2})}, {"b", torch::zeros({2, 2}, torch::kMeta)}}, {}),
               std::invalid_argument);
}

// A stack of matrices (the MoE experts' [E, rows, cols]) takes each matrix's own Muon update: two
// steps on a wide and a tall stack, with weight decay, equal Muon on each matrix as a parameter of
// its own (fp32; the batched products may sum in another order: 1e-6 relative).
TEST(Muon, AStackOfMatricesStepsEachMatrixByItself) {
  torch::manual_seed(5);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 4, 6}, std::vector<int64_t>{2, 7, 3}}) {
    const auto w0 = torch::randn(shape);
    const trainer::MuonOptions o{/*momentum=*/0.9, /*nesterov=*/true, /*ns_steps=*/5, /*weight_decay=*/0.1};
    auto stack = w0.clone();
    std::vector<at::Tensor> apart;
    std::vector<std::pair<std::string, at::Tensor>> apart_params;
    for (int64_t e = 0; e < shape[0]; ++e) {
      apart.push_back(w0[e].clone());
      apart_params.emplace_back("w" + std::to_string(e), apart.back());
    }
    trainer::Muon a({{"stack", stack}}, o), b(apart_params, o);
    for (int step = 0; step < 2; ++step) {
      const auto g = torch::randn(shape);
      stack.mutable_grad() = g.clone();
      for (int64_t e = 0; e < shape[0]; ++e) apart[e].mutable_grad() = g[e].clone();
      a.step(/*lr=*/0.05);
      b.step(/*lr=*/0.05);
    }
    for (int64_t e = 0; e < shape[0]; ++e) {
      EXPECT_FALSE(torch::equal(stack[e], w0[e]));
      EXPECT_TRUE(torch::allclose(stack[e], apart[e], /*rtol=*/1e-6, /*atol=*/1e-6))
          << "matrix " << e << " of " << c10::str(shape) << ": " << (stack[e] - apart[e]).abs().max().item<double>();
    }
  }
  // Each matrix normalised by its own norm: scaling one expert's gradient does not move another's.
  const auto X = trainer::newton_schulz_orthogonalize(torch::stack({torch::ones({2, 3}), 100 * torch::eye(2, 3)}), 5);
  EXPECT_TRUE(torch::allclose(X[0], trainer::newton_schulz_orthogonalize(torch::ones({2, 3}), 5), 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(X[1], trainer::newton_schulz_orthogonalize(torch::eye(2, 3), 5), 1e-6, 1e-6));
  EXPECT_THROW(trainer::Muon({{"four", torch::zeros({2, 2, 2, 2})}}, {}), std::invalid_argument);
}

// Matrices of one size step through one batched iteration: three parameters (two of one size, one
// of another, one of them without a gradient this step) step as three Muon optimizers of one each.
TEST(Muon, MatricesOfOneSizeStepTogetherAsEachAlone) {
  torch::manual_seed(8);
  const std::vector<std::vector<int64_t>> shapes = {{5, 3}, {4, 6}, {5, 3}};
  std::vector<at::Tensor> together, alone;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < shapes.size(); ++i) {
    together.push_back(torch::randn(shapes[i]));
    alone.push_back(together.back().clone());
    named.emplace_back("w" + std::to_string(i), together.back());
  }
  const trainer::MuonOptions o{0.9, true, 5, 0.05};
  trainer::Muon group(named, o);
  std::vector<trainer::Muon> each;
  for (size_t i = 0; i < shapes.size(); ++i)
    each.emplace_back(std::vector<std::pair<std::string, at::Tensor>>{{"w", alone[i]}}, o);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const bool has_grad = !(step == 1 && i == 2);
      const auto g = torch::randn(shapes[i]);
      together[i].mutable_grad() = has_grad ? g.clone() : at::Tensor();
      alone[i].mutable_grad() = has_grad ? g.clone() : at::Tensor();
    }
    group.step(0.1);
    for (auto& m : each) m.step(0.1);
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_TRUE(torch::allclose(together[i], alone[i], 1e-6, 1e-6)) << "w" << i;
}

// The iteration in bf16 (train.muon_precision, a GPU's default) orthogonalises as the fp32 one
// does, to bf16's precision: singular values in the same band, the result within 5% (relative
// Frobenius; 3.2 – 3.7% measured) of fp32's, for a wide, a tall and a stacked gradient. bf16 rounds
// each value to 2⁻⁹ and the iteration multiplies small singular values' errors by up to a = 3.44 a
// step, so the difference is a few percent, not 2⁻⁹.
TEST(Muon, Bf16IterationMatchesFp32ToBf16Precision) {
  torch::manual_seed(9);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{48, 96}, std::vector<int64_t>{96, 40},
                                             std::vector<int64_t>{3, 32, 64}}) {
    const auto G = torch::randn(shape);
    const auto x32 = trainer::newton_schulz_orthogonalize(G, 5);
    const auto x16 = trainer::newton_schulz_orthogonalize(G.to(torch::kBFloat16), 5).to(torch::kFloat);
    const double rel = ((x16 - x32).norm() / x32.norm()).item<double>();
    EXPECT_LT(rel, 0.05) << c10::str(shape);
    const auto sv = torch::linalg_svdvals(x16);
    EXPECT_GT(sv.min().item<double>(), 0.5) << c10::str(shape);
    EXPECT_LT(sv.max().item<double>(), 1.3) << c10::str(shape);
  }
}

// ZeRO-1's sharded AdamW on one rank is AdamW: the same weights after 12 steps with weight decay on
// some tensors and gradient clipping, to fp32 rounding.
TEST(ShardedAdamW, OneRankIsAdamW) {
  torch::manual_seed(11);
  std::vector<std::vector<int64_t>> shapes = {{16, 8}, {33}, {5, 7}};
  std::vector<std::pair<std::string, at::Tensor>> a, b;
  std::vector<bool> decay;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto p = torch::randn(shapes[i]);
    a.emplace_back("p" + std::to_string(i), p.clone().requires_grad_(true));
    b.emplace_back("p" + std::to_string(i), p.clone().requires_grad_(true));
    decay.push_back(i != 1);
  }
  trainer::AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  trainer::AdamW ref(a, decay, o);
  auto comm = trainer::Communicator::single();
  trainer::ShardedAdamW sharded(b, decay, o, *comm);
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    std::vector<torch::Tensor> ga;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto g = torch::randn(shapes[i]) * (step % 3 == 0 ? 10.0 : 0.1);  // some steps clip
      a[i].second.mutable_grad() = g.clone();
      b[i].second.mutable_grad() = g.clone();
      ga.push_back(a[i].second);
    }
    const double norm = torch::nn::utils::clip_grad_norm_(ga, 1.0);
    ref.step(1e-2);
    auto r = sharded.step(1e-2, 1.0, 1.0);
    EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm);
    for (size_t i = 0; i < shapes.size(); ++i)
      worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-6);
}

// Without the host's check (what a GPU run that decides a step late takes, so that nothing is read
// back), the step clips by a factor worked out on the device: the same weights as the checked step,
// to the bit, and the same norm, over 12 steps of which some clip and some do not; and with no
// clip (max_norm inf) too. A non-finite gradient then goes into the update (judged a step later),
// where the checked step leaves the weights alone. On the CPU, and on a GPU where there is one.
TEST(ShardedAdamW, UncheckedStepIsTheCheckedStep) {
  torch::manual_seed(12);
  const std::vector<std::vector<int64_t>> shapes = {{16, 8}, {33}, {5, 7}};
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA);
  for (const auto& device : devices) {
    for (const double max_norm : {1.0, static_cast<double>(INFINITY)}) {
      SCOPED_TRACE(device.str() + (std::isfinite(max_norm) ? ", clipped at 1" : ", no clip"));
      std::vector<std::pair<std::string, at::Tensor>> a, b;
      std::vector<bool> decay;
      for (size_t i = 0; i < shapes.size(); ++i) {
        auto p = torch::randn(shapes[i], device);
        a.emplace_back("p" + std::to_string(i), p.clone().requires_grad_(true));
        b.emplace_back("p" + std::to_string(i), p.clone().requires_grad_(true));
        decay.push_back(i != 1);
      }
      const trainer::AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
      auto comm = trainer::Communicator::single();
      trainer::ShardedAdamW checked(a, decay, o, *comm), unchecked(b, decay, o, *comm);
      int clipped = 0;
      for (int step = 0; step < 12; ++step) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          auto g = torch::randn(shapes[i], device) * (step % 3 == 0 ? 10.0 : 0.1);
          a[i].second.mutable_grad() = g.clone();
          b[i].second.mutable_grad() = g.clone();
        }
        const auto rc = checked.step(1e-2, 2.0, max_norm, true);
        const auto ru = unchecked.step(1e-2, 2.0, max_norm, false);
        ASSERT_FALSE(rc.found_inf || ru.found_inf);
        EXPECT_TRUE(std::isnan(ru.grad_norm)) << "an unchecked step reads nothing back";
        ASSERT_TRUE(ru.grad_norm_tensor.defined() && rc.grad_norm_tensor.defined());
        EXPECT_EQ(ru.grad_norm_tensor.item<double>(), rc.grad_norm) << "step " << step;
        EXPECT_EQ(rc.grad_norm_tensor.item<double>(), rc.grad_norm) << "step " << step;
        if (rc.grad_norm > max_norm) ++clipped;
        for (size_t i = 0; i < shapes.size(); ++i) {
          EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << "step " << step << ", tensor " << i;
        }
      }
      if (std::isfinite(max_norm)) {
        EXPECT_GE(clipped, 3) << "no step clipped";
        EXPECT_LE(clipped, 9) << "every step clipped";
      }
      // An inf gradient: the checked step skips, the unchecked one takes it (NaN weights).
      for (size_t i = 0; i < shapes.size(); ++i) {
        auto g = torch::randn(shapes[i], device);
        if (i == 1) g[3] = INFINITY;
        a[i].second.mutable_grad() = g.clone();
        b[i].second.mutable_grad() = g.clone();
      }
      const auto before = a[1].second.detach().clone();
      const auto rc = checked.step(1e-2, 2.0, max_norm, true);
      const auto ru = unchecked.step(1e-2, 2.0, max_norm, false);
      EXPECT_TRUE(rc.found_inf);
      EXPECT_TRUE(std::isinf(rc.grad_norm_tensor.item<double>()));
      EXPECT_TRUE(torch::equal(a[1].second, before)) << "the checked step updated on an inf gradient";
      EXPECT_FALSE(ru.found_inf);
      EXPECT_FALSE(std::isfinite(ru.grad_norm_tensor.item<double>()));
      EXPECT_FALSE(torch::isfinite(b[1].second).all().item<bool>()) << "the unchecked step skipped on its own";
    }
  }
}

// The clipping norm is accurate where torch's fp32 per-tensor `norm` drifts: a 262k-element skewed
// gradient (an embedding's) to 1e-6 of the fp64 value; clipping scales to max_norm.
TEST(GradClip, AccurateGlobalNormAndClip) {
  torch::manual_seed(5);
  auto big = torch::zeros({512, 512}).requires_grad_(true);
  auto small = torch::zeros({33}).requires_grad_(true);
  auto g = torch::randn({512, 512}) * 1e-3;
  g.view({-1}).narrow(0, 0, 300).mul_(1000);
  big.mutable_grad() = g.clone();
  small.mutable_grad() = torch::randn({33});
  const double exact = std::sqrt(g.to(torch::kFloat64).pow(2).sum().item<double>() +
                                 small.grad().to(torch::kFloat64).pow(2).sum().item<double>());
  const double norm = trainer::clip_grad_norm({big, small}, 1.0);
  EXPECT_NEAR(norm, exact, 1e-6 * exact);
  const double after = trainer::global_grad_norm({big, small});
  EXPECT_NEAR(after, 1.0, 1e-5);
}

// A gradient's sum of squares recorded by its producer (model/grad_square_sums.h) replaces reading
// that gradient, only while collecting and only while the gradient is the one recorded: an ATen op
// on it (version), a new tensor (data pointer), or the collection's end each send the norm back to
// reading it. A recorded value that differs from the gradient's shows which one the norm took.
TEST(GradClip, NormTakesRecordedSquareSumsWhileTheGradientIsUnchanged) {
  const at::Device cpu(torch::kCPU);
  auto a = torch::zeros({10}).requires_grad_(true);
  auto b = torch::zeros({3}).requires_grad_(true);
  a.mutable_grad() = torch::full({10}, 2.0f);  // ‖a.grad‖² = 40
  b.mutable_grad() = torch::full({3}, 1.0f);   // ‖b.grad‖² = 3
  const auto fake = torch::tensor(61.0, torch::kFloat64);  // stands in for 40: the norm becomes 8
  model::record_grad_square_sum(a, fake);
  EXPECT_FALSE(model::recorded_grad_square_sum(a).defined()) << "recorded while not collecting";
  EXPECT_DOUBLE_EQ(trainer::global_grad_norm({a, b}), std::sqrt(43.0));
  {
    model::GradSquareSumsScope scope(cpu, true);
    EXPECT_TRUE(model::grad_square_sums_collecting(cpu));
    model::record_grad_square_sum(a, fake);
    EXPECT_DOUBLE_EQ(trainer::global_grad_norm({a, b}), 8.0);
    EXPECT_DOUBLE_EQ(trainer::global_grad_norm({b}), std::sqrt(3.0));  // only the params asked for
    a.mutable_grad().mul_(1.0f);  // same values, new version
    EXPECT_FALSE(model::recorded_grad_square_sum(a).defined());
    EXPECT_DOUBLE_EQ(trainer::global_grad_norm({a, b}), std::sqrt(43.0));
    model::record_grad_square_sum(a, fake);
    a.mutable_grad() = torch::full({10}, 2.0f);  // another tensor
    EXPECT_DOUBLE_EQ(trainer::global_grad_norm({a, b}), std::sqrt(43.0));
    model::record_grad_square_sum(a, fake);
    EXPECT_DOUBLE_EQ(trainer::clip_grad_norm({a, b}, INFINITY), 8.0);
    EXPECT_THROW(model::record_grad_square_sum(a, torch::tensor(1.0f)), c10::Error);  // not fp64
  }
  EXPECT_FALSE(model::grad_square_sums_collecting(cpu));
  EXPECT_FALSE(model::recorded_grad_square_sum(a).defined()) << "kept after the scope";
  {
    model::GradSquareSumsScope off(cpu, false);
    EXPECT_FALSE(model::grad_square_sums_collecting(cpu));
  }
}

// Clipping folded into AdamW: grad_norm_and_clip_divisor_async measures the same norm as
// clip_grad_norm_async and leaves the gradients alone; AdamW dividing by the divisor as it reads
// them lands where clipping first and updating after does — bit for bit when no clipping is needed
// (the divisor is exactly 1), to fp32 rounding (1e-6) when it is.
TEST(GradClip, DivisorInTheUpdateMatchesClippingFirst) {
  for (const double max_norm : {1e9, 0.5}) {
    torch::manual_seed(6);
    std::vector<std::pair<std::string, at::Tensor>> a, b;
    std::vector<at::Tensor> grads;
    for (const auto& shape : std::vector<std::vector<int64_t>>{{40, 24}, {17}}) {
      auto p = torch::randn(shape);
      grads.push_back(torch::randn(shape));
      a.emplace_back("p" + std::to_string(a.size()), p.clone().requires_grad_(true));
      b.emplace_back("p" + std::to_string(b.size()), p.clone().requires_grad_(true));
    }
    trainer::AdamW clip_first(a, {true, false}, {0.9, 0.95, 1e-8, 0.1}), divide(b, {true, false}, {0.9, 0.95, 1e-8, 0.1});
    for (int step = 0; step < 3; ++step) {
      std::vector<at::Tensor> pa, pb;
      for (size_t i = 0; i < grads.size(); ++i) {
        a[i].second.mutable_grad() = grads[i] * (step + 1);
        b[i].second.mutable_grad() = grads[i] * (step + 1);
        pa.push_back(a[i].second);
        pb.push_back(b[i].second);
      }
      const double norm_a = trainer::clip_grad_norm(pa, max_norm);
      auto [norm_b, divisor] = trainer::grad_norm_and_clip_divisor_async(pb, max_norm);
      EXPECT_EQ(norm_a, norm_b.item<double>());
      ASSERT_TRUE(divisor.defined());
      if (max_norm > 1e8) EXPECT_EQ(divisor.item<float>(), 1.0f);
      else EXPECT_NEAR(divisor.item<double>(), norm_a / max_norm, 1e-5 * norm_a / max_norm);
      EXPECT_TRUE(torch::equal(b[0].second.grad(), grads[0] * (step + 1))) << "the gradients stay as they are";
      clip_first.step(1e-2);
      divide.step(1e-2, divisor);
      for (size_t i = 0; i < grads.size(); ++i) {
        const double diff = (a[i].second - b[i].second).abs().max().item<double>();
        if (max_norm > 1e8) EXPECT_EQ(diff, 0.0) << "step " << step;
        else EXPECT_LT(diff, 1e-6) << "step " << step;
      }
    }
  }
  auto p = torch::zeros({3}).requires_grad_(true);
  p.mutable_grad() = torch::ones({3});
  EXPECT_FALSE(trainer::grad_norm_and_clip_divisor_async({p}, INFINITY).second.defined());
}

// fp8 amax records in multi-rank checkpoints (trainer/fp8_checkpoint.h), on two CPU ranks (Gloo,
// threads): rank 0 receives every rank's records (its own as fp8_amax.<module>, rank 1's as
// fp8_amax_rank1.<module>, rank 1's values), rank 1 none; each rank resumes from its own, rank 0's
// where the state holds none for it; a malformed rank entry is refused naming it.
TEST(Fp8Checkpoint, EveryRanksRecordsAndEachResumesFromItsOwn) {
  auto rendezvous = trainer::Rendezvous::in_process();
  std::vector<trainer::NamedTensors> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto comm = trainer::Communicator::join(rendezvous, r, 2, c10::Device(c10::kCPU), std::chrono::seconds(30));
        // Two layers' [3, 18] records whose values say which rank and layer they are.
        std::vector<std::pair<std::string, at::Tensor>> records = {
            {"blocks.0.attn.wq", torch::full({3, 18}, 10.0 * (r + 1) + 1)},
            {"blocks.0.ffn.down", torch::full({3, 18}, 10.0 * (r + 1) + 2)}};
        got[r] = trainer::fp8_record_state(records, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_TRUE(got[1].empty());
  std::map<std::string, float> value;
  for (const auto& [name, t] : got[0]) value[name] = t[2][17].item<float>();
  const std::map<std::string, float> want = {{"fp8_amax.blocks.0.attn.wq", 11.f},
                                             {"fp8_amax.blocks.0.ffn.down", 12.f},
                                             {"fp8_amax_rank1.blocks.0.attn.wq", 21.f},
                                             {"fp8_amax_rank1.blocks.0.ffn.down", 22.f}};
  EXPECT_EQ(value, want);
  for (const auto& [name, t] : got[0]) EXPECT_TRUE(trainer::is_fp8_record_state(name)) << name;
  EXPECT_FALSE(trainer::is_fp8_record_state("exp_avg.blocks.0.attn.wq.weight"));

  for (int rank : {0, 1, 2}) {
    auto entries = trainer::fp8_records_for_rank(got[0], rank, "ckpt/state.safetensors");
    ASSERT_EQ(entries.size(), 2u) << "rank " << rank;
    for (const auto& e : entries) {
      // Rank 2 (not in this checkpoint) falls back on rank 0's.
      const float own = (rank == 1 ? 20.f : 10.f) + (e.module == "blocks.0.attn.wq" ? 1.f : 2.f);
      EXPECT_EQ(e.records[0][0].item<float>(), own) << "rank " << rank << " " << e.module << " from " << e.state_name;
    }
  }
  auto bad = got[0];
  bad.emplace_back("fp8_amax_rankX.blocks.0.attn.wq", torch::zeros({3, 18}));
  try {
    trainer::fp8_records_for_rank(bad, 0, "ckpt/state.safetensors");
    ADD_FAILURE() << "a malformed entry was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_amax_rankX.blocks.0.attn.wq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ckpt/state.safetensors"), std::string::npos) << e.what();
  }
}

// bench train --profile's components: kernel names as the profiler reported them in hybrid, GPT
// and MoE steps on an H200 (shortened where the template arguments run on), each counted under
// the part of the step it belongs to, ours ahead of the rules for the libraries' names.
TEST(StepProfile, ComponentsNameTheLayerPartsAndLibraries) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"},
      {"void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float>(cublasLt::cublasSplitKParams<float>)",
       "matmul"},
      {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0",
       "attention"},
      {"void cudnn::fusion::compute_dot_do_o_ragged_specialized<true, 64>(void const*, void const*)", "attention"},
      {"void kernels::(anonymous namespace)::gdr_chunk_front_kernel<__nv_bfloat16, __nv_bfloat16, 4, 96, 192>("
       "kernels::GdrChunkList, kernels::GdrChunkFrontArgs)",
       "Gated DeltaNet: delta rule"},
      {"void kernels::(anonymous namespace)::state_grads_kernel<kernels::(anonymous namespace)::Bf16Products, 3, true, "
       "192, true, true>(kernels::GdrChunkStateGradsArgs, int)",
       "Gated DeltaNet: delta rule"},
      {"void kernels::(anonymous namespace)::short_conv_backward_kernel<__nv_bfloat16, 4>(__nv_bfloat16*, float*)",
       "Gated DeltaNet: short conv, gates"},
      {"void kernels::(anonymous namespace)::gates_backward_kernel<__nv_bfloat16>(__nv_bfloat16*, float*)",
       "Gated DeltaNet: short conv, gates"},
      {"void kernels::(anonymous namespace)::gated_rmsnorm_backward_groups_kernel<__nv_bfloat16, 3>(__nv_bfloat16*)",
       "norms (RMSNorm, gated, L2)"},
      {"void kernels::(anonymous namespace)::add_norm_backward_kernel<float, __nv_bfloat16, __nv_bfloat16, 4, 4>(float*)",
       "norms (RMSNorm, gated, L2)"},
      {"void kernels::(anonymous namespace)::rope_rmsnorm_qkv_backward_kernel<__nv_bfloat16, 4, 8>("
       "kernels::RopeNormQkvGrads, long const*, double const*, double const*)",
       "RoPE (with QK-norm)"},
      {"void kernels::(anonymous namespace)::swiglu_backward_kernel<__nv_bfloat16, 8>(__nv_bfloat16*)", "SwiGLU"},
      {"void kernels::(anonymous namespace)::moe_fan_in_kernel<__nv_bfloat16>(__nv_bfloat16*)",
       "MoE routing and combine"},
      {"void kernels::(anonymous namespace)::scatter_block_grads_kernel(float*, double*)", "MoE routing and combine"},
      {"void kernels::(anonymous namespace)::quantize_kernel<__nv_bfloat16, 8>(__nv_fp8_e4m3*, float const*)",
       "FP8 quantisation"},
      {"void kernels::(anonymous namespace)::ce_grad_smem_kernel<__nv_bfloat16>(__nv_bfloat16*, long, float*)",
       "cross-entropy kernel"},
      {"void kernels::(anonymous namespace)::adamw_kernel<kernels::(anonymous namespace)::AdamWLaunch>("
       "kernels::(anonymous namespace)::AdamWLaunch, float const*)",
       "optimizer"},
      {"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
       "TensorListMetadata<1>, at::native::LpNormFunctor<float, (at::native::NormType)1, float, float>, float>",
       "gradient norm (clipping)"},
      {"kernels::(anonymous namespace)::column_sum_kernel(float*, float const*, long, long, float)",
       "reductions (sums)"},
      {"void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<"
       "c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>>>>",
       "reductions (sums)"},
      {"void kernels::(anonymous namespace)::embedding_backward_add_kernel<4>(float*, float const*, long const*)",
       "copies, casts, indexing"},
      {"void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
       "cuda(at::TensorIteratorBase&)>>",
       "copies, casts, indexing"},
      {"Memset (Device)", "memset / memcpy"},
      {"Memcpy HtoD (Pinned -> Device)", "memset / memcpy"},
      {"void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >",
       "elementwise (ATen)"},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication (NCCL)"},
      {"void kernels::(anonymous namespace)::wgmma_check_kernel(float*)", "other"},
  };
  for (const auto& [name, component] : cases) EXPECT_EQ(trainer::profile_component_of(name), component) << name;
}

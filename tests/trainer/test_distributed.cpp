// Data parallelism with ranks as threads of one process, over c10d's Gloo backend on the CPU:
// W ranks each stepping on their own batch must end with the weights of one model stepping on the
// concatenation of those batches (the gradient of the mean over all tokens is the mean of the
// ranks' gradients), to 1e-6 relative (Frobenius, per tensor) in fp32; with gradient accumulation too.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <torch/torch.h>

#include "model/decoder_lm.h"
#include "tests/trainer/train_harness.h"
#include "trainer/adamw.h"
#include "trainer/data/loader.h"
#include "trainer/grad_clip.h"
#include "trainer/lr_schedule.h"
#include "trainer/param_groups.h"

using namespace train_harness;

namespace {

// The ranks' batches of one micro-step, as one batch: rows stacked, document boundaries shifted.
trainer::data::Batch concatenate(std::vector<trainer::data::Batch>& parts) {
  trainer::data::Batch all;
  std::vector<torch::Tensor> inputs, labels, cu;
  int64_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    inputs.push_back(parts[i].inputs);
    labels.push_back(parts[i].labels);
    auto c = parts[i].cu_seqlens.to(torch::kInt64) + offset;
    cu.push_back(i == 0 ? c : c.slice(0, 1));
    offset += parts[i].inputs.numel();
  }
  all.inputs = torch::cat(inputs);
  all.labels = torch::cat(labels);
  all.cu_seqlens = torch::cat(cu).to(torch::kInt32);
  return all;
}

// One model, one AdamW, the loop's clipping and schedule, stepping on the W ranks' batches at once.
std::map<std::string, torch::Tensor> reference_weights(const trainer::RunConfig& cfg, int world,
                                                        std::vector<double>* losses) {
  torch::manual_seed(cfg.seed);
  model::DecoderLM m(cfg.model);
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<bool> decay;
  for (const auto& item : m->named_parameters()) {
    params.emplace_back(item.key(), item.value());
    decay.push_back(trainer::gets_weight_decay(item.key(), item.value().dim()));
  }
  trainer::AdamW opt(params, decay, {cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay});
  std::vector<std::unique_ptr<trainer::data::Loader>> loaders;
  for (int r = 0; r < world; ++r) loaders.push_back(std::make_unique<trainer::data::Loader>(cfg, r, world, ""));
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    double loss = 0;
    for (int64_t micro = 0; micro < cfg.train.grad_accum; ++micro) {
      std::vector<trainer::data::Batch> parts;
      for (auto& l : loaders) parts.push_back(l->next(nullptr));
      auto b = concatenate(parts);
      auto out = m->loss_parts(b.inputs, b.labels, b.cu_seqlens);
      (out.total / static_cast<double>(cfg.train.grad_accum)).backward();
      loss += out.ce.item<double>() / static_cast<double>(cfg.train.grad_accum);
    }
    std::vector<torch::Tensor> ps;
    for (auto& [n, p] : params) ps.push_back(p);
    if (cfg.train.grad_clip > 0) trainer::clip_grad_norm(ps, cfg.train.grad_clip);
    opt.step(trainer::lr_at(cfg.train, step));
    m->zero_grad();
    losses->push_back(loss);
  }
  std::map<std::string, torch::Tensor> out;
  for (auto& [n, p] : params) out[n] = p.detach().clone();
  return out;
}

void expect_matches_reference(int world, std::vector<std::string> extra, double tolerance = 1e-6) {
  TempDir dir;
  extra.push_back("run.devices=\"cpu:" + std::to_string(world) + "\"");
  // A moderate learning rate: Adam turns fp32 summation-order noise (ranks sum in another order
  // than one big batch) into weight differences that grow with the step size; the collectives'
  // correctness does not depend on it.
  extra.push_back("train.lr=1e-3");
  auto cfg = make_config(dir, 12, extra);
  auto r = run(cfg, dir.path() + "/ddp");
  ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
  ASSERT_EQ(r.checkpoints.size(), 1u);
  // Every logged step carries every rank's step time and data wait (the per-rank view), no more.
  for (int k = 0; k <= world; ++k) {
    for (const char* what : {".step_time_ms", ".data_wait_ms"}) {
      const auto it = r.metrics.find("rank" + std::to_string(k) + what);
      if (k == world) {
        EXPECT_TRUE(it == r.metrics.end()) << "rank" << k << what;
        continue;
      }
      ASSERT_TRUE(it != r.metrics.end()) << "rank" << k << what;
      EXPECT_EQ(it->second.size(), r.metrics.at("loss").size()) << "rank" << k << what;
      for (double v : it->second) EXPECT_GE(v, 0.0) << "rank" << k << what;
    }
  }
  auto ck = trainer::load_checkpoint(r.checkpoints[0]);
  EXPECT_EQ(ck.meta.at("world_size"), std::to_string(world));
  for (int k = 0; k < world; ++k) EXPECT_EQ(ck.meta.count("loader.state." + std::to_string(k)), 1u) << k;

  std::vector<double> ref_losses;
  auto cfg_ref = cfg;
  cfg_ref.run.devices = "cpu";
  auto ref = reference_weights(cfg_ref, world, &ref_losses);
  // Relative error per tensor, ‖w − w_ref‖ / ‖w_ref‖ (Frobenius); the largest element-wise gap
  // relative to the tensor's largest entry is printed beside it.
  double worst = 0, worst_max = 0;
  for (const auto& [name, w] : ck.weights) {
    const auto& want = ref.at(name);
    const double rel = ((w - want).norm() / want.norm()).item<double>();
    worst = std::max(worst, rel);
    worst_max = std::max(worst_max, (w - want).abs().max().item<double>() / want.abs().max().item<double>());
    EXPECT_LE(rel, tolerance) << name;
  }
  ASSERT_EQ(r.losses.size(), ref_losses.size());
  for (size_t i = 0; i < ref_losses.size(); ++i) EXPECT_NEAR(r.losses[i], ref_losses[i], 1e-5) << "step " << i + 1;
  std::printf("%d ranks (Gloo) vs 1 rank on the concatenated batch: worst relative weight error %.3g "
              "(max-element %.3g)\n", world, worst, worst_max);
}

}  // namespace

TEST(Distributed, TwoRanksMatchOneRankOnTheConcatenatedBatch) { expect_matches_reference(2, {}); }

TEST(Distributed, FourRanksMatchOneRankOnTheConcatenatedBatch) { expect_matches_reference(4, {}); }

TEST(Distributed, GradientAccumulationAcrossRanks) { expect_matches_reference(2, {"train.grad_accum=2"}); }

// ZeRO-1: the same weights with AdamW's state sharded; the checkpoint holds the whole state.
TEST(Distributed, Zero1MatchesOneRank) {
  expect_matches_reference(2, {"run.zero1=true", "train.grad_clip=0"});
  expect_matches_reference(4, {"run.zero1=true", "train.grad_accum=2"});
}

// Resuming needs the same number of ranks: each rank's data position is its own.
TEST(Distributed, ResumeWithAnotherWorldSizeIsRefused) {
  TempDir dir;
  auto cfg = make_config(dir, 4, {"run.devices=\"cpu:2\"", "train.warmup_steps=1"});
  auto r = run(cfg, dir.path() + "/two");
  ASSERT_EQ(r.checkpoints.size(), 1u);
  auto one = cfg;
  one.run.devices = "cpu";
  one.train.steps = 6;
  auto again = run(one, dir.path() + "/one", r.checkpoints[0]);
  EXPECT_EQ(again.ended.status, trainer::RunStatus::Failed);
  // Refused from the manifest, before any tensor is read (tests/faults covers the other fields).
  EXPECT_NE(again.ended.message.find("world_size: the checkpoint has 2, this run has 1"), std::string::npos)
      << again.ended.message;
}

namespace {

// Arms a fault (trainer/fault_inject.h) for the lifetime of the guard.
struct FaultArmed {
  explicit FaultArmed(const char* spec) { setenv("DELTADECK_FAULT", spec, 1); }
  ~FaultArmed() { unsetenv("DELTADECK_FAULT"); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// A rank that throws mid-run: the others stop at once (not after the collective timeout), the run
// fails with that rank's error, and the checkpoint written before it loads.
TEST(Distributed, ARankThrowingStopsTheOthersAndKeepsTheCheckpoint) {
  TempDir dir;
  auto cfg = make_config(dir, 50, {"run.devices=\"cpu:2\"", "run.save_interval=5", "run.collective_timeout_s=120"});
  FaultArmed fault("throw@step,rank=1,step=7");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run(cfg, dir.path() + "/run");
  const double took = seconds_since(t0);
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_NE(r.ended.message.find("injected fault at step (rank 1, step 7)"), std::string::npos) << r.ended.message;
  EXPECT_LT(took, 60.0) << "the healthy rank waited for the collective timeout";
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_EQ(trainer::load_checkpoint(r.checkpoints[0]).step, 5);
}

// A rank that hangs outside any collective: the others fail at the collective timeout naming the
// operation, the hung rank is abandoned, and the run ends as failed instead of hanging.
TEST(Distributed, AHungRankFailsTheRunAtTheCollectiveTimeout) {
  TempDir dir;
  auto cfg = make_config(dir, 50, {"run.devices=\"cpu:2\"", "run.save_interval=2", "run.collective_timeout_s=2"});
  FaultArmed fault("hang@step,rank=1,step=3");
  auto r = run(cfg, dir.path() + "/run");
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_NE(r.ended.message.find("rank 0 of 2"), std::string::npos) << r.ended.message;
  EXPECT_NE(r.ended.message.find("averaging gradients"), std::string::npos) << r.ended.message;
  EXPECT_NE(r.ended.message.find("run.collective_timeout_s = 2 s"), std::string::npos) << r.ended.message;
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_EQ(trainer::load_checkpoint(r.checkpoints[0]).step, 2);
}

// Commands reach every rank at the same step boundary (agreed through the store): save-now during
// a pause writes one checkpoint holding both ranks' data positions, resume continues, stop ends the
// run with a final checkpoint.
TEST(Distributed, PauseSaveNowAndStopReachEveryRank) {
  TempDir dir;
  auto cfg = make_config(dir, 1000, {"run.devices=\"cpu:2\"", "train.warmup_steps=1"});
  trainer::Session s(cfg, trainer::SessionOptions(dir.path() + "/run"));
  s.start();
  std::vector<trainer::CheckpointEvent> checkpoints;
  trainer::EndedEvent ended;
  bool commanded = false, stop_sent = false;
  while (auto ev = s.events().pop()) {
    if (auto* m = std::get_if<trainer::MetricsEvent>(&*ev)) {
      if (m->step >= 3 && !commanded) {
        s.send(trainer::Command::Pause);
        s.send(trainer::Command::SaveNow);
        s.send(trainer::Command::Resume);
        commanded = true;
      }
      // Stop once training went on past the save-now checkpoint (a stop at that very boundary would
      // rightly reuse it).
      if (checkpoints.size() == 1 && m->step > checkpoints[0].step + 1 && !stop_sent) {
        s.send(trainer::Command::Stop);
        stop_sent = true;
      }
    } else if (auto* c = std::get_if<trainer::CheckpointEvent>(&*ev)) {
      checkpoints.push_back(*c);
    } else if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) {
      ended = *e;
    }
  }
  s.join();
  EXPECT_EQ(ended.status, trainer::RunStatus::Stopped) << ended.message;
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_LT(checkpoints[0].step, checkpoints[1].step);
  EXPECT_EQ(ended.step, checkpoints[1].step);
  for (const auto& c : checkpoints) {
    auto ck = trainer::load_checkpoint(c.path);
    EXPECT_EQ(ck.step, c.step);
    EXPECT_TRUE(ck.meta.count("loader.state.0") && ck.meta.count("loader.state.1")) << c.path;
  }
}

// Which runs capture their step as a CUDA graph (trainer/step_graph_policy.h): every condition that
// keeps a step from being replayed names itself, and a run that has none of them is allowed. The
// capture itself runs on the GPU machine (tests/trainer/test_trainer_cuda.cpp).
#include <gtest/gtest.h>

#include <string>

#include "trainer/config.h"
#include "trainer/step_graph_policy.h"

namespace {

using trainer::RunConfig;
using trainer::StepGraphFacts;
using trainer::step_graph_blocker;

// A run that may be captured: one GPU, fixed-shape batches, bf16, AdamW, no MoE (a GPT: pattern S).
RunConfig graphable() {
  auto r = trainer::parse_config("[data]\ntrain = [\"text:/tmp/*.txt\"]\n", "test.toml",
                                 {"data.document_attention=false", "train.precision=\"bf16\""});
  EXPECT_TRUE(r.ok()) << (r.errors.empty() ? "" : r.errors[0]);
  return r.config;
}

StepGraphFacts one_gpu() {
  StepGraphFacts f;
  f.cuda = true;
  return f;
}

bool mentions(const std::string& why, const std::string& what) { return why.find(what) != std::string::npos; }

}  // namespace

TEST(StepGraphPolicy, AllowsAOneGpuFixedShapeRun) {
  EXPECT_EQ(step_graph_blocker(graphable(), one_gpu()), "");
  auto cfg = graphable();
  cfg.train.cuda_graph = "on";
  cfg.train.grad_accum = 4;
  cfg.train.ema_decay = 0.999;
  cfg.train.mup_base_width = 256;  // a second AdamW group takes its lr from the device too
  EXPECT_EQ(step_graph_blocker(cfg, one_gpu()), "");
  cfg.train.optimizer = "muon";  // so does Muon (trainer/muon.h, begin_step and update)
  EXPECT_EQ(step_graph_blocker(cfg, one_gpu()), "");
}

TEST(StepGraphPolicy, NamesWhatKeepsTheStepEager) {
  {
    auto cfg = graphable();
    cfg.train.cuda_graph = "off";
    EXPECT_TRUE(mentions(step_graph_blocker(cfg, one_gpu()), "train.cuda_graph"));
  }
  EXPECT_TRUE(mentions(step_graph_blocker(graphable(), StepGraphFacts{}), "CPU"));
  {
    auto f = one_gpu();
    f.world = 2;
    EXPECT_TRUE(mentions(step_graph_blocker(graphable(), f), "2 ranks"));
  }
  {
    auto f = one_gpu();
    f.loss_scaling = true;
    auto cfg = graphable();
    cfg.train.precision = "fp16";
    const auto why = step_graph_blocker(cfg, f);
    EXPECT_TRUE(mentions(why, "loss scaling") && mentions(why, "fp16")) << why;
  }
  {
    auto f = one_gpu();
    f.decide_in_step = true;
    EXPECT_TRUE(mentions(step_graph_blocker(graphable(), f), "train.nonfinite"));
  }
  {
    auto cfg = graphable();
    cfg.train.phases = {"0:256x32", "50e6:1024x8"};
    EXPECT_TRUE(mentions(step_graph_blocker(cfg, one_gpu()), "train.phases"));
  }
  {
    // Packed batches are padded to a fixed shape for attention and the delta rule's chunk plan
    // (model/gdr_plan_slots.h), with or without Gated DeltaNet layers.
    auto cfg = graphable();
    cfg.data.document_attention = true;
    EXPECT_EQ(step_graph_blocker(cfg, one_gpu()), "");
    cfg.model.pattern = "GGA";
    EXPECT_EQ(step_graph_blocker(cfg, one_gpu()), "");
    // ...unless their state scan runs as ATen steps sized on the host (a shape its kernel refuses).
    auto facts = one_gpu();
    facts.gdn_scan_kernel = false;
    const auto why = step_graph_blocker(cfg, facts);
    EXPECT_TRUE(mentions(why, "data.document_attention") && mentions(why, "model.gdn_chunk")) << why;
    cfg.data.document_attention = false;
    EXPECT_EQ(step_graph_blocker(cfg, facts), "");
  }
  {
    auto cfg = graphable();
    cfg.model.moe_experts = 8;
    EXPECT_TRUE(mentions(step_graph_blocker(cfg, one_gpu()), "model.moe_experts"));
    // With device offsets for the grouped GEMMs nothing is read on the host: MoE may be captured.
    auto f = one_gpu();
    f.moe_counts_on_device = true;
    EXPECT_EQ(step_graph_blocker(cfg, f), "");
  }
  {
    auto f = one_gpu();
    f.faults_armed = true;
    EXPECT_TRUE(mentions(step_graph_blocker(graphable(), f), "DELTADECK_FAULT"));
  }
}

TEST(StepGraphPolicy, ConfigKeyTakesAutoOnOff) {
  const char* base = "[data]\ntrain = [\"text:/tmp/*.txt\"]\n";
  EXPECT_EQ(trainer::parse_config(base, "t.toml", {}).config.train.cuda_graph, "auto");
  for (const char* v : {"auto", "on", "off"}) {
    auto r = trainer::parse_config(base, "t.toml", {std::string("train.cuda_graph=\"") + v + "\""});
    EXPECT_TRUE(r.ok()) << v;
    EXPECT_EQ(r.config.train.cuda_graph, v);
  }
  auto room = trainer::parse_config(base, "t.toml", {"train.batch_size=8", "train.cuda_graph_pieces=24"});
  EXPECT_TRUE(room.ok());
  EXPECT_EQ(room.config.train.cuda_graph_pieces, 24);
  auto small = trainer::parse_config(base, "t.toml", {"train.batch_size=8", "train.cuda_graph_pieces=4"});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.errors[0].rfind("train.cuda_graph_pieces:", 0), 0u) << small.errors[0];
  auto bad = trainer::parse_config(base, "t.toml", {"train.cuda_graph=\"always\""});
  ASSERT_FALSE(bad.ok());
  bool named = false;
  for (const auto& e : bad.errors) named = named || e.rfind("train.cuda_graph:", 0) == 0;
  EXPECT_TRUE(named) << (bad.errors.empty() ? "" : bad.errors[0]);
}

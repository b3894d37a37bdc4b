// The engine's options end to end on the CPU: device and precision checks, bf16 autocast training,
// MFU reporting, μP learning-rate multipliers, keeping the best checkpoint, and export.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <nlohmann/json.hpp>

#include "model/decoder_lm.h"
#include "storage/file_util.h"
#include "storage/safetensors.h"
#include "tests/trainer/train_harness.h"
#include "trainer/export.h"
#include "trainer/telemetry.h"

using namespace train_harness;

namespace {

// resolve_config's errors for a config with these overrides (no data problems: the corpus exists).
std::vector<std::string> resolve_errors(const TempDir& dir, const std::vector<std::string>& extra) {
  dir.write("corpus/alpha.txt", alphabet_corpus(20, 5));
  std::vector<std::string> o = {"data.train=[\"text:" + dir.path() + "/corpus/*.txt\"]"};
  o.insert(o.end(), extra.begin(), extra.end());
  auto parsed = trainer::parse_config("", "<test>", o);
  EXPECT_TRUE(parsed.ok()) << (parsed.errors.empty() ? "" : parsed.errors[0]);
  auto cfg = parsed.config;
  return trainer::resolve_config(cfg);
}

bool mentions(const std::vector<std::string>& errors, const std::string& what) {
  for (const auto& e : errors)
    if (e.find(what) != std::string::npos) return true;
  return false;
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

// train.precision "auto" (the default) becomes the precision it trains in once resolved, so the run
// records it: fp32 on CPU ranks (auto devices on a machine without a GPU, one CPU rank or several);
// a precision given is kept. (On a GPU: test_trainer_cuda, PrecisionAutoIsBf16OnTheGpu.)
TEST(TrainOptions, PrecisionAutoIsFp32OnTheCpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "checks the CPU-only answers";
  TempDir dir;
  dir.write("corpus/alpha.txt", alphabet_corpus(20, 5));
  auto resolved = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> o = {"data.train=[\"text:" + dir.path() + "/corpus/*.txt\"]"};
    o.insert(o.end(), extra.begin(), extra.end());
    auto parsed = trainer::parse_config("", "<test>", o);
    EXPECT_TRUE(parsed.ok()) << (parsed.errors.empty() ? "" : parsed.errors[0]);
    auto cfg = parsed.config;
    const auto errors = trainer::resolve_config(cfg);
    EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors[0]);
    return cfg.train.precision;
  };
  EXPECT_EQ(trainer::RunConfig{}.train.precision, "auto");
  EXPECT_EQ(resolved({}), "fp32");
  EXPECT_EQ(resolved({"run.devices=\"cpu:2\""}), "fp32");
  EXPECT_EQ(resolved({"train.precision=\"auto\"", "run.devices=\"cpu\""}), "fp32");
  EXPECT_EQ(resolved({"train.precision=\"bf16\""}), "bf16");
}

TEST(TrainOptions, DeviceAndPrecisionProblemsNameTheKey) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "checks the CPU-only answers";
  TempDir dir;
  EXPECT_TRUE(resolve_errors(dir, {"train.precision=\"bf16\""}).empty());
  auto e = resolve_errors(dir, {"train.precision=\"fp16\""});
  EXPECT_TRUE(mentions(e, "train.precision: \"fp16\" needs a CUDA GPU")) << (e.empty() ? "" : e[0]);
  e = resolve_errors(dir, {"train.precision=\"fp8\""});
  EXPECT_TRUE(mentions(e, "train.precision: \"fp8\"")) << (e.empty() ? "" : e[0]);
  e = resolve_errors(dir, {"run.devices=\"3\""});
  EXPECT_TRUE(mentions(e, "run.devices: GPU 3 does not exist (CUDA finds 0 GPUs)")) << (e.empty() ? "" : e[0]);
  e = resolve_errors(dir, {"run.devices=\"all\""});
  EXPECT_TRUE(mentions(e, "run.devices: \"all\"")) << (e.empty() ? "" : e[0]);
  EXPECT_TRUE(resolve_errors(dir, {"run.devices=\"cpu:4\""}).empty());  // four CPU ranks
  e = resolve_errors(dir, {"run.devices=\"0,1\""});
  EXPECT_TRUE(mentions(e, "run.devices: GPU 0 does not exist")) << (e.empty() ? "" : e[0]);
  // Spaces around the commas pass the validation, so every GPU listed must be checked and taken,
  // not only those before the first space (such a list once ran silently on its first GPU).
  e = resolve_errors(dir, {"run.devices=\"0, 98 ,99\""});
  EXPECT_TRUE(mentions(e, "run.devices: GPU 98 does not exist")) << (e.empty() ? "" : e[0]);
  EXPECT_TRUE(mentions(e, "run.devices: GPU 99 does not exist")) << (e.empty() ? "" : e[0]);
}

// bf16 autocast on the CPU trains (the GDN core and router stay fp32 inside it); without a known
// peak there is no MFU, with run.peak_tflops there is; no device memory counters on the CPU.
TEST(TrainOptions, Bf16AutocastTrainsOnTheCpu) {
  TempDir dir;
  auto cfg = make_config(dir, 60, {"train.precision=\"bf16\""});
  auto r = run(cfg, dir.path() + "/bf16");
  ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
  ASSERT_EQ(r.losses.size(), 60u);
  EXPECT_GT(r.losses.front(), 5.0);
  EXPECT_LT(r.losses.back(), r.losses.front() - 2.0) << "bf16 run did not learn";
  EXPECT_EQ(r.metrics.count("mfu"), 0u);
  EXPECT_EQ(r.metrics.count("mem_peak_gib"), 0u);

  auto cfg2 = make_config(dir, 3, {"run.peak_tflops=0.001", "train.warmup_steps=1"});
  auto r2 = run(cfg2, dir.path() + "/mfu");
  ASSERT_EQ(r2.metrics["mfu"].size(), 3u);
  EXPECT_GT(r2.metrics["mfu"].back(), 0.0);
}

// μP: with mup_base_width = d/2 the hidden matrices train at lr/2. AdamW's first update is
// lr · g/(|g| + eps) per element, so its largest magnitude is lr (to 1e-3) for the embedding and
// lr/2 for a hidden matrix.
TEST(TrainOptions, MupHalvesTheHiddenMatricesFirstUpdate) {
  TempDir dir;
  const double lr = 1e-2;
  auto cfg = make_config(dir, 1, {"train.mup_base_width=32", "train.warmup_steps=0", "train.weight_decay=0",
                                  "train.lr=1e-2", "train.grad_clip=0"});
  ASSERT_EQ(cfg.model.d, 64);
  auto r = run(cfg, dir.path() + "/mup");
  ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
  auto after = trainer::load_checkpoint(r.checkpoints.back());
  torch::manual_seed(cfg.seed);
  model::DecoderLM initial(cfg.model);
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : initial->named_parameters()) before[item.key()] = item.value().detach();
  int hidden = 0, other = 0;
  for (const auto& [name, w] : after.weights) {
    const double step = max_abs(w - before.at(name));
    const bool is_hidden = w.dim() == 2 && name.rfind("blocks.", 0) == 0;
    if (is_hidden) {
      EXPECT_NEAR(step, lr / 2, lr * 1e-3) << name;
      ++hidden;
    } else if (name.rfind("emb.", 0) == 0) {
      EXPECT_NEAR(step, lr, lr * 1e-3) << name;
      ++other;
    }
  }
  EXPECT_GT(hidden, 4);
  EXPECT_EQ(other, 1);
}

// Checkpoints every 5 steps, keep 1: the newest and the one with the lowest validation loss stay,
// and the state names that best step.
TEST(TrainOptions, KeepsTheBestCheckpointByValidationLoss) {
  TempDir dir;
  auto cfg = make_config(dir, 20, {"run.eval_interval=5", "run.save_interval=5", "run.keep_checkpoints=1"});
  auto r = run(cfg, dir.path() + "/best");
  ASSERT_EQ(r.ended.status, trainer::RunStatus::Finished) << r.ended.message;
  const auto& val = r.metrics["val_loss"];
  ASSERT_EQ(val.size(), 4u);
  const int64_t best_step = 5 * (1 + (std::min_element(val.begin(), val.end()) - val.begin()));
  auto left = trainer::list_checkpoints(dir.path() + "/best/checkpoints");
  std::set<int64_t> steps;
  for (const auto& [step, path] : left) steps.insert(step);
  EXPECT_EQ(steps, (std::set<int64_t>{best_step, 20}));
  auto last = trainer::load_checkpoint(left.back().second);
  EXPECT_EQ(last.meta.at("best.step"), std::to_string(best_step));
}

// Export writes safetensors an independent reader accepts with the checkpoint's exact tensors, and
// a config.json with the model's shape; --ema exports the EMA weights, and fails without them.
TEST(TrainOptions, ExportWritesWeightsAndConfig) {
  TempDir dir;
  auto cfg = make_config(dir, 6, {"train.ema_decay=0.5", "train.warmup_steps=1"});
  auto r = run(cfg, dir.path() + "/run");
  ASSERT_EQ(r.checkpoints.size(), 1u);
  auto ck = trainer::load_checkpoint(r.checkpoints[0]);
  std::map<std::string, torch::Tensor> state(ck.state.begin(), ck.state.end());

  for (bool ema : {false, true}) {
    const std::string out = dir.path() + (ema ? "/export_ema" : "/export");
    auto res = trainer::export_checkpoint(r.checkpoints[0], out, ema);
    EXPECT_EQ(res.step, 6);
    auto f = storage::SafetensorsFile::read(out + "/model.safetensors");
    ASSERT_EQ(f.entries().size(), ck.weights.size());
    for (const auto& [name, w] : ck.weights) {
      const auto& e = f.entries().at(name);
      EXPECT_EQ(e.dtype, "F32") << name;
      EXPECT_EQ(e.shape, w.sizes().vec()) << name;
      auto got = torch::from_blob(const_cast<uint8_t*>(f.data(name)), e.shape, torch::kFloat32).clone();
      const auto& want = ema ? state.at("ema." + name) : w;
      EXPECT_TRUE(torch::equal(got, want)) << name;
    }
    std::ifstream cf(out + "/config.json");
    auto j = nlohmann::json::parse(cf);
    EXPECT_EQ(j.at("model").at("d").get<int64_t>(), 64);
    EXPECT_EQ(j.at("step").get<int64_t>(), 6);
    EXPECT_EQ(j.at("weights").get<std::string>(), ema ? "ema" : "live");
  }
  auto cfg_plain = make_config(dir, 2, {"train.warmup_steps=1"});
  auto plain = run(cfg_plain, dir.path() + "/plain");
  try {
    trainer::export_checkpoint(plain.checkpoints[0], dir.path() + "/x", true);
    ADD_FAILURE() << "exporting EMA weights of a run without EMA must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no EMA weights"), std::string::npos) << e.what();
  }
}

// An export that fails partway (here config.json's temporary name is taken by a folder) replaces
// nothing in a folder it was asked to replace: the earlier export's weights and config stay, and no
// temporary file is left. A successful replacement drops a tokenizer.model it did not write.
TEST(TrainOptions, AFailedExportReplacesNothing) {
  TempDir dir;
  auto cfg = make_config(dir, 4, {"train.ema_decay=0.5", "train.warmup_steps=1"});
  auto r = run(cfg, dir.path() + "/run");
  ASSERT_EQ(r.checkpoints.size(), 1u);
  const std::string out = dir.path() + "/export";
  trainer::export_checkpoint(r.checkpoints[0], out, /*ema=*/false);
  auto read_all = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string weights = read_all(out + "/model.safetensors"), config = read_all(out + "/config.json");
  storage::files::make_dirs(out + "/config.json.tmp/blocker");
  try {
    trainer::export_checkpoint(r.checkpoints[0], out, /*ema=*/true, /*replace=*/true);
    ADD_FAILURE() << "the export must fail: config.json.tmp is a folder";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing replaced"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(out + "/model.safetensors"), weights);  // still the live weights
  EXPECT_EQ(read_all(out + "/config.json"), config);
  EXPECT_FALSE(storage::files::exists(out + "/model.safetensors.tmp"));

  storage::files::remove_tree(out + "/config.json.tmp");
  { std::ofstream(out + "/tokenizer.model") << "another run's tokenizer"; }
  trainer::export_checkpoint(r.checkpoints[0], out, /*ema=*/true, /*replace=*/true);
  EXPECT_NE(read_all(out + "/model.safetensors"), weights);  // now the EMA weights
  EXPECT_NE(read_all(out + "/config.json").find("\"ema\""), std::string::npos);
  EXPECT_FALSE(storage::files::exists(out + "/tokenizer.model"));
}

// Telemetry names its metrics per GPU; where NVML is missing, open() is quietly empty.
TEST(TrainOptions, TelemetryMetricNames) {
  trainer::GpuSample s;
  s.index = 1;
  s.utilization = 97;
  s.power_w = 650.5;
  auto m = trainer::Telemetry::as_metrics({s});
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], (std::pair<std::string, double>{"gpu1.util", 97.0}));
  EXPECT_EQ(m[2], (std::pair<std::string, double>{"gpu1.power_w", 650.5}));
  auto t = trainer::Telemetry::open();
  if (torch::cuda::is_available()) {
    ASSERT_NE(t, nullptr);
  }
  if (t) {
    auto samples = t->sample();
    ASSERT_EQ(static_cast<int>(samples.size()), t->device_count());
    EXPECT_GT(samples[0].memory_used_gib, 0.0);
    EXPECT_GT(samples[0].temperature_c, 0.0);
    std::printf("telemetry: gpu0 util %.0f%% mem %.2f GiB power %.0f W temp %.0f C sm %.0f MHz\n",
                samples[0].utilization, samples[0].memory_used_gib, samples[0].power_w, samples[0].temperature_c,
                samples[0].sm_clock_mhz);
  }
}

// train.cuda_graph = "on" where the step cannot be captured (here: the CPU) fails the run before its
// first step, naming the key and the reason; "auto" trains eagerly.
TEST(TrainOptions, CudaGraphOnFailsWhereTheStepCannotBeCaptured) {
  TempDir dir;
  auto cfg = make_config(dir, 3, {"train.cuda_graph=\"on\"", "train.warmup_steps=1"});
  auto r = run(cfg, dir.path() + "/on");
  EXPECT_EQ(r.ended.status, trainer::RunStatus::Failed);
  EXPECT_NE(r.ended.message.find("train.cuda_graph"), std::string::npos) << r.ended.message;
  EXPECT_NE(r.ended.message.find("CPU"), std::string::npos) << r.ended.message;
  EXPECT_TRUE(r.losses.empty());
  auto ok = run(make_config(dir, 3, {"train.cuda_graph=\"auto\"", "train.warmup_steps=1"}), dir.path() + "/auto");
  EXPECT_EQ(ok.ended.status, trainer::RunStatus::Finished) << ok.ended.message;
  EXPECT_EQ(ok.losses.size(), 3u);
}

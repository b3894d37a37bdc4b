// Tests of the run-config parser and validator (trainer/config.h): typed values and defaults,
// every kind of override, one test per class of error, and the to_toml round trip.
// Error tests match on the leading key and a short phrase, not whole lines, so rewording a
// message's tail does not break them while a wrong or missing key still does.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/config.h"

namespace {

using trainer::ConfigResult;
using trainer::parse_config;

const char* const MINIMAL = "[data]\ntrain = [\"text:/tmp/*.txt\"]\n";

ConfigResult parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, "test.toml", overrides);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += "  " + l + "\n";
  return out;
}

// The one error line that starts with `key + ":"`; fails the test if there is not exactly one.
std::string error_for(const ConfigResult& r, const std::string& key) {
  std::vector<std::string> hits;
  for (const std::string& l : r.errors)
    if (l.rfind(key + ":", 0) == 0) hits.push_back(l);
  EXPECT_EQ(hits.size(), 1u) << "key " << key << " in:\n" << joined(r.errors);
  return hits.empty() ? "" : hits[0];
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Config, FullConfigParsesToTypedValues) {
  const char* text = R"(
name = "demo"
seed = 7
[model]
family = "hybrid"
preset = "small"
vocab_size = 0
d = 256
L = 9
pattern = "GGA"
tie_embeddings = false
logit_softcap = 30
[data]
train = ["text:/usr/share/games/fortunes/*", "jsonl:/data/*.jsonl"]
exclude = ["*.dat", "*.u8"]
separator = "%%"
eot_token = 0
tokenizer = "sentencepiece:/m/sp.model"
val = 0.05
loader_threads = 4
[train]
steps = 500
batch_size = 8
seq_len = 128
grad_accum = 2
precision = "bf16"
optimizer = "muon"
lr = 1
lr_final_frac = 0.0
weight_decay = 0.0
beta1 = 0.8
beta2 = 0.99
eps = 1e-10
schedule = "wsd"
warmup_steps = 50
grad_clip = 0.0
ema_decay = 0.999
eval_batches = 5
[run]
devices = "0,1"
runs_dir = "/tmp/runs"
log_interval = 1
eval_interval = 0
save_interval = 0
keep_checkpoints = 1
threads = 3
)";
  ConfigResult r = parse(text);
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  const trainer::RunConfig& c = r.config;
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.model.family, model::Family::Hybrid);
  EXPECT_EQ(c.model.preset, "small");
  EXPECT_EQ(c.model.vocab_size, 0);
  EXPECT_EQ(c.model.d, 256);
  EXPECT_EQ(c.model.n_layers, 9);
  EXPECT_EQ(c.model.pattern, "GGA");
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_DOUBLE_EQ(c.model.logit_softcap, 30.0);
  EXPECT_EQ(c.model.max_seq_len, 128);  // follows train.seq_len
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"text:/usr/share/games/fortunes/*", "jsonl:/data/*.jsonl"}));
  EXPECT_EQ(c.data.exclude, (std::vector<std::string>{"*.dat", "*.u8"}));
  EXPECT_EQ(c.data.separator, "%%");
  EXPECT_EQ(c.data.eot_token, 0);
  EXPECT_EQ(c.data.tokenizer, "sentencepiece:/m/sp.model");
  EXPECT_DOUBLE_EQ(c.data.val_fraction, 0.05);
  EXPECT_EQ(c.data.loader_threads, 4);
  EXPECT_EQ(c.train.steps, 500);
  EXPECT_EQ(c.train.batch_size, 8);
  EXPECT_EQ(c.train.seq_len, 128);
  EXPECT_EQ(c.train.grad_accum, 2);
  EXPECT_EQ(c.train.precision, "bf16");
  EXPECT_EQ(c.train.optimizer, "muon");
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);  // an integer where a float is expected
  EXPECT_DOUBLE_EQ(c.train.lr_final_frac, 0.0);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.train.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.train.eps, 1e-10);
  EXPECT_EQ(c.train.schedule, "wsd");
  EXPECT_EQ(c.train.warmup_steps, 50);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 0.0);
  EXPECT_DOUBLE_EQ(c.train.ema_decay, 0.999);
  EXPECT_EQ(c.train.eval_batches, 5);
  EXPECT_EQ(c.run.devices, "0,1");
  EXPECT_EQ(c.run.runs_dir, "/tmp/runs");
  EXPECT_EQ(c.run.log_interval, 1);
  EXPECT_EQ(c.run.eval_interval, 0);
  EXPECT_EQ(c.run.save_interval, 0);
  EXPECT_EQ(c.run.keep_checkpoints, 1);
  EXPECT_EQ(c.run.threads, 3);

  // Keys not overridden keep the preset's values.
  model::ModelConfig small = *model::make_preset("small", model::Family::Hybrid);
  EXPECT_EQ(c.model.gdn_heads, small.gdn_heads);
  EXPECT_EQ(c.model.mla_kv_rank, small.mla_kv_rank);
  EXPECT_EQ(c.model.ffn_hidden, small.ffn_hidden);
}

TEST(Config, OmittedKeysTakeDefaults) {
  ConfigResult r = parse(MINIMAL);
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  const trainer::RunConfig defaults;
  const trainer::RunConfig& c = r.config;
  EXPECT_EQ(c.name, defaults.name);
  EXPECT_EQ(c.seed, defaults.seed);
  EXPECT_EQ(c.data.train, std::vector<std::string>{"text:/tmp/*.txt"});
  EXPECT_EQ(c.data.separator, defaults.data.separator);
  EXPECT_EQ(c.data.tokenizer, "byte");
  EXPECT_DOUBLE_EQ(c.data.val_fraction, defaults.data.val_fraction);
  EXPECT_EQ(c.train.steps, defaults.train.steps);
  EXPECT_DOUBLE_EQ(c.train.lr, defaults.train.lr);
  EXPECT_EQ(c.train.precision, "auto");
  EXPECT_EQ(c.run.devices, "auto");
  EXPECT_EQ(c.run.keep_checkpoints, defaults.run.keep_checkpoints);

  // No [model]: the gpt tiny preset, max_seq_len from train.seq_len.
  model::ModelConfig tiny = *model::make_preset("tiny", model::Family::Gpt);
  EXPECT_EQ(c.model.family, model::Family::Gpt);
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.d, tiny.d);
  EXPECT_EQ(c.model.n_layers, tiny.n_layers);
  EXPECT_EQ(c.model.vocab_size, tiny.vocab_size);
  EXPECT_EQ(c.model.max_seq_len, defaults.train.seq_len);
}

TEST(Config, SingleStringAcceptedForList) {
  ConfigResult r = parse("[data]\ntrain = \"u16:/shards/*.bin\"\n");
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.data.train, std::vector<std::string>{"u16:/shards/*.bin"});
}

TEST(Config, OverridesOfEveryKind) {
  ConfigResult r = parse(MINIMAL, {
                                      "train.steps=42",                 // int
                                      "train.warmup_steps=4",
                                      "train.lr=1e-3",                  // float
                                      "train.beta1=1",                  // int into float
                                      "run.devices=cpu",                // bare string
                                      "train.precision=\"bf16\"",       // quoted string
                                      "data.train=[\"llmc:a/*\", \"text:b/*\"]",  // list
                                      "data.exclude=*.bak",             // bare string into a list
                                      "model.tie_embeddings=false",     // bool
                                      "name=demo",                      // top-level, bare
                                      "seed=5",                         // top-level, int
                                      " run.runs_dir = /tmp/x ",        // spaces around
                                  });
  ASSERT_FALSE(r.ok());  // beta1 = 1 is out of range; everything else is valid
  ASSERT_EQ(r.errors.size(), 1u) << joined(r.errors);
  EXPECT_TRUE(contains(error_for(r, "train.beta1"), "[0, 1)"));
  const trainer::RunConfig& c = r.config;
  EXPECT_EQ(c.train.steps, 42);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.run.devices, "cpu");
  EXPECT_EQ(c.train.precision, "bf16");
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"llmc:a/*", "text:b/*"}));
  EXPECT_EQ(c.data.exclude, std::vector<std::string>{"*.bak"});
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.seed, 5u);
  EXPECT_EQ(c.run.runs_dir, "/tmp/x");

  ConfigResult q = parse(MINIMAL, {"name=\"x y\"", "run.devices=0", "run.devices=0,2"});
  ASSERT_TRUE(q.ok()) << joined(q.errors);
  EXPECT_EQ(q.config.name, "x y");
  EXPECT_EQ(q.config.run.devices, "0,2");  // the later override wins
  ConfigResult gpu0 = parse(MINIMAL, {"run.devices=0"});
  ASSERT_TRUE(gpu0.ok()) << joined(gpu0.errors);
  EXPECT_EQ(gpu0.config.run.devices, "0");  // "0" is a GPU list, not an integer type error
}

TEST(Config, OverrideReplacesFileValue) {
  std::string text = std::string(MINIMAL) + "[train]\nsteps = 100\nwarmup_steps = 5\nlr = 0.5\n";
  ConfigResult r = parse(text, {"train.steps=7"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.train.steps, 7);
  EXPECT_DOUBLE_EQ(r.config.train.lr, 0.5);
}

TEST(Config, OverridesAloneWithNoFile) {
  ConfigResult r = parse_config("", "<overrides>", {"data.train=text:/tmp/*", "train.steps=3", "train.warmup_steps=1"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.data.train, std::vector<std::string>{"text:/tmp/*"});
  EXPECT_EQ(r.config.train.steps, 3);
}

TEST(Config, OverrideTypeIsChecked) {
  ConfigResult r = parse(MINIMAL, {"train.steps=many", "train.lr=fast"});
  EXPECT_EQ(error_for(r, "train.steps"), "train.steps: expected an integer, got string \"many\"");
  EXPECT_TRUE(contains(error_for(r, "train.lr"), "expected a number, got string \"fast\""));
}

TEST(Config, ModelOverridesApplyOntoPreset) {
  ConfigResult r = parse(MINIMAL, {"model.preset=small", "model.d=256", "model.L=9"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  model::ModelConfig small = *model::make_preset("small", model::Family::Gpt);
  EXPECT_EQ(r.config.model.d, 256);
  EXPECT_EQ(r.config.model.n_layers, 9);
  EXPECT_EQ(r.config.model.attn_heads, small.attn_heads);
  EXPECT_EQ(r.config.model.ffn_hidden, small.ffn_hidden);
  EXPECT_EQ(r.config.model.vocab_size, small.vocab_size);
}

TEST(Config, MaxSeqLenFollowsSeqLenUnlessGiven) {
  ConfigResult r = parse(MINIMAL, {"train.seq_len=64"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.model.max_seq_len, 64);

  ConfigResult given = parse(MINIMAL, {"train.seq_len=64", "model.max_seq_len=1024"});
  ASSERT_TRUE(given.ok()) << joined(given.errors);
  EXPECT_EQ(given.config.model.max_seq_len, 1024);

  ConfigResult shorter = parse(MINIMAL, {"train.seq_len=512", "model.max_seq_len=128"});
  EXPECT_TRUE(contains(error_for(shorter, "model.max_seq_len"), "train.seq_len"));
}

TEST(Config, VocabZeroIsAccepted) {
  ConfigResult r = parse(MINIMAL, {"model.vocab_size=0"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.model.vocab_size, 0);
  ConfigResult neg = parse(MINIMAL, {"model.vocab_size=-1"});
  EXPECT_TRUE(contains(error_for(neg, "model.vocab_size"), "must be >= 0"));
}

TEST(Config, UnknownKeyWithSuggestion) {
  ConfigResult r = parse(std::string(MINIMAL) + "[train]\nlr_peak = 0.1\nstesp = 3\nzzzzzzzz = 1\n");
  EXPECT_EQ(error_for(r, "train.lr_peak"), "train.lr_peak: unknown key (did you mean 'train.lr'?)");
  EXPECT_EQ(error_for(r, "train.stesp"), "train.stesp: unknown key (did you mean 'train.steps'?)");
  EXPECT_EQ(error_for(r, "train.zzzzzzzz"), "train.zzzzzzzz: unknown key");

  // A key in the wrong place is pointed at its real home.
  ConfigResult misplaced = parse(std::string("lr = 0.1\n") + MINIMAL, {"train.devices=cpu"});
  EXPECT_EQ(error_for(misplaced, "lr"), "lr: unknown key (did you mean 'train.lr'?)");
  EXPECT_EQ(error_for(misplaced, "train.devices"), "train.devices: unknown key (did you mean 'run.devices'?)");
}

TEST(Config, UnknownSection) {
  ConfigResult r = parse(std::string(MINIMAL) + "[trian]\nsteps = 3\n[optimizer]\nx = 1\n");
  EXPECT_EQ(error_for(r, "trian"), "trian: unknown section (did you mean 'train'?)");
  EXPECT_EQ(error_for(r, "optimizer"), "optimizer: unknown section");
  EXPECT_EQ(r.errors.size(), 2u) << joined(r.errors);

  ConfigResult not_table = parse(std::string("train = 5\n") + MINIMAL);
  EXPECT_TRUE(contains(error_for(not_table, "train"), "expected a table"));
}

TEST(Config, WrongType) {
  ConfigResult r = parse(std::string(MINIMAL) +
                         "[train]\nsteps = \"many\"\nbatch_size = 2.5\nseq_len = 128.0\nlr = \"x\"\n"
                         "[model]\ntie_embeddings = 1\n[run]\ndevices = 0\n");
  EXPECT_EQ(error_for(r, "train.steps"), "train.steps: expected an integer, got string \"many\"");
  EXPECT_EQ(error_for(r, "train.batch_size"), "train.batch_size: expected an integer, got float 2.5");
  EXPECT_EQ(error_for(r, "train.seq_len"), "train.seq_len: expected an integer, got float 128.0");
  EXPECT_TRUE(contains(error_for(r, "train.lr"), "expected a number"));
  EXPECT_TRUE(contains(error_for(r, "model.tie_embeddings"), "expected a boolean"));
  EXPECT_TRUE(contains(error_for(r, "run.devices"), "expected a string, got integer 0"));
  EXPECT_EQ(r.errors.size(), 6u) << joined(r.errors);

  ConfigResult list = parse("[data]\ntrain = [\"text:a\", 3]\n");
  EXPECT_TRUE(contains(error_for(list, "data.train"), "expected a list of strings"));
  EXPECT_EQ(list.errors.size(), 1u) << joined(list.errors);  // no extra "required" line
}

TEST(Config, OutOfRange) {
  ConfigResult r = parse(std::string() +
                         "[train]\nlr = -0.001\nbatch_size = 0\nprecision = \"fp64\"\nschedule = \"linear\"\n"
                         "optimizer = \"sgd\"\n[data]\nval = 1.5\ntokenizer = \"bpe\"\n"
                         "[model]\nfamily = \"rnn\"\npreset = \"huge\"\n[run]\ndevices = \"gpu\"\n",
                         {"data.train=[\"text:\", \"csv:/x\"]"});
  EXPECT_EQ(error_for(r, "train.lr"), "train.lr: must be > 0 (got -0.001)");
  EXPECT_EQ(error_for(r, "train.batch_size"), "train.batch_size: must be >= 1 (got 0)");
  EXPECT_EQ(error_for(r, "train.precision"), "train.precision: must be one of auto, fp32, bf16, fp16, fp8 (got \"fp64\")");
  EXPECT_TRUE(contains(error_for(r, "train.schedule"), "must be one of cosine, wsd, constant"));
  EXPECT_TRUE(contains(error_for(r, "train.optimizer"), "must be one of adamw, muon"));
  EXPECT_EQ(error_for(r, "data.val"), "data.val: must be in [0, 1) (got 1.5)");
  EXPECT_TRUE(contains(error_for(r, "data.tokenizer"), "sentencepiece:"));
  EXPECT_TRUE(contains(error_for(r, "model.family"), "must be one of gpt, hybrid"));
  EXPECT_TRUE(contains(error_for(r, "model.preset"), "must be one of tiny, tiny-moe, small, base, moe-1b"));
  EXPECT_TRUE(contains(error_for(r, "run.devices"), "auto, cpu, cpu:N, all"));
  int train_lines = 0;
  for (const std::string& l : r.errors) train_lines += l.rfind("data.train:", 0) == 0;
  EXPECT_EQ(train_lines, 2) << joined(r.errors);  // "text:" has no path; "csv:" is no source kind
}

// Muon's keys: the experts switch and the iteration's dtype (auto picks bf16 on a GPU).
TEST(Config, MuonKeys) {
  ConfigResult ok =
      parse(MINIMAL, {"train.optimizer=\"muon\"", "train.muon_experts=true", "train.muon_precision=\"fp32\""});
  ASSERT_TRUE(ok.ok()) << joined(ok.errors);
  EXPECT_TRUE(ok.config.train.muon_experts);
  EXPECT_EQ(ok.config.train.muon_precision, "fp32");
  EXPECT_EQ(parse(MINIMAL).config.train.muon_precision, "auto");
  ConfigResult bad = parse(MINIMAL, {"train.muon_precision=\"fp16\""});
  EXPECT_EQ(error_for(bad, "train.muon_precision"),
            "train.muon_precision: must be one of auto, bf16, fp32 (got \"fp16\")");
}

// The run's folder is runs_dir/<name>: a name that is not one path component would put its
// checkpoints elsewhere (and an over-long one fails only after the run's row exists).
TEST(Config, NameIsOneFolderName) {
  for (const char* bad : {"../../tmp/x", "a/b", "..", "."}) {
    ConfigResult r = parse(MINIMAL, {std::string("name=\"") + bad + "\""});
    EXPECT_NE(error_for(r, "name").find(std::string("(got \"") + bad + "\")"), std::string::npos) << bad;
  }
  ConfigResult long_name = parse(MINIMAL, {"name=" + std::string(201, 'x')});
  EXPECT_NE(error_for(long_name, "name").find("at most 200 characters"), std::string::npos);
  EXPECT_TRUE(parse(MINIMAL, {"name=" + std::string(200, 'x')}).ok());
  EXPECT_TRUE(parse(MINIMAL, {"name=lr-sweep.3e-4"}).ok());
}

// run.checkpoint_dir moves the run's folder (its checkpoints) out of runs_dir; unset, it stays there.
TEST(Config, CheckpointDirPlacesTheRunFolder) {
  ConfigResult local = parse(MINIMAL, {"run.runs_dir=\"/tmp/runs\""});
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local.config.run.checkpoint_dir, "");
  EXPECT_EQ(trainer::run_folder(local.config, "demo-2"), "/tmp/runs/demo-2");
  ConfigResult shared = parse(MINIMAL, {"run.runs_dir=\"/tmp/runs\"", "run.checkpoint_dir=\"/shared/ckpt\""});
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(trainer::run_folder(shared.config, "demo-2"), "/shared/ckpt/demo-2");
  EXPECT_NE(trainer::to_toml(shared.config).find("checkpoint_dir = \"/shared/ckpt\""), std::string::npos);
}

// A timeout c10d would round to 0 ms means no timeout at all, and a dead rank would hang the others.
TEST(Config, CollectiveTimeoutRange) {
  for (const char* bad : {"0.0004", "0.5", "-3.0", "inf", "nan", "1e16"}) {
    ConfigResult r = parse(MINIMAL, {std::string("run.collective_timeout_s=") + bad});
    EXPECT_NE(error_for(r, "run.collective_timeout_s").find("must be in [1, 2592000] seconds"), std::string::npos)
        << bad;
  }
  EXPECT_TRUE(parse(MINIMAL, {"run.collective_timeout_s=3.0"}).ok());
}

TEST(Config, LoaderThreadsAndPrefetchAreBounded) {
  for (const char* bad : {"0", "257", "3000"}) {
    ConfigResult r = parse(MINIMAL, {std::string("data.loader_threads=") + bad});
    EXPECT_NE(error_for(r, "data.loader_threads").find("must be in [1, 256]"), std::string::npos) << bad;
  }
  ConfigResult r = parse(MINIMAL, {"data.prefetch=100000"});
  EXPECT_NE(error_for(r, "data.prefetch").find("must be in [1, 1024]"), std::string::npos);
  EXPECT_TRUE(parse(MINIMAL, {"data.loader_threads=256", "data.prefetch=1024"}).ok());
}

TEST(Config, DevicesForms) {
  for (const char* ok : {"auto", "cpu", "cpu:4", "all", "0", "0,1,3", "1, 2"}) {
    ConfigResult r = parse(MINIMAL, {std::string("run.devices=") + ok});
    EXPECT_TRUE(r.ok()) << ok << ":\n" << joined(r.errors);
  }
  EXPECT_TRUE(parse(MINIMAL, {"run.devices=\"cpu:256\""}).ok());
  EXPECT_TRUE(contains(error_for(parse(MINIMAL, {"run.devices=\"cpu:100000\""}), "run.devices"), "at most 256"));
  EXPECT_TRUE(contains(error_for(parse(MINIMAL, {"run.threads=100000"}), "run.threads"), "[0, 1024]"));
  EXPECT_TRUE(contains(error_for(parse(MINIMAL, {"run.bucket_mb=9000000000000"}), "run.bucket_mb"), "[1, 1048576]"));
  for (const char* bad : {"cpu:0", "cpu:x", "gpu", "0,,1", "0,", "-1", "0,0", ""}) {
    ConfigResult r = parse(MINIMAL, {std::string("run.devices=\"") + bad + "\""});
    EXPECT_FALSE(r.ok()) << bad;
    error_for(r, "run.devices");
  }
}

TEST(Config, Contradictions) {
  ConfigResult r = parse(MINIMAL, {"train.steps=100", "train.warmup_steps=200", "train.grad_accum=0",
                                   "train.beta2=1.0", "run.log_interval=0", "run.keep_checkpoints=0",
                                   "model.attn_heads=6", "model.attn_kv_heads=4"});
  EXPECT_TRUE(contains(error_for(r, "train.warmup_steps"), "must be <= train.steps"));
  EXPECT_TRUE(contains(error_for(r, "train.grad_accum"), "must be >= 1"));
  EXPECT_TRUE(contains(error_for(r, "train.beta2"), "[0, 1)"));
  EXPECT_TRUE(contains(error_for(r, "run.log_interval"), "eval_interval"));
  EXPECT_TRUE(contains(error_for(r, "run.keep_checkpoints"), "must be >= 1"));
  EXPECT_TRUE(contains(error_for(r, "model.attn_heads"), "divisible"));
  EXPECT_EQ(r.errors.size(), 6u) << joined(r.errors);
}

TEST(Config, SyntaxErrorNamesLine) {
  ConfigResult r = parse("name = \"x\"\n[train]\nsteps = = 3\n");
  ASSERT_EQ(r.errors.size(), 1u) << joined(r.errors);
  EXPECT_EQ(r.errors[0].rfind("test.toml:3:", 0), 0u) << r.errors[0];
}

TEST(Config, MissingDataTrain) {
  ConfigResult r = parse("name = \"x\"\n");
  ASSERT_EQ(r.errors.size(), 1u) << joined(r.errors);
  EXPECT_EQ(r.errors[0], "data.train: required (a list of sources like \"text:/path/*.txt\")");
  ConfigResult empty = parse("[data]\ntrain = []\n");
  error_for(empty, "data.train");
}

TEST(Config, BadOverrideSyntax) {
  ConfigResult r = parse(MINIMAL, {"train.steps", "=3", ".lr=1", "train.=1"});
  EXPECT_EQ(r.errors.size(), 4u) << joined(r.errors);
  EXPECT_TRUE(contains(r.errors[0], "\"train.steps\"")) << r.errors[0];
  EXPECT_TRUE(contains(r.errors[0], "section.key=value")) << r.errors[0];
}

// Overrides that would silently drop settings: a whole section as one value (its other keys back
// to their defaults), a key under a name that holds a value, and text that is not UTF-8.
TEST(Config, OverridesThatWouldDropSettingsAreRefused) {
  ConfigResult whole = parse(std::string(MINIMAL) + "[train]\nsteps = 700\n", {"model={d=256}", "train={steps=5}"});
  ASSERT_EQ(whole.errors.size(), 2u) << joined(whole.errors);
  EXPECT_TRUE(contains(whole.errors[0], "would replace the whole [model] section")) << whole.errors[0];
  EXPECT_TRUE(contains(whole.errors[0], "model.KEY=VALUE")) << whole.errors[0];
  EXPECT_TRUE(contains(whole.errors[1], "[train]")) << whole.errors[1];
  ConfigResult under_value = parse(std::string("name = \"demo\"\n") + MINIMAL, {"name.x=foo"});
  ASSERT_EQ(under_value.errors.size(), 1u) << joined(under_value.errors);
  EXPECT_TRUE(contains(under_value.errors[0], "\"name\" holds a value, not a section")) << under_value.errors[0];
  ConfigResult latin1 = parse(MINIMAL, {"data.separator=\xa7"});
  ASSERT_EQ(latin1.errors.size(), 1u) << joined(latin1.errors);
  EXPECT_TRUE(contains(latin1.errors[0], "not valid UTF-8")) << latin1.errors[0];
  EXPECT_TRUE(contains(latin1.errors[0], "data.separator")) << latin1.errors[0];
  ConfigResult utf8 = parse(MINIMAL, {"data.separator=\xc2\xa7"});  // § in UTF-8
  EXPECT_TRUE(utf8.ok()) << joined(utf8.errors);
  EXPECT_EQ(utf8.config.data.separator, "\xc2\xa7");
}

TEST(Config, ReportsEveryErrorAtOnce) {
  ConfigResult r = parse(std::string(MINIMAL) +
                         "[train]\nsteps = \"many\"\nlr = -1\nwarmup = 10\n[run]\nkeep_checkpoints = 0\n");
  ASSERT_EQ(r.errors.size(), 4u) << joined(r.errors);
  error_for(r, "train.steps");
  error_for(r, "train.lr");
  EXPECT_TRUE(contains(error_for(r, "train.warmup"), "did you mean 'train.warmup_steps'"));
  error_for(r, "run.keep_checkpoints");
}

TEST(Config, TomlRoundTrip) {
  // Every section away from its defaults, including strings that need escaping.
  ConfigResult r = parse(MINIMAL, {
                                      "name=\"a \\\"quoted\\\" name\\t\"", "seed=99",
                                      "model.family=hybrid", "model.preset=tiny-moe", "model.vocab_size=0",
                                      "model.d=96", "model.pattern=GAS", "model.logit_softcap=15.5",
                                      "model.init_std=0.0123456789", "model.rope_theta=500000",
                                      "model.gdn_neg_eig=true", "model.gdn_scan_precision=\"tf32\"", "model.moe_aux_coef=1e-3",
                                      "data.exclude=[\"*.dat\", \"*.u8\"]", "data.separator=\"\"",
                                      "data.val=0.1", "train.lr=3e-4", "train.eps=1e-8",
                                      "train.beta2=0.999", "train.schedule=constant", "train.seq_len=96",
                                      "run.devices=cpu:2", "run.threads=1",
                                  });
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  const std::string toml = trainer::to_toml(r.config);
  ConfigResult back = parse_config(toml, "roundtrip.toml", {});
  ASSERT_TRUE(back.ok()) << joined(back.errors) << toml;
  EXPECT_EQ(trainer::to_toml(back.config), toml);
  EXPECT_EQ(trainer::to_json(back.config), trainer::to_json(r.config));
  EXPECT_EQ(back.config.name, "a \"quoted\" name\t");
  EXPECT_EQ(back.config.model.family, model::Family::Hybrid);
  EXPECT_EQ(back.config.model.preset, "tiny-moe");
  EXPECT_EQ(back.config.model.vocab_size, 0);
  EXPECT_EQ(back.config.model.max_seq_len, 96);
  EXPECT_EQ(back.config.model.init_std, r.config.model.init_std);  // bit-exact
  EXPECT_EQ(back.config.train.eps, 1e-8);
  EXPECT_EQ(back.config.data.separator, "");

  // The defaults (an empty exclude list among them) come back unchanged.
  ConfigResult plain = parse(MINIMAL);
  ASSERT_TRUE(plain.ok());
  ConfigResult plain_back = parse_config(trainer::to_toml(plain.config), "roundtrip.toml", {});
  ASSERT_TRUE(plain_back.ok()) << joined(plain_back.errors);
  EXPECT_EQ(trainer::to_json(plain_back.config), trainer::to_json(plain.config));

  // An explicit max_seq_len that differs from seq_len survives too.
  trainer::RunConfig c = r.config;
  c.model.max_seq_len = 512;
  ConfigResult again = parse_config(trainer::to_toml(c), "roundtrip.toml", {});
  ASSERT_TRUE(again.ok()) << joined(again.errors);
  EXPECT_EQ(again.config.model.max_seq_len, 512);
}

TEST(Config, JsonHasEveryKeyNested) {
  ConfigResult r = parse(MINIMAL);
  ASSERT_TRUE(r.ok());
  nlohmann::json j = nlohmann::json::parse(trainer::to_json(r.config));
  EXPECT_EQ(j["name"], "run");
  EXPECT_EQ(j["seed"], 1337);
  EXPECT_EQ(j["model"]["family"], "gpt");
  EXPECT_EQ(j["model"]["L"], r.config.model.n_layers);
  // family, preset and the 37 ModelConfig keys.
  EXPECT_EQ(j["model"].size(), 39u);
  EXPECT_EQ(j["data"]["train"][0], "text:/tmp/*.txt");
  EXPECT_EQ(j["data"]["val"], 0.01);
  EXPECT_EQ(j["data"].size(), 12u);
  EXPECT_EQ(j["train"].size(), 32u);  // with cuda_graph, cuda_graph_pieces, muon_experts and muon_precision
  EXPECT_EQ(j["run"].size(), 14u);
}

// data.val is a fraction or a list of sources, and round-trips through TOML either way.
TEST(Config, ValidationSplitFractionOrSources) {
  ConfigResult frac = parse(MINIMAL, {"data.val=0.05"});
  ASSERT_TRUE(frac.ok()) << joined(frac.errors);
  EXPECT_DOUBLE_EQ(frac.config.data.val_fraction, 0.05);
  EXPECT_TRUE(frac.config.data.val_sources.empty());

  ConfigResult list = parse(MINIMAL, {"data.val=[\"llmc:/d/val_*.bin\"]"});
  ASSERT_TRUE(list.ok()) << joined(list.errors);
  EXPECT_EQ(list.config.data.val_sources, std::vector<std::string>{"llmc:/d/val_*.bin"});
  ConfigResult again = parse(trainer::to_toml(list.config));
  ASSERT_TRUE(again.ok()) << joined(again.errors);
  EXPECT_EQ(again.config.data.val_sources, list.config.data.val_sources);

  ConfigResult bad = parse(MINIMAL, {"data.val=[\"/no/prefix\"]"});
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_EQ(bad.errors[0], "data.val: each validation source must be text:, jsonl:, llmc: or u16: with a path (got \"/no/prefix\")");
  ConfigResult wrong_type = parse(MINIMAL, {"data.val=true"});
  ASSERT_EQ(wrong_type.errors.size(), 1u);
  EXPECT_EQ(wrong_type.errors[0].rfind("data.val: expected a fraction of documents (a number) or a list of sources", 0), 0u);
}

TEST(Config, SourceWeightsMatchSources) {
  ConfigResult r = parse(MINIMAL, {"data.train=[\"text:/a/*\", \"llmc:/b/*.bin\"]", "data.weights=[3, 1.5]"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.data.weights, (std::vector<double>{3.0, 1.5}));
  ConfigResult count = parse(MINIMAL, {"data.weights=[1, 2]"});
  ASSERT_EQ(count.errors.size(), 1u);
  EXPECT_EQ(count.errors[0], "data.weights: needs one weight per data.train source (got 2 weights for 1 sources)");
  ConfigResult neg = parse(MINIMAL, {"data.weights=[-1]"});
  ASSERT_EQ(neg.errors.size(), 1u);
  EXPECT_EQ(neg.errors[0], "data.weights: every weight must be > 0 (got -1.0)");
}

TEST(Config, ProgressivePhases) {
  ConfigResult r = parse(MINIMAL, {"train.phases=[\"0:64x32\", \"5e6:128x16\"]", "train.seq_len=128"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  auto phases = trainer::resolve_phases(r.config.train);
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[1].tokens, 5000000);
  EXPECT_EQ(phases[1].seq_len, 128);
  EXPECT_EQ(phases[1].batch_size, 16);
  // Without phases: one phase of seq_len × batch_size.
  auto plain = trainer::resolve_phases(parse(MINIMAL).config.train);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].seq_len, parse(MINIMAL).config.train.seq_len);

  ConfigResult bad = parse(MINIMAL, {"train.phases=[\"10:64x2\", \"5:64\", \"4:64x1\"]"});
  ASSERT_EQ(bad.errors.size(), 3u) << joined(bad.errors);
  EXPECT_EQ(bad.errors[0], "train.phases: the first phase must start at 0 tokens (got \"10:64x2\")");
  EXPECT_EQ(bad.errors[1], "train.phases: each phase is \"TOKENS:SEQ_LENxBATCH\" with TOKENS a whole number below "
                           "2^62 and SEQ_LEN, BATCH >= 1, e.g. \"0:256x32\" (got \"5:64\")");
  // A token count past int64 (1e19) is refused by its own message, not taken as a negative number.
  ConfigResult huge = parse(MINIMAL, {"train.phases=[\"0:64x2\", \"1e19:64x1\"]"});
  ASSERT_EQ(huge.errors.size(), 1u) << joined(huge.errors);
  EXPECT_TRUE(contains(huge.errors[0], "below 2^62")) << huge.errors[0];
  EXPECT_TRUE(contains(huge.errors[0], "1e19:64x1")) << huge.errors[0];
  EXPECT_EQ(bad.errors[2], "train.phases: phases must start at increasing token counts (got \"4:64x1\" after 10)");
  ConfigResult too_long = parse(MINIMAL, {"train.phases=[\"0:4096x1\"]", "model.max_seq_len=256"});
  ASSERT_EQ(too_long.errors.size(), 1u) << joined(too_long.errors);
  EXPECT_EQ(too_long.errors[0], "train.phases: seq_len 4096 exceeds model.max_seq_len 256");
}

TEST(Config, LoadConfigFile) {
  ConfigResult missing = trainer::load_config("/nonexistent/deltadeck.toml", {});
  ASSERT_EQ(missing.errors.size(), 1u);
  EXPECT_EQ(missing.errors[0], "/nonexistent/deltadeck.toml: cannot read config file (No such file or directory)");

  const std::string path = (std::filesystem::temp_directory_path() / "dd_test_config.toml").string();
  {
    std::ofstream f(path);
    f << MINIMAL << "[train]\nsteps = 12\nwarmup_steps = 2\n";
  }
  ConfigResult r = trainer::load_config(path, {"train.lr=0.25"});
  ASSERT_TRUE(r.ok()) << joined(r.errors);
  EXPECT_EQ(r.config.train.steps, 12);
  EXPECT_DOUBLE_EQ(r.config.train.lr, 0.25);

  ConfigResult bad = trainer::load_config(path, {"train.stpes=3"});
  EXPECT_TRUE(contains(error_for(bad, "train.stpes"), "train.steps"));
  std::remove(path.c_str());
}

}  // namespace

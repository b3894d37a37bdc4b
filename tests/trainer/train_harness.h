// A tiny GPT run through the Session, as the app drives it, for the trainer's end-to-end tests:
// a synthetic corpus with a learnable pattern, a small config, and the events a run produced.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "tests/support/temp_dir.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/session.h"

namespace train_harness {

using testing_support::TempDir;

// Documents of the alphabet from a random start letter, repeated: after the first byte every
// next byte is predictable, so a working trainer drives the loss far below ln(257).
inline std::string alphabet_corpus(int docs, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::string out;
  for (int d = 0; d < docs; ++d) {
    const int start = static_cast<int>(rng() % 26);
    for (int i = 0; i < 60; ++i) out += static_cast<char>('a' + (start + i) % 26);
    out += "\n%\n";
  }
  return out;
}

inline trainer::RunConfig make_config(const TempDir& dir, int64_t steps, std::vector<std::string> extra = {}) {
  dir.write("corpus/alpha.txt", alphabet_corpus(300, 5));
  std::vector<std::string> o = {"data.train=[\"text:" + dir.path() + "/corpus/*.txt\"]",
                                "data.val=0.05",
                                "model.d=64", "model.L=2", "model.attn_heads=2", "model.attn_kv_heads=1",
                                "model.attn_head_dim=32", "model.ffn_hidden=128",
                                "train.steps=" + std::to_string(steps), "train.batch_size=8", "train.seq_len=32",
                                "train.lr=3e-3", "train.warmup_steps=10", "train.eval_batches=4",
                                "run.log_interval=1", "run.eval_interval=0", "run.save_interval=0",
                                "run.threads=1", "run.devices=\"cpu\"",
                                "run.runs_dir=\"" + dir.path() + "/runs\""};
  o.insert(o.end(), extra.begin(), extra.end());
  auto parsed = trainer::parse_config("", "<test>", o);
  EXPECT_TRUE(parsed.ok()) << (parsed.errors.empty() ? "" : parsed.errors[0]);
  auto cfg = parsed.config;
  auto unresolved = trainer::resolve_config(cfg);
  EXPECT_TRUE(unresolved.empty()) << (unresolved.empty() ? "" : unresolved[0]);
  return cfg;
}

struct RunResult {
  std::vector<double> losses;  // one per step
  std::vector<double> val_losses;
  std::map<std::string, std::vector<double>> metrics;  // every value by key, in order
  std::vector<std::string> checkpoints;
  std::vector<std::string> logs;  // "level: text" of every log event
  trainer::EndedEvent ended;
};

inline RunResult run(const trainer::RunConfig& cfg, const std::string& run_dir, const std::string& resume = "",
              int64_t stop_after_step = -1) {
  trainer::Session s(cfg, trainer::SessionOptions(run_dir, resume));
  s.start();
  RunResult r;
  bool stop_sent = false;
  while (auto ev = s.events().pop()) {
    if (auto* m = std::get_if<trainer::MetricsEvent>(&*ev)) {
      for (const auto& [k, v] : m->values) {
        r.metrics[k].push_back(v);
        if (k == "loss") r.losses.push_back(v);
        if (k == "val_loss") r.val_losses.push_back(v);
      }
      if (stop_after_step >= 0 && m->step >= stop_after_step && !stop_sent) {
        s.send(trainer::Command::Stop);
        stop_sent = true;
      }
    } else if (auto* l = std::get_if<trainer::LogEvent>(&*ev)) {
      r.logs.push_back(l->level + ": " + l->text);
    } else if (auto* c = std::get_if<trainer::CheckpointEvent>(&*ev)) {
      r.checkpoints.push_back(c->path);
    } else if (auto* e = std::get_if<trainer::EndedEvent>(&*ev)) {
      r.ended = *e;
    }
  }
  s.join();
  return r;
}


}  // namespace train_harness

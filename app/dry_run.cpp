// The dry run's report. Everything here is arithmetic on the config plus directory listings and
// file headers; the model build and device probe are in dry_run_torch.cpp.
#include "app/dry_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "app/build_info.h"
#include "model/model_config.h"
#include "storage/file_util.h"
#include "trainer/config.h"
#include "trainer/data/source.h"
#include "trainer/lr_schedule.h"
#include "ui/log/log_line.h"

namespace app {

namespace {

// Models above this many bytes of fp32 weights are not built (their figures come from the accounting).
constexpr int64_t BUILD_LIMIT_BYTES = int64_t{1} << 30;
// The MFU the time estimate assumes: a well-tuned run of a mid-size model reaches about this.
constexpr double ASSUMED_MFU = 0.4;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// What a source holds, as far as it is cheap to tell: files, bytes, and tokens for token shards
// (exact, from llm.c headers or u16 file sizes) or the byte tokenizer (about one per byte).
struct SourceFigures {
  int64_t files = 0, bytes = 0;
  int64_t tokens = -1;  // -1: unknown without tokenizing
  std::string tokens_how;
};

SourceFigures source_figures(const std::string& spec, const trainer::DataConfig& data, const std::string& key) {
  SourceFigures f;
  const std::vector<std::string> paths = trainer::data::expand_source_files(spec, data.exclude, key);
  const bool llmc = spec.rfind("llmc:", 0) == 0, u16 = spec.rfind("u16:", 0) == 0;
  int64_t tokens = 0;
  for (const std::string& p : paths) {
    const int64_t size = std::max<int64_t>(0, storage::files::file_size(p));
    ++f.files;
    f.bytes += size;
    if (llmc) {
      int32_t header[3] = {0, 0, 0};
      std::ifstream in(p, std::ios::binary);
      in.read(reinterpret_cast<char*>(header), sizeof header);
      tokens += header[2];
    } else if (u16) {
      tokens += size / 2;
    }
  }
  if (llmc || u16) {
    f.tokens = tokens;
    f.tokens_how = llmc ? "from the shard headers" : "2 bytes each";
  } else if (data.tokenizer == "byte") {
    f.tokens = f.bytes;
    f.tokens_how = "about one per byte with the byte tokenizer";
  }
  return f;
}

void print_source(const char* label, const std::string& spec, const SourceFigures& f) {
  std::cout << "         " << label << spec << "\n           " << f.files << (f.files == 1 ? " file, " : " files, ")
            << ui::format_bytes(static_cast<double>(f.bytes));
  if (f.tokens >= 0) std::cout << ", " << ui::format_count(static_cast<double>(f.tokens)) << " tokens (" << f.tokens_how << ")";
  std::cout << "\n";
}

}  // namespace

int dry_run(const trainer::RunConfig& cfg, const DryRunInfo& info) {
  std::cout << "deltadeck " << VERSION << " (" << REVISION << "): dry run of " << info.where
            << "; nothing is trained, recorded or written\n";
  const std::string db = cfg.run.runs_dir + "/deltadeck.db";
  std::cout << "run      '" << cfg.name << "': database " << db << ", checkpoints " << trainer::run_folder(cfg, cfg.name)
            << "/checkpoints" << (info.resume_from.empty() ? " (a suffix is added if the name is taken)" : "")
            << "\n";
  if (!info.resume_from.empty()) std::cout << "         would resume from " << info.resume_from << "\n";

  // ---- data
  std::cout << "data     every source opened and checked\n";
  int64_t train_tokens = 0;
  bool train_tokens_known = true;
  for (size_t i = 0; i < cfg.data.train.size(); ++i) {
    const SourceFigures f = source_figures(cfg.data.train[i], cfg.data, "data.train[" + std::to_string(i) + "]");
    print_source("train  ", cfg.data.train[i], f);
    if (f.tokens < 0) train_tokens_known = false;
    else train_tokens += f.tokens;
  }
  if (cfg.data.val_sources.empty()) {
    std::cout << "         val    " << fmt("%g", 100 * cfg.data.val_fraction) << "% of the training documents held out\n";
  } else {
    for (size_t i = 0; i < cfg.data.val_sources.size(); ++i) {
      print_source("val    ", cfg.data.val_sources[i],
                   source_figures(cfg.data.val_sources[i], cfg.data, "data.val[" + std::to_string(i) + "]"));
    }
  }
  const DryRunSplit split = probe_split(cfg);
  if (!split.error.empty()) {
    std::cout << std::flush;
    std::cerr << "deltadeck: dry run: " << split.error << "\n";
    return 2;
  }
  std::cout << "         split  " << ui::format_grouped(split.train_documents) << " training documents, "
            << ui::format_grouped(split.val_documents) << " held out: " << split.val_batches
            << (split.val_batches == 1 ? " validation batch (" : " validation batches (")
            << ui::format_count(static_cast<double>(split.val_tokens)) << " tokens)\n";
  std::cout << "         tokenizer " << cfg.data.tokenizer << ", vocabulary " << cfg.model.vocab_size << "\n";

  // ---- model
  const model::ModelConfig& m = cfg.model;
  const int64_t params = model::count_params(m), active = model::count_active_params(m);
  const int64_t flops = model::flops_per_token(m);
  std::cout << "model    " << model::family_name(m.family) << " " << m.preset << ": L=" << m.n_layers << ", d=" << m.d
            << ", pattern \"" << m.pattern << "\", V=" << m.vocab_size << ", T=" << m.max_seq_len
            << (m.moe_experts > 0 ? ", MoE E=" + std::to_string(m.moe_experts) + " k=" + std::to_string(m.moe_top_k)
                                  : ", SwiGLU f=" + std::to_string(m.ffn_hidden))
            << "\n         parameters " << ui::format_grouped(params);
  if (active != params) std::cout << " (" << ui::format_grouped(active) << " active per token)";
  const int64_t built = built_param_count(cfg, BUILD_LIMIT_BYTES);
  if (built < 0) {
    std::cout << "; not built (" << ui::format_bytes(4.0 * static_cast<double>(params)) << " of fp32 weights): counted\n";
  } else if (built == params) {
    std::cout << "; built on the CPU: the same count\n";
  } else {
    std::cout << "\n         warning: the model built on the CPU has " << ui::format_grouped(built)
              << " parameters, the accounting says " << ui::format_grouped(params) << " (memory figures below use the latter)\n";
  }
  std::cout << "         training FLOPs per token " << ui::format_grouped(flops) << " (forward + backward, context "
            << m.max_seq_len << ")\n";

  // ---- devices
  const DryRunDevices dev = probe_devices(cfg);
  const int64_t ranks = static_cast<int64_t>(dev.names.size());
  const int64_t world = ranks * info.nnodes;
  std::cout << "devices  run.devices \"" << cfg.run.devices << "\": " << ranks << (ranks == 1 ? " rank" : " ranks")
            << " per node × " << info.nnodes << (info.nnodes == 1 ? " node" : " nodes") << " = world size " << world
            << ", precision " << cfg.train.precision << "\n";
  for (size_t i = 0; i < dev.names.size() && i < 8; ++i) std::cout << "         rank " << i << ": " << dev.names[i] << "\n";
  if (dev.names.size() > 8) std::cout << "         ... " << dev.names.size() - 8 << " more\n";

  // ---- memory per device
  const std::vector<trainer::Phase> phases = trainer::resolve_phases(cfg.train);
  int64_t rows_tokens = 0;  // the largest micro-batch, in tokens
  for (const auto& ph : phases) rows_tokens = std::max(rows_tokens, ph.batch_size * ph.seq_len);
  const double P = static_cast<double>(params);
  const double weights = 4 * P, grads = 4 * P;
  const double optim = 8 * P / (cfg.run.zero1 ? static_cast<double>(world) : 1.0);
  const double ema = cfg.train.ema_decay > 0 ? 4 * P : 0;
  const bool low_precision = cfg.train.precision != "fp32";
  const double casts = low_precision ? 2 * P : 0;
  // activation_bytes_per_token assumes bf16 activations; fp32 keeps them at twice the size.
  const double act = static_cast<double>(model::activation_bytes_per_token(m)) * static_cast<double>(rows_tokens) *
                     (low_precision ? 1.0 : 2.0);
  const double V = static_cast<double>(m.vocab_size);
  double logit_tokens = static_cast<double>(rows_tokens);
  if (m.loss_chunk_tokens == 0) logit_tokens = std::min(logit_tokens, std::max(1.0, (256.0 * (1 << 20)) / (4 * V)));
  else if (m.loss_chunk_tokens > 0) logit_tokens = std::min(logit_tokens, static_cast<double>(m.loss_chunk_tokens));
  const double logits = logit_tokens * V * 4 * (m.loss_chunk_tokens < 0 ? 2.0 : 1.0);
  const double total = weights + grads + optim + ema + casts + act + logits;
  std::cout << "memory   per device, estimated:\n"
            << "           weights (fp32)        " << ui::format_bytes(weights) << "\n"
            << "           gradients (fp32)      " << ui::format_bytes(grads) << "\n"
            << "           optimizer state       " << ui::format_bytes(optim) << "  ("
            << (cfg.train.optimizer == "adamw" ? "AdamW moments" : "Muon momentum + AdamW moments, at most")
            << (cfg.run.zero1 ? ", ZeRO-1 sharded over " + std::to_string(world) + " ranks" : "") << ")\n";
  if (ema > 0) std::cout << "           EMA weights           " << ui::format_bytes(ema) << "\n";
  if (casts > 0) std::cout << "           16-bit weight copies  " << ui::format_bytes(casts) << "  (autocast)\n";
  std::cout << "           activations           " << ui::format_bytes(act) << "  (" << ui::format_grouped(rows_tokens)
            << " tokens per micro-batch" << (m.activation_checkpointing ? ", activation checkpointing" : "")
            << (low_precision ? "" : ", fp32") << ")\n"
            << "           logits                " << ui::format_bytes(logits) << "  ("
            << (m.loss_chunk_tokens < 0 ? "the whole micro-batch" : "one chunk of the fused head") << ")\n"
            << "           total                 " << ui::format_bytes(total)
            << "  (plus the CUDA context and allocator slack on a GPU)\n";

  // ---- schedule
  const trainer::TrainConfig& t = cfg.train;
  // The tokens of all steps, phase by phase: a step takes its rows from the phase whose token mark
  // the steps before it reached. Whole runs of steps at a time, so that train.steps = 10^12 is as
  // quick as 10 (one step at a time, the dry run would have worked through them for hours).
  double tokens_total = 0;
  size_t phase = 0;
  for (int64_t left = t.steps; left > 0;) {
    while (phase + 1 < phases.size() && tokens_total >= static_cast<double>(phases[phase + 1].tokens)) ++phase;
    const double per_step =
        static_cast<double>(phases[phase].batch_size * phases[phase].seq_len * t.grad_accum * world);
    int64_t n = left;
    if (phase + 1 < phases.size() && per_step > 0) {
      const double to_next = static_cast<double>(phases[phase + 1].tokens) - tokens_total;  // > 0 here
      n = static_cast<int64_t>(std::min(static_cast<double>(left), std::max(1.0, std::ceil(to_next / per_step))));
    }
    tokens_total += static_cast<double>(n) * per_step;
    left -= n;
  }
  const int64_t first_step_tokens = phases[0].batch_size * phases[0].seq_len * t.grad_accum * world;
  std::cout << "schedule " << ui::format_grouped(t.steps) << " steps × " << ui::format_grouped(first_step_tokens) << " tokens ("
            << phases[0].batch_size << " rows × " << phases[0].seq_len << " × " << t.grad_accum << " accumulation × "
            << world << (world == 1 ? " rank" : " ranks") << ") = " << ui::format_count(tokens_total) << " tokens";
  if (train_tokens_known && train_tokens > 0)
    std::cout << ", " << fmt("%.2f", tokens_total / static_cast<double>(train_tokens)) << " passes over the training data";
  std::cout << "\n";
  if (phases.size() > 1) {
    for (const auto& ph : phases)
      std::cout << "         from " << ui::format_count(static_cast<double>(ph.tokens)) << " tokens: rows of "
                << ph.seq_len << " × " << ph.batch_size << "\n";
  }
  std::cout << "         lr " << t.schedule << ", peak " << fmt("%.2e", t.lr) << " after " << t.warmup_steps
            << " warmup steps" << (t.schedule == "constant" ? "" : ", down to " + fmt("%.2e", t.lr * t.lr_final_frac))
            << "; at steps";
  for (int64_t s : {int64_t{0}, t.warmup_steps, t.steps / 2, t.steps - 1}) {
    s = std::clamp<int64_t>(s, 0, t.steps - 1);
    std::cout << " " << s << ": " << fmt("%.2e", trainer::lr_at(t, s));
  }
  std::cout << "\n         optimizer " << t.optimizer << ", weight decay " << t.weight_decay << ", grad clip " << t.grad_clip
            << (t.ema_decay > 0 ? ", EMA " + fmt("%g", t.ema_decay) : "") << "\n";
  // Saves and evaluations happen every `interval` steps and at the last one.
  auto every = [&](int64_t interval, const char* what) {
    if (interval <= 0) return std::string(what) + " at the end only";
    return std::string(what) + " every " + std::to_string(interval) + " steps and at the end (" +
           std::to_string((t.steps - 1) / interval + 1) + " in all)";
  };
  std::cout << "         " << every(cfg.run.eval_interval, "evaluation") << ", "
            << every(cfg.run.save_interval, "checkpoints") << ", keeping " << cfg.run.keep_checkpoints
            << " + the best; a log line every " << cfg.run.log_interval << " steps\n";
  const double compute = static_cast<double>(flops) * tokens_total;
  std::cout << "compute  " << fmt("%.3g", compute) << " training FLOPs";
  if (dev.peak_tflops > 0) {
    const double secs = compute / (dev.peak_tflops * 1e12 * static_cast<double>(world) * ASSUMED_MFU);
    std::cout << "; about " << ui::format_duration(secs) << " at " << fmt("%.0f", 100 * ASSUMED_MFU) << "% MFU of "
              << fmt("%.0f", dev.peak_tflops) << " TFLOP/s per device";
  } else {
    std::cout << " (no time estimate: no known peak for this device; set run.peak_tflops)";
  }
  std::cout << "\ndry run ok: the config is valid and its data readable\n";
  return 0;
}

}  // namespace app

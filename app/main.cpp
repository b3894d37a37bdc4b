// deltadeck's entry point: the command line (CLI11). Only this file chooses the exit code.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <limits>

#include "app/bench_command.h"
#include "app/bench_train.h"
#include "app/build_info.h"
#include "app/cli_integers.h"
#include "app/export_command.h"
#include "app/model_command.h"
#include "app/runs_command.h"
#include "app/sample_command.h"
#include "app/tokenizer_command.h"
#include "app/train_command.h"
#include "trainer/cluster.h"
#ifdef DD_HAVE_GUI
#include "app/gui_command.h"
#endif

int main(int argc, char** argv) {
  // Before any thread or process group: a failed NCCL peer must fail the run, not end this process
  // (trainer/cluster.h). The app trains in this process too, so every command takes it.
  if (const std::string mode = trainer::nccl_error_handling_override([](const char* k) { return std::getenv(k); });
      !mode.empty())
    setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", mode.c_str(), /*overwrite=*/1);
  CLI::App cli{"deltadeck: train decoder language models (Gated DeltaNet + MLA hybrid, GPT) and watch them train"};
  cli.require_subcommand(0, 1);
  cli.set_version_flag("--version", std::string("deltadeck ") + app::VERSION + " (" + app::REVISION + ")");

  app::TrainArgs train;
  auto* train_cmd = cli.add_subcommand(
      "train",
#ifdef DD_HAVE_GUI
      "Start a training run: in the desktop app given a display; with --no-gui (or no display) the terminal "
      "dashboard, or plain log lines when stdout is not a terminal");
#else
      "Start a training run: the terminal dashboard, or plain log lines when stdout is not a terminal");
#endif
  train_cmd->add_option("-c,--config", train.config_path, "TOML run config (default: the embedded demo config)")
      ->check(CLI::ExistingFile);
  train_cmd->add_option("-s,--set", train.overrides, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  train_cmd->add_option("--runs-dir", train.runs_dir, "Folder of the run database and checkpoints (default: run.runs_dir, \"runs\")");
  train_cmd->add_option("--resume", train.resume,
                        "Continue a run (id, name, unique prefix or \"latest\") from its newest complete checkpoint, "
                        "appending to the same run")
      ->excludes("--config")
      // An empty value (an unset shell variable) would otherwise start a new run from the demo config.
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("expected a run, got nothing") : std::string(); }, "RUN"));
  train_cmd->add_option("--nnodes", train.cluster.nnodes,
                        "Nodes of a multi-node run, one deltadeck process each (default: from torchrun/Slurm, else 1)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  // The cluster options' defaults of -1 mean "not given" (the launcher's environment decides), so a
  // value typed out of range is refused here rather than taken for not given.
  train_cmd->add_option("--node-rank", train.cluster.node_rank, "This node's rank (default: NODE_RANK/RANK/SLURM_NODEID)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  train_cmd->add_option("--master-addr", train.cluster.master_addr,
                        "Host of node 0's rendezvous store (default: MASTER_ADDR, Slurm's first node, 127.0.0.1)");
  train_cmd->add_option("--master-port", train.cluster.master_port, "Its port (default: MASTER_PORT or 29500)")
      ->check(CLI::Range(1, 65535));
  train_cmd->add_flag("--no-gui", train.no_gui,
                      "Run headless: the terminal dashboard when stdout is a terminal, else plain log lines");
  train_cmd->add_flag("--dry-run", train.dry_run,
                      "Validate the config and its data, print parameters, FLOPs per token, memory per device and "
                      "the schedule; start nothing");
  train_cmd->add_option("--log-format", train.log_format,
                        "auto (the dashboard on a terminal, else text) | text | json: one line per logged step "
                        "and per event")
      ->capture_default_str();

  app::RunsArgs runs;
  auto* runs_cmd = cli.add_subcommand("runs", "List, inspect, compare, export, tag, annotate, rename and delete recorded runs");
  runs_cmd->require_subcommand(1);
  runs_cmd->add_option("--runs-dir", runs.runs_dir, "Folder of the run database")->capture_default_str();
  const char* run_help = "Run id, name or unique name prefix";
  auto* list_cmd = runs_cmd->add_subcommand("list", "List runs: id, name, status, model, step, latest validation loss, tags");
  list_cmd->add_option("--status", runs.status,
                       "Only runs with this status: running | finished | stopped | failed | interrupted | preempted | "
                       "diverged");
  list_cmd->add_option("--tag", runs.tag, "Only runs with this tag");
  auto* show_cmd = runs_cmd->add_subcommand("show", "Show one run: record, final and best metrics, checkpoints, events, config");
  show_cmd->add_option("run", runs.run, run_help)->required();
  auto* compare_cmd = runs_cmd->add_subcommand("compare", "Runs side by side: metrics summary and the config keys that differ");
  compare_cmd->add_option("runs", runs.runs, "Two or more runs (id, name or unique name prefix)")->required();
  auto* rexport_cmd = runs_cmd->add_subcommand("export", "Write a run's metrics (csv) or everything recorded about it (json)");
  rexport_cmd->add_option("run", runs.run, run_help)->required();
  rexport_cmd->add_option("--format", runs.format, "csv (step,tokens,wall_s,key,value) | json")->capture_default_str();
  rexport_cmd->add_option("-o,--out", runs.out, "File to write; - = stdout")->capture_default_str();
  rexport_cmd->add_flag("--force", runs.force, "Replace --out if it exists (never the run database)");
  auto* tag_cmd = runs_cmd->add_subcommand("tag", "Add tags to a run (or remove them with --remove)");
  tag_cmd->add_option("run", runs.run, run_help)->required();
  tag_cmd->add_option("tags", runs.tags, "Tags: no whitespace or ','")->required();
  tag_cmd->add_flag("--remove", runs.remove, "Remove the tags instead");
  auto* note_cmd = runs_cmd->add_subcommand("note", "Set a run's note (\"\" clears it)");
  note_cmd->add_option("run", runs.run, run_help)->required();
  note_cmd->add_option("text", runs.text, "The note")->required();
  auto* rename_cmd = runs_cmd->add_subcommand("rename", "Rename a run; its checkpoint folder moves along");
  rename_cmd->add_option("run", runs.run, run_help)->required();
  rename_cmd->add_option("name", runs.text, "The new, unused name")->required();
  auto* delete_cmd = runs_cmd->add_subcommand("delete", "Delete runs with their metrics, events and checkpoint files");
  delete_cmd->add_option("runs", runs.runs, "Runs to delete (id, name or unique name prefix)")->required();
  delete_cmd->add_flag("-y,--yes", runs.yes, "Do not ask for each run");
  auto* import_cmd = runs_cmd->add_subcommand(
      "import", "Bring runs recorded elsewhere into this database: their metrics, config, events and checkpoint paths");
  import_cmd
      ->add_option("paths", runs.paths,
                   "A run record (run_record.json, or `runs export --format json`'s file), or a run folder holding one "
                   "(e.g. a cluster run's <run.checkpoint_dir>/<run>)")
      ->required();
  for (auto* sub : {list_cmd, show_cmd, compare_cmd, rexport_cmd, tag_cmd, note_cmd, rename_cmd, delete_cmd, import_cmd}) {
    sub->fallthrough();  // `runs show demo --runs-dir d` as well as `runs --runs-dir d show demo`
  }

  app::ModelInfoArgs info;
  auto* model_cmd = cli.add_subcommand("model", "Inspect model presets");
  model_cmd->require_subcommand(1);
  auto* info_cmd = model_cmd->add_subcommand("info", "Parameters, training FLOPs per token and activation memory of a preset");
  info_cmd->add_option("-p,--preset", info.preset, "tiny | tiny-moe | small | base | moe-1b")->capture_default_str();
  info_cmd->add_option("-f,--family", info.family, "hybrid | gpt")->capture_default_str();
  info_cmd->add_option("--seq-len", info.seq_len, "Training context T for the FLOPs (default: the preset's)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  info_cmd->add_option("--vocab", info.vocab_size, "Vocabulary size (default: the preset's)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));

  trainer::SampleOptions sample;
  auto* sample_cmd = cli.add_subcommand("sample", "Generate text from a checkpoint (cached token-by-token decoding)");
  sample_cmd->add_option("--checkpoint", sample.checkpoint, "A step_XXXXXXXX checkpoint folder, or a run folder (its newest checkpoint)")
      ->required();
  sample_cmd->add_option("--prompt", sample.prompt,
                         "Text to continue (default: start a new document); for a run on token files (llmc:, u16:), "
                         "token ids separated by spaces, and the output is ids too");
  sample_cmd->add_option("-n,--max-tokens", sample.max_tokens, "Tokens to generate at most")->capture_default_str();
  sample_cmd->add_option("-t,--temperature", sample.temperature, "Softmax temperature; 0 = greedy")->capture_default_str();
  sample_cmd->add_option("-k,--top-k", sample.top_k, "Sample among the k likeliest tokens; 0 = all")->capture_default_str();
  sample_cmd->add_option("--seed", sample.seed, "Sampling seed")->capture_default_str();
  sample_cmd->add_option("--threads", sample.threads, "CPU threads (default: all)")->check(CLI::Range(1, 1024));

  app::BenchModelArgs bench;
  auto* bench_cmd = cli.add_subcommand("bench", "Benchmarks that print figures");
  bench_cmd->require_subcommand(1);
  auto* bench_model_cmd = bench_cmd->add_subcommand(
      "model", "Forward+backward of one Gated DeltaNet layer on the CPU: chunked vs recurrent");
  bench_model_cmd->add_option("-p,--preset", bench.preset, "Hybrid preset giving the layer's sizes")->capture_default_str();
  bench_model_cmd->add_option("--lengths", bench.lengths, "Sequence lengths T")->delimiter(',')->capture_default_str();
  bench_model_cmd->add_option("--repeats", bench.repeats, "Timed runs per length (best reported)")->capture_default_str();
  bench_model_cmd->add_option("--threads", bench.threads, "CPU threads (default: all)")->check(CLI::Range(1, 1024));

  app::BenchGdrArgs bench_gdr;
  auto* bench_gdr_cmd = bench_cmd->add_subcommand(
      "gdr", "The chunked gated delta rule alone, forward and forward+backward: CUDA kernels vs ATen twins");
  bench_gdr_cmd->add_option("--batch", bench_gdr.batch, "Rows B")->capture_default_str();
  bench_gdr_cmd->add_option("--seq", bench_gdr.seq, "Row length T")->capture_default_str();
  bench_gdr_cmd->add_option("--heads", bench_gdr.heads, "Heads H")->capture_default_str();
  bench_gdr_cmd->add_option("--head-dim", bench_gdr.head_dim, "Key head size dk (and dv unless --value-dim)")
      ->capture_default_str();
  bench_gdr_cmd->add_option("--value-dim", bench_gdr.value_dim, "Value head size dv (default: --head-dim)");
  bench_gdr_cmd->add_option("--chunk", bench_gdr.chunk, "Chunk size C")->capture_default_str();
  bench_gdr_cmd->add_option("--dtype", bench_gdr.dtype, "bf16 | fp32 inputs")->capture_default_str();
  bench_gdr_cmd->add_option("--repeats", bench_gdr.repeats, "Timed runs (median reported)")->capture_default_str();
  bench_gdr_cmd->add_flag("--profile", bench_gdr.profile,
                          "Also print the default row's GPU time by component and kernel");
  bench_gdr_cmd->add_flag("--default-only", bench_gdr.default_only,
                          "Only the default row (the kernels as training runs them), e.g. under a profiler");
  bench_gdr_cmd->add_option("--chunk-decay", bench_gdr.chunk_decay,
                            "fast | exact: the front and the tail at fixed head sizes work out their masks' decays "
                            "by ex2.approx, or by expf (to measure it)")
      ->capture_default_str();

  app::BenchDataArgs bench_data;
  auto* bench_data_cmd = bench_cmd->add_subcommand("data", "The training data loader alone: tokens/s from a source");
  bench_data_cmd->add_option("--source", bench_data.sources, "A data.train source, e.g. llmc:/data/*.bin (repeatable)")
      ->required();
  bench_data_cmd->add_option("--tokenizer", bench_data.tokenizer, "byte | sentencepiece:PATH.model")->capture_default_str();
  bench_data_cmd
      ->add_option("--vocab", bench_data.vocab_size, "Vocabulary size (default: the tokenizer's; 65536 for token shards)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  bench_data_cmd->add_option("--threads", bench_data.threads, "Producer threads")->capture_default_str();
  bench_data_cmd->add_option("--seq-len", bench_data.seq_len, "Row length T")->capture_default_str();
  bench_data_cmd->add_option("--batch", bench_data.batch_size, "Rows per batch")->capture_default_str();
  bench_data_cmd->add_option("--seconds", bench_data.seconds, "How long to measure")->capture_default_str();
  bench_data_cmd->add_option("--exclude", bench_data.exclude, "Globs of files to skip");
  bench_data_cmd->add_option("--separator", bench_data.separator, "Text document separator line (\"\" = a document per file)");
  bench_data_cmd->add_option("--eot", bench_data.eot_token, "Token sources: the end-of-document id")->capture_default_str();

  app::BenchTrainArgs bench_train;
  auto* bench_train_cmd = bench_cmd->add_subcommand(
      "train", "The whole training step of a preset on random tokens: median step time, tokens/s, MFU, peak memory");
  bench_train_cmd->add_option("-p,--preset", bench_train.preset, "Model preset")->capture_default_str();
  bench_train_cmd->add_option("-f,--family", bench_train.family, "hybrid | gpt")->capture_default_str();
  bench_train_cmd->add_option("--precision", bench_train.precision, "fp32 | bf16 | fp16 | fp8")->capture_default_str();
  bench_train_cmd->add_option("--devices", bench_train.devices, "run.devices: auto, cpu, cpu:N, 0, 0,1, all")
      ->capture_default_str();
  bench_train_cmd->add_option("--steps", bench_train.steps, "Timed steps")->capture_default_str();
  bench_train_cmd->add_option("--warmup", bench_train.warmup, "Untimed steps first")->capture_default_str();
  bench_train_cmd->add_option("--batch", bench_train.batch_size, "Rows per rank")->capture_default_str();
  bench_train_cmd->add_option("--seq-len", bench_train.seq_len, "Row length T")->capture_default_str();
  bench_train_cmd->add_option("-s,--set", bench_train.overrides, "Override a config key: section.key=value");
  std::string gdr_scan_help = "The delta rule core:";
  for (const app::GdrScanChoice& c : app::gdr_scan_choices()) gdr_scan_help += std::string(" ") + c.value + ": " + c.what + ";";
  gdr_scan_help.back() = '.';
  bench_train_cmd->add_option("--gdr-scan", bench_train.gdr_scan, gdr_scan_help)->capture_default_str();
  bench_train_cmd->add_option("--row-kernels", bench_train.row_kernels,
                              "default | baseline | register-norm | warp-l2 | row-a-warp-norm | block-narrow-norm: the add+RMSNorm, "
                              "gated RMSNorm, L2Norm "
                              "and cross-entropy kernels as they are, or as they were before moving 4 columns per "
                              "load, keeping gated-norm rows in registers, staging bf16 logits rows and the gated "
                              "RMSNorm backward's rows in shared memory and giving the L2Norm half a warp per row "
                              "(to measure those changes); register-norm: as they are but the gated RMSNorm's "
                              "kernels a row a warp, its backward keeping its rows in registers instead of staging "
                              "them in shared memory; "
                              "warp-l2: as they are but the L2Norm taking a warp per row instead of half a warp; "
                              "row-a-warp-norm: as they are but the gated RMSNorm's 16-bit kernels taking a row a "
                              "warp instead of four; block-narrow-norm: as they are but narrow 16-bit RMSNorm rows "
                              "(MLA's latent norms) taking a block a row instead of four rows a warp")
      ->capture_default_str();
  bench_train_cmd->add_option("--sdpa", bench_train.sdpa,
                              "default | flash | cudnn: dense attention through LibTorch's pick (cuDNN on Hopper), "
                              "or forced to the flash or the cuDNN kernels (to compare them; packed batches always "
                              "take the flash varlen kernel)")
      ->capture_default_str();
  bench_train_cmd->add_option("--rope-qkv", bench_train.rope_qkv,
                              "fused | split: the GPT attention's RoPE (and QK-norm) on q and k as one autograd node whose "
                              "backward writes the q, k and v gradients into one tensor, or each on its own with "
                              "split's backward concatenating them (to measure the fusion)")
      ->capture_default_str();
  bench_train_cmd->add_option("--mla-qkv", bench_train.mla_qkv,
                              "fused | split: MLA's Q, K and V (RoPE'd, K's rope key for every head, V zero-padded) "
                              "from its projections in one kernel each way, or as RoPE, cat, expand and pad (to "
                              "measure the fusion)")
      ->capture_default_str();
  bench_train_cmd->add_option("--mla-values", bench_train.mla_values,
                              "auto | copied | padded: MLA attention hands V to cuDNN's kernels unpadded where they "
                              "run (dense rows where LibTorch picks cuDNN, packed rows on --packed-attention cudnn, "
                              "there as the K|V projection's own columns; the flash kernels get it zero-padded to "
                              "the q/k head width), unpadded but copied out of those columns, or pads it always (to "
                              "compare)")
      ->capture_default_str();
  bench_train_cmd->add_option("--mla-first-products", bench_train.mla_first_products,
                              "one-gemm | per-group: MLA's q latent and kv latent (with the rope key) from one GEMM "
                              "each way, or one GEMM a group with the input's gradient summed in the second (to "
                              "compare)")
      ->capture_default_str();
  bench_train_cmd->add_option("--split-gradients", bench_train.split_gradients,
                              "kernel | aten: a fused product's parts' gradients (the Gated DeltaNet's a|b, MLA's "
                              "latents) written into its gradient rows by one kernel, or by a copy a part (to "
                              "compare)")
      ->capture_default_str();
  bench_train_cmd->add_option("--packed-attention", bench_train.packed_attention,
                              "cudnn | flash: packed rows' attention on cuDNN's kernel through its frontend graphs "
                              "(V at its own width; flash where cuDNN refuses the shape), or on FlashAttention-2's "
                              "varlen kernel (to compare)")
      ->capture_default_str();
  bench_train_cmd->add_option("--weight-grads", bench_train.weight_grads,
                              "in-place | autograd: the linear layers' bf16 products write their weight gradients "
                              "straight into the fp32 gradients, or go through autocast with autograd casting and "
                              "accumulating bf16 weight gradients (to measure the change)")
      ->capture_default_str();
  bench_train_cmd->add_option("--weight-grad-stream", bench_train.weight_grad_stream,
                              "on | off: with in-place weight gradients, their GEMMs on a second stream overlapping "
                              "the backward, or on the backward's own stream (to measure the overlap)")
      ->capture_default_str();
  bench_train_cmd->add_option("--graph-gemms", bench_train.graph_gemms,
                              "no-workspace | workspace: in a step captured as a CUDA graph, the linear layers' GEMMs "
                              "run cuBLAS without its workspace (no semaphore memsets) or with it (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--state-products", bench_train.state_products,
                              "whole-row | tight | staged: the delta rule's products with the chunk states (16-bit path) "
                              "stage each operand only while a pass needs it, one block for all of a row's dk columns "
                              "(whole-row) or one for each half of dk (tight), or stage dh_next with dO from the start "
                              "(staged); the last two to measure them")
      ->capture_default_str();
  bench_train_cmd->add_option("--solve-overlap", bench_train.solve_overlap,
                              "on | off: the delta rule's solve backward at hybrid base's heads copies its next "
                              "panel while it computes on this one, or runs the general instance (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--chunk-copies", bench_train.chunk_copies,
                              "on | off: the delta rule's front at fixed head sizes takes q, k and v by 16-byte "
                              "asynchronous copies, or through registers (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--chunk-decay", bench_train.chunk_decay,
                              "fast | exact: the delta rule's front and tail at fixed head sizes work out their "
                              "masks' decays by ex2.approx, or by expf (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--weight-shadows", bench_train.weight_shadows,
                              "on | off: the linear layers multiply with bf16 copies of their weights that AdamW "
                              "writes as it updates them, or cast the fp32 weights in every forward (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--expert-weights", bench_train.expert_weights,
                              "in-place | autograd: MoE experts multiply with bf16 copies of their weights kept by "
                              "AdamW and write their weight gradients straight into .grad, or go through autocast and "
                              "autograd (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--moe-inputs", bench_train.moe_inputs,
                              "fused | separate: the MoE layer's input reaches its router, shared expert and routed "
                              "experts' rows in one pass, and their gradients come back summed in one pass, or as a "
                              "cast, a gather and two additions (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--moe-weights", bench_train.moe_weights,
                              "swiglu | combine: the MoE layer applies its router weights in the experts' SwiGLU, so "
                              "the combine is a plain sum whose backward is a gather, or in the combine (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--grad-norm", bench_train.grad_norm,
                              "producers | read: the clipping norm takes the sums of squares that the kernels writing "
                              "gradients (the MoE experts') computed as they wrote them, or reads every gradient again "
                              "(to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--expert-grads", bench_train.expert_grads,
                              "pieces | scatter: with one rank and one micro-batch a step, the MoE experts' weight "
                              "gradients stay in the bf16 pieces their product wrote and AdamW reads them there, or "
                              "they are written to fp32 .grad first (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--gdn-l2norm", bench_train.gdn_l2norm,
                              "in-front | in-core | separate: on a GPU the Gated DeltaNet's L2Norm of q and k runs "
                              "inside the delta rule's op (its backward in the rule's tail kernel), its forward in "
                              "the rule's front kernel or in the norm's own kernel, or as an op of its own (to "
                              "measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--gdn-gates", bench_train.gdn_gates,
                              "in-projection | apart: on a GPU under 16-bit autocast the Gated DeltaNet's a|b gate "
                              "projection shares the q|k|v|g product's GEMM, or runs its own (to measure it)")
      ->capture_default_str();
  bench_train_cmd->add_option("--gdn-output-wgrad", bench_train.gdn_output_wgrad,
                              "beside-scan | here | aside: the Gated DeltaNet's output projection's weight-gradient "
                              "GEMM put off until the delta rule's reverse scan and run beside it on the second stream "
                              "(beside-scan-8, -36: cuBLAS picks its kernel for that many SMs), or on the backward's "
                              "own stream, or on the second stream beside the gated norm's backward (to measure them)")
      ->capture_default_str();
  bench_train_cmd->add_option("--expert-grad-pieces", bench_train.expert_grad_pieces,
                              "auto | off | ROWS: the MoE experts' weight-gradient product cuts each expert's rows into "
                              "pieces of at most ROWS (auto: twice the mean rows per expert) so an overloaded expert's "
                              "GEMM tiles do not run long after the rest, or keeps one piece per expert (off)")
      ->capture_default_str();
  bench_train_cmd->add_option("--adamw", bench_train.adamw,
                              "ours | aten: the CUDA AdamW update as our multi-tensor kernel or ATen's fused one (to "
                              "measure the change)")
      ->capture_default_str();
  bench_train_cmd->add_option("--muon-kernels", bench_train.muon_kernels,
                              "ours | aten: with train.optimizer = \"muon\" on a GPU, its momenta and update as two "
                              "multi-tensor kernels or as ATen's ops (to measure the change)")
      ->capture_default_str();
  bench_train_cmd->add_option("--fp8-ffn", bench_train.fp8_ffn,
                              "fused | unfused: with --precision fp8, the SwiGLU feed-forward as one fp8 function "
                              "that quantises SwiGLU's activation and gradient as it computes them, or as its three "
                              "layers one by one (to measure the fusion)")
      ->capture_default_str();
  bench_train_cmd->add_option("--json", bench_train.json_path, "Also write the figures as JSON to this file");
  bench_train_cmd->add_flag("--profile", bench_train.profile,
                            "Then profile 3 more steps: GPU time per step by component and by kernel");
  bench_train_cmd->add_option("--profile-trace", bench_train.profile_trace,
                              "With --profile: save the profiler trace (chrome://tracing, Perfetto) here");
  bench_train_cmd->add_option("--profile-top", bench_train.profile_top, "With --profile: how many kernels to list")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}))
      ->capture_default_str();

  app::TokenizerTrainArgs tok_train;
  auto* tokenizer_cmd = cli.add_subcommand("tokenizer", "Train tokenizers");
  tokenizer_cmd->require_subcommand(1);
  auto* tok_train_cmd = tokenizer_cmd->add_subcommand("train", "Train a SentencePiece model on text files");
  tok_train_cmd->add_option("--input", tok_train.inputs, "Glob of text files, or jsonl:GLOB (repeatable)")->required();
  tok_train_cmd->add_option("--exclude", tok_train.exclude, "Glob of files to skip (repeatable)");
  tok_train_cmd->add_option("--separator", tok_train.separator,
                            "A line equal to this ends a document; \"\" = one per file; \"<blank>\" = blank lines")
      ->capture_default_str();
  tok_train_cmd->add_option("--vocab-size", tok_train.vocab_size, "Vocabulary size (>= 300)")->required();
  tok_train_cmd->add_option("--out", tok_train.out, "The .model file to write")->required();
  tok_train_cmd->add_option("--model-type", tok_train.model_type, "bpe | unigram")->capture_default_str();
  tok_train_cmd->add_flag("--force", tok_train.force, "Replace an existing --out model (and its .vocab)");

  app::ExportArgs export_args;
  auto* export_cmd = cli.add_subcommand("export", "Write a run's checkpoint as model.safetensors + config.json");
  export_cmd->add_option("run", export_args.run, "Run id, name or unique name prefix")->required();
  export_cmd->add_option("--step", export_args.step, "Checkpoint step (default: the newest)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  export_cmd->add_option("--out", export_args.out, "Folder to write (created)")->required();
  export_cmd->add_flag("--ema", export_args.ema, "Export the EMA weights instead of the live ones");
  export_cmd->add_flag("--force", export_args.force, "Replace model.safetensors and config.json already in --out");
  export_cmd->add_option("--runs-dir", export_args.runs_dir, "Folder of the run database")->capture_default_str();

#ifdef DD_HAVE_GUI
  app::GuiArgs gui;
  auto* gui_cmd = app::add_gui_command(cli, gui);
#endif

  app::read_integers_as_decimal(cli);
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  try {
#ifdef DD_HAVE_GUI
    // The desktop app: `gui`, `train` given a display (unless --no-gui), or no arguments at all.
    if (*gui_cmd) return app::run_gui(gui);
    // --dry-run and an explicit --log-format are headless requests whatever the display.
    const bool headless = train.dry_run || train.log_format != "auto";
    if (*train_cmd && !headless && app::gui_takes_train(train)) return app::run_gui_train(train);
    if (argc == 1 && app::display_available()) return app::run_gui(gui);
#endif
    if (*train_cmd) return app::run_train(train);
    if (*list_cmd) return app::runs_list(runs);
    if (*show_cmd) return app::runs_show(runs);
    if (*compare_cmd) return app::runs_compare(runs);
    if (*rexport_cmd) return app::runs_export(runs);
    if (*import_cmd) return app::runs_import(runs);
    if (*tag_cmd) return app::runs_tag(runs);
    if (*note_cmd) return app::runs_note(runs);
    if (*rename_cmd) return app::runs_rename(runs);
    if (*delete_cmd) return app::runs_delete(runs);
    if (*info_cmd) return app::model_info(info);
    if (*sample_cmd) return app::run_sample(sample);
    if (*bench_model_cmd) return app::bench_model(bench);
    if (*tok_train_cmd) return app::tokenizer_train(tok_train);
    if (*bench_data_cmd) return app::bench_data(bench_data);
    if (*bench_gdr_cmd) return app::bench_gdr(bench_gdr);
    if (*bench_train_cmd) return app::bench_train(bench_train);
    if (*export_cmd) return app::run_export(export_args);
  } catch (const std::exception& e) {
    std::cerr << "deltadeck: " << e.what() << "\n";
    return 1;
  }
  std::cout << cli.help();
#ifdef DD_HAVE_GUI
  std::cout << "\nNo display here (DISPLAY and WAYLAND_DISPLAY are unset), so no desktop app. Run headless with:\n"
               "  deltadeck train --no-gui          (the terminal dashboard, or plain log lines when piped)\n"
               "  deltadeck runs list               (past runs)\n";
#else
  std::cout << "\nThis build has no desktop app (built with -DDELTADECK_GUI=OFF). Run headless with:\n"
               "  deltadeck train --no-gui\n";
#endif
  return 0;
}

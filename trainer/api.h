// The trainer's public face, with no torch in it: the typed run configuration, the events a
// run emits and the commands it accepts. ui/ and app/ see only this header (and storage types),
// so they compile in seconds and never touch trainer memory.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "model/model_config.h"

namespace trainer {

// [data] as users write it (ARCHITECTURE.md "The config, as users write it").
struct DataConfig {
  std::vector<std::string> train;        // sources: text:GLOB | jsonl:GLOB | llmc:GLOB | u16:GLOB
  std::vector<double> weights;           // sampling weight per train source; empty = by document count
  std::vector<std::string> exclude;      // globs of files to skip (e.g. "*.dat")
  std::string separator = "%";           // a line equal to this ends a document; "" = one document per file;
                                         // "<blank>" = blank lines end a document
  std::string text_field = "text";       // jsonl: the field holding the document text
  int64_t eot_token = 50256;             // token shards: the id that ends a document
  std::string tokenizer = "byte";        // byte | sentencepiece:PATH.model
  double val_fraction = 0.01;            // data.val as a number: share of documents held out
  std::vector<std::string> val_sources;  // data.val as a list: separate validation sources
  bool document_attention = true;        // pass document boundaries (cu_seqlens) to the model
  bool mask_boundary_labels = false;     // ignore the label that crosses from one document into the next
  int64_t loader_threads = 2;            // producer threads
  int64_t prefetch = 4;                  // ready batches queued ahead of the step loop
};

// [train]
struct TrainConfig {
  int64_t steps = 2000;
  int64_t batch_size = 16;               // sequences per micro-batch
  int64_t seq_len = 256;
  int64_t grad_accum = 1;
  // Progressive phases "TOKENS:SEQ_LENxBATCH" (e.g. "0:256x32", "50e6:1024x8"): from that many
  // training tokens on, rows are SEQ_LEN long and micro-batches BATCH rows. Empty = one phase of
  // seq_len × batch_size. The first phase must start at 0.
  std::vector<std::string> phases;
  // auto | fp32 | bf16 | fp16 (autocast) | fp8 (linears in float8, bf16 elsewhere). auto: bf16 where
  // every rank's device is a GPU that has it (compute capability 8.0+), else fp32; resolve_config
  // (trainer/session.h) records which, so a resume trains as the run began.
  std::string precision = "auto";
  std::string optimizer = "adamw";
  double lr = 3e-3;
  double lr_final_frac = 0.1;            // cosine decays to lr * lr_final_frac
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  std::string schedule = "cosine";       // cosine | wsd (warmup, hold, linear decay over the last 20%) | constant
  int64_t warmup_steps = 100;
  double grad_clip = 1.0;                // 0 turns clipping off
  double ema_decay = 0.0;
  double muon_lr = 0.02;                 // optimizer = "muon": peak lr of the hidden matrices (scheduled like lr)
  // optimizer = "muon": Muon also takes each MoE expert's matrices (one Newton–Schulz iteration
  // batched over the experts), else AdamW does. Off by default: the iteration's cost grows with
  // every expert's weights while the step's work grows with the routed tokens only (moe-1b: about
  // 5 TFLOP of products a step).
  bool muon_experts = false;
  // optimizer = "muon": the Newton–Schulz iteration's dtype: auto (bf16 on a GPU, fp32 on the CPU),
  // bf16 or fp32.
  std::string muon_precision = "auto";
  std::string loss_scaling = "auto";     // auto (dynamic for fp16 only) | dynamic | off
  double loss_scale_init = 65536.0;
  int64_t loss_scale_growth_interval = 2000;
  int64_t eval_batches = 20;             // validation batches per evaluation
  // μP-style learning rates: when > 0, the hidden matrices (2-D weights inside the blocks) train at
  // lr × mup_base_width / model.d, so a width tuned at the base width transfers; embeddings,
  // norms and gates keep lr. 0 = off.
  int64_t mup_base_width = 0;
  // A step whose loss or gradients are not finite (docs/reliability.md):
  //   skip  its update is skipped on every rank (weights and optimizer state untouched), decided
  //         before the update: on a GPU that reads the loss and grad norm back within the step
  //         (one host synchronisation per step, which loss scaling pays anyway);
  //   fail  the run fails naming the step, the values read one step late (no synchronisation);
  //   auto  skip on the CPU and whenever loss scaling is on, fail on a GPU otherwise.
  std::string nonfinite = "auto";
  // After this many skipped steps in a row (non-finite, or spikes with spike_action = "skip") the
  // run stops with status "diverged" (exit code 3) instead of skipping forever. 0 = never.
  int64_t max_nonfinite_steps = 20;
  // Loss spikes: a finite loss more than spike_zscore standard deviations above the mean of the
  // last spike_window finite losses (after warmup_steps) is flagged, and with spike_action =
  // "skip" its update is skipped like a non-finite one. The window is saved in checkpoints.
  double spike_zscore = 6.0;             // 0 turns detection off
  int64_t spike_window = 100;
  std::string spike_action = "flag";     // flag | skip
  // The training step (forward, backward, clipping, AdamW or Muon, EMA) captured once as a CUDA graph
  // and replayed, which removes the host's kernel launches from every step:
  //   auto  when the run allows it (one GPU, no loss scaling, MoE only in bf16 on sm90/sm100,
  //         no train.phases, and packed batches with Gated DeltaNet layers only where their state
  //         scan runs as its kernel; trainer/step_graph_policy.h), else
  //         the step runs eagerly and the log says why;
  //   on    the same, but a run that does not allow it fails at start naming the reason;
  //   off   never.
  std::string cuda_graph = "auto";
  // Packed batches in a captured step: room for this many document pieces per micro-batch (its
  // cu_seqlens padded to that length; a batch with more runs eagerly). 0 = 1.5 × the first batch's
  // pieces, at least 2 · batch_size. More room costs the attention kernels time on empty pieces,
  // and the Gated DeltaNet layers one spare (empty) chunk per piece beyond one a row.
  int64_t cuda_graph_pieces = 0;
};

// [run]
struct RunSection {
  std::string devices = "auto";          // auto (GPU 0 if any, else CPU) | cpu | cpu:N (N CPU ranks) |
                                         // all (every GPU) | "0,1,..." (those GPUs): one rank per device
  std::string runs_dir = "runs";
  // Where the run's folder (its checkpoints) goes: "" keeps it beside the database,
  // <runs_dir>/<name>. A multi-node run sets it to a folder every node sees at the same path, so
  // the database can stay on node 0's own disk (it is refused on a network file system) while every
  // node can read the checkpoint a resume starts from.
  std::string checkpoint_dir;
  int64_t log_interval = 10;
  int64_t eval_interval = 200;           // 0: only at the end
  int64_t save_interval = 500;           // 0: only at the end
  int64_t keep_checkpoints = 3;
  int64_t threads = 0;                   // ATen CPU threads; 0 = every core (the loader's producers
                                         // mostly sleep on a full queue)
  double collective_timeout_s = 600;     // a collective (gradient all-reduce, ...) waiting longer fails the run
  int64_t bucket_mb = 25;                // gradients are all-reduced in flat buckets of about this size
  bool zero1 = false;                    // ZeRO-1: AdamW's state sharded across the ranks
  double peak_tflops = 0;                // the device's peak for MFU; 0 = the known dense peak of the GPU
                                         // for the precision (bf16, or fp8), none on the CPU
  // A checkpoint that cannot be written (a full disk): retried this many times, save_retry_delay_s
  // apart, before the run stops as failed; the previous checkpoint stays the resume target.
  int64_t save_retries = 0;
  double save_retry_delay_s = 5;
};

struct RunConfig {
  std::string name = "run";
  uint64_t seed = 1337;
  model::ModelConfig model;              // preset resolved, overrides applied; vocab 0 = from tokenizer
  DataConfig data;
  TrainConfig train;
  RunSection run;
};

// ---- events: trainer -> app (values only, never tensors or pointers into trainer memory)

// Preempted: stopped (with a checkpoint) because the launcher said the job is being preempted
// (SIGTERM under Slurm, or DELTADECK_PREEMPTIBLE=1). Diverged: stopped after
// train.max_nonfinite_steps skipped steps in a row. Both are additive to the original four.
enum class RunStatus { Running, Finished, Stopped, Failed, Preempted, Diverged };
const char* status_name(RunStatus s);

struct MetricsEvent {
  int64_t step = 0;
  int64_t tokens = 0;   // tokens seen so far
  double wall_s = 0;    // seconds since the run started
  std::vector<std::pair<std::string, double>> values;
};
struct CheckpointEvent {
  int64_t step = 0;
  std::string path;     // directory of the checkpoint, an absolute path
  int64_t bytes = 0;
  std::string sha256;   // of the weights file
  std::vector<int64_t> pruned;  // steps whose checkpoints this save's pruning removed from disk
};
struct LogEvent {
  int64_t step = 0;
  std::string level;    // info | warn | error
  std::string text;
};
struct StartedEvent {
  int64_t params = 0;
  int64_t vocab_size = 0;
  std::string device;
};
struct EndedEvent {
  RunStatus status = RunStatus::Finished;
  int64_t step = 0;
  std::string message;
};
// Never emitted by the engine: a marker a front end queues behind the engine's events on the same
// channel to learn when it has handled every event before it (app::RunHost waits for one before a
// checkpoint is committed). Front ends that did not queue one never see one.
struct MarkerEvent {
  uint64_t id = 0;
};
// The run's recorded name, on the nodes other than 0 of a multi-node run (node 0 sends it at the
// rendezvous): node 0 may have recorded the run under another name than the config's (the name
// was taken), and a node names its log after the run.
struct RunNamedEvent {
  std::string name;
};
using Event =
    std::variant<StartedEvent, MetricsEvent, CheckpointEvent, LogEvent, EndedEvent, MarkerEvent, RunNamedEvent>;

// ---- commands: app -> trainer, applied at the next step boundary
// Preempt: Stop, ending with status Preempted (the launcher is taking the machine back).
enum class Command { Pause, Resume, SaveNow, Stop, Preempt };

}  // namespace trainer

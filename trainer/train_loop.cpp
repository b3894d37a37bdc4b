// The step loop, in the order torchtitan's train() reads: load the checkpoint, then while
// training should continue: poll commands, step, maybe log, maybe evaluate, maybe checkpoint.
// The run trains on one device (run.devices); batches arrive pinned and are copied asynchronously.
// A step's loss and grad norm stay on the device and are read one step later (StepValues), so the
// host queues step s+1 while the GPU still computes step s; only the step guard's decision reads
// back within the step, and only where it is free or asked for (CPU ranks, loss scaling, which reads
// back anyway, or train.nonfinite / train.spike_action = "skip"; see decide_in_step_).
// Reliability (docs/reliability.md): a step with a non-finite loss or gradient, or a loss spike, is
// judged by StepGuard from all-reduced values, so every rank skips the same steps; saves go through
// storage::checkpoint_io() (observable and fault-injectable) and are retried as run.save_retries
// says; a stop, a preemption and a divergence end the run at a step boundary every rank agrees on.
#include "trainer/train_loop.h"

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <ATen/DeviceAccelerator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <deque>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "model/decoder_lm.h"
#include "model/fp8_linear.h"
#include "model/expert_grads_in_pieces.h"
#include "model/grad_square_sums.h"
#include "model/linear.h"
#include "model/mixed_linear.h"
#include "kernels/gdr_scan.h"
#include "storage/file_util.h"
#include "model/moe.h"
#include "model/weight_shadow.h"
#include "trainer/adamw.h"
#include "trainer/checkpoint.h"
#include "trainer/comm.h"
#include "trainer/config.h"
#include "trainer/data/loader.h"
#include "trainer/device.h"
#include "trainer/ema.h"
#include "trainer/fp8_checkpoint.h"
#include "trainer/grad_clip.h"
#include "trainer/loss_scaler.h"
#include "trainer/muon.h"
#include "trainer/param_groups.h"
#include "trainer/lr_schedule.h"
#include "trainer/precision.h"
#include "trainer/fault_inject.h"
#include "trainer/grad_buckets.h"
#include "trainer/graph_inputs.h"
#include "trainer/resume_check.h"
#include "trainer/step_graph.h"
#include "trainer/step_graph_policy.h"
#include "trainer/step_guard.h"
#include "trainer/step_profile.h"
#include "trainer/zero1.h"

namespace trainer {

namespace {

using Clock = std::chrono::steady_clock;

// A double as text that parses back to the same value (scaler state in checkpoint metadata).
std::string format_exact(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// "12.3" for messages.
std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

LossScalerOptions scaler_options(const TrainConfig& t) {
  LossScalerOptions o;
  o.enabled = loss_scaling_enabled(t.loss_scaling, t.precision);
  o.init_scale = t.loss_scale_init;
  o.growth_interval = t.loss_scale_growth_interval;
  return o;
}

// The global RNG is shared by the rank threads: seeding and drawing the initial weights happen
// under this lock so every rank builds the same model (rank 0's is broadcast anyway).
std::mutex init_mutex;

// What rank 0 tells every rank at a step boundary.
enum StepDecision : int64_t { kContinue = 0, kSaveNow = 1, kStop = 2, kPausedTick = 3, kPreempt = 4 };

StepGuardOptions guard_options(const TrainConfig& t) {
  StepGuardOptions o;
  o.zscore = t.spike_zscore;
  o.window = t.spike_window;
  o.skip_spikes = t.spike_action == "skip";
  o.max_skipped = t.max_nonfinite_steps;
  o.warmup_steps = t.warmup_steps;
  return o;
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "; ") + s;
  return out;
}

class TrainLoop {
 public:
  TrainLoop(const RunConfig& cfg, const SessionOptions& opts, Channel<Event>& events, Channel<Command>& commands,
            RunProgress& progress, const RankContext& rank)
      : cfg_(cfg), opts_(opts), events_(events), commands_(commands), progress_(progress), rank_(rank),
        comm_(*rank.comm), lead_(rank.comm->rank() == 0), guard_(guard_options(cfg.train)) {}

  // The linear layers' bf16 weight shadows (model/weight_shadow.h) go with the run's weights.
  ~TrainLoop() {
    std::vector<at::Tensor> weights;
    for (const auto& [n, p] : params_) weights.push_back(p);
    model::release_weight_shadows(weights);
  }
  TrainLoop(const TrainLoop&) = delete;
  TrainLoop& operator=(const TrainLoop&) = delete;

  EndedEvent run() {
    const int64_t threads = cfg_.run.threads > 0
                                ? cfg_.run.threads
                                : std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
    at::set_num_threads(static_cast<int>(threads));
    const int world = comm_.world();
    fault_point("start", comm_.rank(), 0);
    // A resumed run reads its checkpoint first: the loader starts from the position saved there.
    // Shared with this process's other ranks (one copy in host memory), and let go after restore().
    std::shared_ptr<const CheckpointData> resume;
    std::string loader_state;
    if (!opts_.resume_from.empty()) {
      // Shape, vocabulary, dtype and world size from the manifest alone, before a tensor is read.
      const auto mismatches = resume_mismatches(read_compat(opts_.resume_from), resume_fingerprint(cfg_, world));
      if (!mismatches.empty())
        throw std::runtime_error(opts_.resume_from + ": cannot be resumed by this run: " + join_lines(mismatches));
      resume = load_checkpoint_shared(opts_.resume_from);
      const int saved_world = resume->meta.count("world_size") ? std::stoi(resume->meta.at("world_size")) : 1;
      if (saved_world != world)
        throw std::runtime_error(opts_.resume_from + ": written by " + std::to_string(saved_world) +
                                 " ranks, this run has " + std::to_string(world) +
                                 " (run.devices); each rank's data position cannot be carried over");
      const std::string key = world == 1 ? "loader.state" : "loader.state." + std::to_string(comm_.rank());
      auto it = resume->meta.find(key);
      if (it == resume->meta.end())
        throw std::runtime_error(opts_.resume_from + "/state.safetensors: no " + key + " (written by an older "
                                 "deltadeck); it cannot be resumed exactly");
      loader_state = it->second;
    }
    loader_ = std::make_unique<data::Loader>(cfg_, comm_.rank(), world, loader_state);
    device_ = rank_.device;
    {
      std::lock_guard<std::mutex> lock(init_mutex);
      torch::manual_seed(cfg_.seed);
      model_ = model::DecoderLM(cfg_.model);
    }
    model_->to(device_);
    if (world > 1) {
      // Every rank starts from rank 0's weights.
      torch::NoGradGuard no_grad;
      std::vector<at::Tensor> weights;
      for (const auto& p : model_->parameters()) weights.push_back(p.data());
      comm_.broadcast(weights, 0, "broadcasting rank 0's initial weights");
    }
    // Parameter groups: the hidden matrices (and with train.muon_experts the MoE experts' stacks)
    // go to Muon (optimizer = "muon"), or the hidden matrices, with μP learning rates on, to their
    // own AdamW at the scaled lr; everything else to the main AdamW.
    std::vector<std::pair<std::string, at::Tensor>> adam_params, hidden_params;
    std::vector<bool> decay, hidden_decay;
    const bool use_muon = cfg_.train.optimizer == "muon";
    const bool mup = cfg_.train.mup_base_width > 0;
    hidden_lr_mult_ = mup ? static_cast<double>(cfg_.train.mup_base_width) / static_cast<double>(cfg_.model.d)
                          : 1.0;
    for (const auto& item : model_->named_parameters()) {
      params_.emplace_back(item.key(), item.value());
      const int64_t dim = item.value().dim();
      const bool hidden = use_muon ? takes_muon(item.key(), dim, cfg_.train.muon_experts)
                                   : mup && is_hidden_matrix(item.key(), dim);
      if (hidden) {
        hidden_params.emplace_back(item.key(), item.value());
        hidden_decay.push_back(true);
      } else {
        adam_params.emplace_back(item.key(), item.value());
        decay.push_back(gets_weight_decay(item.key(), item.value().dim()));
      }
    }
    const AdamWOptions adam_opts{cfg_.train.beta1, cfg_.train.beta2, cfg_.train.eps, cfg_.train.weight_decay};
    if (cfg_.run.zero1 && world > 1) {
      zero_ = std::make_unique<ShardedAdamW>(adam_params, decay, adam_opts, comm_);
    } else {
      if (world > 1) {
        std::vector<at::Tensor> all;
        for (const auto& [n, p] : params_) all.push_back(p);
        buckets_ = std::make_unique<GradBuckets>(all, std::max<int64_t>(1, cfg_.run.bucket_mb) * 1024 * 1024, comm_);
      }
      opt_ = std::make_unique<AdamW>(adam_params, decay, adam_opts);
    }
    // One rank: nothing hooks the weights' gradient accumulation, so the bf16/fp16 products may
    // write their weight gradients into .grad themselves (model/mixed_linear.h). With several ranks
    // the gradient buckets' hooks must see every gradient arrive.
    weight_grads_in_place_ = world == 1 && device_.is_cuda();
    if (use_muon) {
      const bool ns_bf16 = cfg_.train.muon_precision == "bf16" ||
                           (cfg_.train.muon_precision == "auto" && device_.is_cuda());
      muon_ = std::make_unique<Muon>(hidden_params, MuonOptions{0.95, true, 5, cfg_.train.weight_decay,
                                                                ns_bf16 ? at::kBFloat16 : at::kFloat});
    } else if (mup) {
      opt_hidden_ = std::make_unique<AdamW>(hidden_params, hidden_decay, adam_opts);
    }
    scaler_ = std::make_unique<LossScaler>(scaler_options(cfg_.train));
    // Kernels that write gradients may hand the clipping norm their sums of squares when nothing
    // changes the gradients between backward and the norm: no all-reduce (one rank, no ZeRO-1), no
    // unscaling (model/grad_square_sums.h).
    grad_square_sums_from_producers_ = world == 1 && !zero_ && device_.is_cuda() && !scaler_->enabled();
    // The experts' gradients may stay in their bf16 pieces when, besides that, our AdamW alone reads
    // them, after the norm, with the clip in its update, and one backward makes them
    // (model/expert_grads_in_pieces.h).
    expert_grads_in_pieces_ = grad_square_sums_from_producers_ && clip_in_update() && cfg_.train.grad_accum == 1;
    // Skip decisions are taken inside the step (before the update) where reading the loss and the
    // grad norm back costs nothing (CPU), is paid already (the loss scaler reads back), or is asked
    // for; on a GPU otherwise the values are judged one step late and a non-finite loss fails the run.
    nonfinite_skips_ = cfg_.train.nonfinite == "skip" ||
                       (cfg_.train.nonfinite == "auto" && (!device_.is_cuda() || scaler_->enabled()));
    decide_in_step_ = !device_.is_cuda() || scaler_->enabled() || cfg_.train.nonfinite == "skip" ||
                      cfg_.train.spike_action == "skip";
    if (cfg_.train.ema_decay > 0) ema_ = std::make_unique<Ema>(params_, cfg_.train.ema_decay);
    if (!opts_.resume_from.empty()) {
      // The optimizer's, EMA's, scaler's and guard's loaders name what is missing, not where: the
      // checkpoint is added here (messages that already name it are left as they are).
      try {
        restore(*resume, opts_.resume_from);
      } catch (const std::exception& e) {
        const std::string what = e.what();
        if (what.find(opts_.resume_from) != std::string::npos) throw;
        throw std::runtime_error(opts_.resume_from + ": " + what);
      }
      resume.reset();  // every tensor was copied into the model, optimizer and EMA
    }
    // The experts run in bf16 under bf16 autocast, in fp32 in fp32 runs (fp16 scales losses, which
    // blocks the graph anyway). fp8 runs are judged as fp32 here, which can only keep an fp8 MoE step
    // out of the graph, never put a host read into one.
    const bool moe_on_device = model::MoEImpl::counts_stay_on_device(
        cfg_.model, device_, cfg_.train.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32);
    const std::string graph_blocker =
        step_graph_blocker(cfg_, StepGraphFacts{device_.is_cuda(), world, scaler_->enabled(), decide_in_step_,
                                                std::getenv("DELTADECK_FAULT") != nullptr, moe_on_device,
                                                kernels::gdr_scan_supports(cfg_.model.gdn_chunk, cfg_.model.gdn_dk)});
    if (graph_blocker.empty()) {
      graph_ = std::make_unique<StepGraph>(device_.index());
    } else if (cfg_.train.cuda_graph == "on") {
      throw std::runtime_error("train.cuda_graph = \"on\", but the step cannot be captured: " + graph_blocker);
    } else if (device_.is_cuda() && cfg_.train.cuda_graph == "auto") {
      log("info", "CUDA graph step off: " + graph_blocker);
    }
    loader_state_ = loader_state;

    int64_t n_params = 0;
    for (const auto& [n, p] : params_) n_params += p.numel();
    std::string where = describe_device(device_);
    if (world > 1) where = std::to_string(world) + " ranks (" + (device_.is_cuda() ? "NCCL" : "Gloo") + "), rank 0 on " + where;
    push(StartedEvent{n_params, cfg_.model.vocab_size, where});
    peak_tflops_ = cfg_.run.peak_tflops > 0 ? cfg_.run.peak_tflops : known_peak_tflops(device_, cfg_.train.precision);
    flops_per_token_ = static_cast<double>(model::flops_per_token(cfg_.model));
    const auto& ds = loader_->stats();
    log("info", "data: " + std::to_string(ds.train_documents) + " train documents, " +
                    std::to_string(ds.val_documents) + " validation documents (" + std::to_string(ds.val_tokens) +
                    " tokens in " + std::to_string(loader_->validation().size()) + " batches)");
    if (!ds.resume_note.empty()) log("warn", ds.resume_note);
    if (step_ > 0) log("info", "resumed from " + opts_.resume_from + " at step " + std::to_string(step_));

    t_start_ = Clock::now();
    wall_offset_ = wall_at_resume_;
    if (lead_) {
      progress_.step = step_;
      progress_.tokens = tokens_;
      progress_.wall_s = wall();
      progress_.known = true;
    }
    t_last_log_ = Clock::now();
    tokens_at_last_log_ = tokens_;
    const int64_t total = cfg_.train.steps;
    while (step_ < total) {
      if (const int64_t d = agree_on_commands(); d != kContinue) {
        const bool preempted = d == kPreempt;
        save(preempted ? "preempted" : "stop requested");
        return {preempted ? RunStatus::Preempted : RunStatus::Stopped, step_,
                preempted ? "preempted (the launcher asked this job to stop)" : "stopped by request"};
      }
      profile_boundary();
      train_step();  // queues this step's values; the previous step's are read below
      if (!diverged_.empty()) {
        // Every rank judged the same all-reduced values, so every rank ends here at this step. No
        // checkpoint: the last one holds the weights before the skipped steps.
        settle_step_values();
        return {RunStatus::Diverged, step_, diverged_};
      }
      if (lead_) {
        progress_.step = step_;
        progress_.tokens = tokens_;
        progress_.wall_s = wall();
      }
      const bool last = step_ == total;
      const bool eval_now = !opts_.measure_only && ((cfg_.run.eval_interval > 0 && step_ % cfg_.run.eval_interval == 0) || last);
      const bool save_now = !opts_.measure_only && ((cfg_.run.save_interval > 0 && step_ % cfg_.run.save_interval == 0) || last);
      // Read the previous step's values (the GPU is busy with this one); evaluation and saving read
      // this step's too, first.
      settle_step_values(/*keep_newest=*/!last);
      if (eval_now) evaluate();
      if (save_now) save("");
    }
    settle_step_values();
    profile_boundary();
    return {RunStatus::Finished, step_, "completed " + std::to_string(step_) + " steps"};
  }

 private:
  // Events come from rank 0 only (every rank holds the same reduced values).
  void push(Event e) {
    if (lead_) events_.push(std::move(e));
  }

  // Rank 0 reads the command channel; every rank then acts on its decision at the same step
  // boundary. While paused, rank 0 sends a tick every second so the others never reach the
  // collective timeout. Returns kContinue, or kStop / kPreempt when the run must end.
  int64_t agree_on_commands() {
    forward_stop_to_node0();
    for (;;) {
      int64_t decision = kContinue;
      if (lead_) decision = next_decision();
      if (comm_.world() > 1) {
        // Through the store, not a collective: a device broadcast read back on the host would make
        // every step wait for the previous one to finish on the GPU.
        const std::string key = "cmd/" + std::to_string(step_) + "/" + std::to_string(command_round_);
        const std::string forget = command_keys_.size() >= 64 ? command_keys_.front() : "";
        decision = std::stoll(comm_.broadcast_text(key, std::to_string(decision), forget));
        command_keys_.push_back(key);
        if (!forget.empty()) command_keys_.pop_front();
        ++command_round_;
      }
      switch (decision) {
        case kContinue: return kContinue;
        case kStop: return kStop;
        case kPreempt: return kPreempt;
        case kSaveNow: save("save requested"); break;
        case kPausedTick: break;
      }
    }
  }

  // Several nodes: only node 0's rank 0 decides, but a launcher may signal one node alone. The first
  // rank of every other node passes a stop its process received on to node 0 through the store.
  void forward_stop_to_node0() {
    const int nodes = static_cast<int>(opts_.cluster.nnodes);
    if (nodes <= 1 || lead_ || comm_.rank() % (comm_.world() / nodes) != 0 || stop_forwarded_) return;
    while (auto cmd = commands_.try_pop()) {
      if (*cmd != Command::Stop && *cmd != Command::Preempt) continue;  // pause and save-now are node 0's to give
      comm_.raise_flag("stop", std::string(*cmd == Command::Preempt ? "preempt: " : "") + "node " +
                                   std::to_string(opts_.cluster.node_rank));
      stop_forwarded_ = true;
      return;
    }
  }

  // Rank 0: the next decision from the queued commands. Blocks at most a second while paused.
  int64_t next_decision() {
    if (opts_.poll_stop) {
      if (const std::optional<Command> c = opts_.poll_stop(); c && (*c == Command::Stop || *c == Command::Preempt)) {
        if (!stop_polled_)
          log("info", std::string(*c == Command::Preempt ? "preemption" : "stop") + " signal: stopping at step " +
                          std::to_string(step_));
        stop_polled_ = true;
        return *c == Command::Preempt ? kPreempt : kStop;
      }
    }
    if (opts_.cluster.nnodes > 1) {
      if (auto who = comm_.flag("stop")) {
        const bool preempt = who->rfind("preempt: ", 0) == 0;
        log("info", std::string(preempt ? "preemption" : "stop") + " requested on " + who->substr(preempt ? 9 : 0));
        return preempt ? kPreempt : kStop;
      }
    }
    for (;;) {
      std::optional<Command> cmd =
          paused_ ? commands_.pop_for(std::chrono::seconds(1)) : commands_.try_pop();
      if (!cmd) {
        if (paused_ && commands_.closed()) return kStop;
        return paused_ ? kPausedTick : kContinue;
      }
      switch (*cmd) {
        case Command::Pause:
          if (!paused_) {
            log("info", "paused at step " + std::to_string(step_));
            paused_at_ = Clock::now();
          }
          paused_ = true;
          break;
        case Command::Resume:
          if (paused_) {
            log("info", "resumed at step " + std::to_string(step_));
            // The pause is not training time: the next logged tokens/s covers the steps alone.
            t_last_log_ += Clock::now() - paused_at_;
          }
          paused_ = false;
          break;
        case Command::SaveNow:
          return kSaveNow;
        case Command::Stop:
          return kStop;
        case Command::Preempt:
          return kPreempt;
      }
    }
  }

  // One optimizer step. Its loss, aux loss and grad norm are queued to the host (StepValues) and
  // read by settle_step_values, at the latest one step later.
  void train_step() {
    if (graph_mode()) return train_step_graphed();
    fault_point("step", comm_.rank(), step_);
    const auto t0 = Clock::now();
    const double lr = lr_at(cfg_.train, step_);
    at::Tensor loss_sum, aux_sum;  // on the device
    StepData fed;  // this step's batches, as the host counts them
    const int rank = comm_.rank();
    const int64_t number = step_ + 1;  // this step as logged and checkpointed
    model::GradSquareSumsScope square_sums(device_, grad_square_sums_from_producers_);  // through the norm
    model::ExpertGradsInPiecesScope expert_pieces(device_, expert_grads_in_pieces_);   // through the update
    for (int64_t micro = 0; micro < cfg_.train.grad_accum; ++micro) {
      data::Batch b = loader_->next(&fed.wait_s);
      if (micro == 0) fault_point("forward", rank, number);
      auto parts = forward(b);
      inject_data_faults(parts, number);
      auto loss = parts.total / static_cast<double>(cfg_.train.grad_accum);
      // Data parallel: the last micro-step's backward starts averaging each bucket as it fills.
      if (buckets_ && micro == cfg_.train.grad_accum - 1) buckets_->arm();
      if (micro == 0) fault_point("backward", rank, number);
      scaler_->scale_loss(loss).backward();
      auto ce = parts.ce.detach().to(torch::kFloat64) / static_cast<double>(cfg_.train.grad_accum);
      auto aux = parts.aux.detach().to(torch::kFloat64) / static_cast<double>(cfg_.train.grad_accum);
      loss_sum = loss_sum.defined() ? loss_sum + ce : ce;
      aux_sum = aux_sum.defined() ? aux_sum + aux : aux;
      consume(b, fed);
    }
    model::join_weight_grad_stream(device_);  // the weight gradients' GEMMs (model/mixed_linear.h)
    record(fed);
    int64_t step_tokens = fed.tokens;
    auto losses = torch::stack({loss_sum.reshape({}), aux_sum.to(loss_sum.device()).reshape({})});
    if (comm_.world() > 1) {
      if (buckets_) buckets_->finish();  // ZeRO-1 reduce-scatters inside its step
      std::vector<at::Tensor> t{losses};
      comm_.all_reduce_sum(t, "averaging the loss");
      losses = t[0] / static_cast<double>(comm_.world());
      step_tokens *= comm_.world();
    }
    std::vector<torch::Tensor> grads_of;
    for (auto& [n, p] : params_) grads_of.push_back(p);
    const double max_norm = cfg_.train.grad_clip > 0 ? cfg_.train.grad_clip : INFINITY;
    bool found_inf = false;
    at::Tensor grad_norm;
    std::optional<StepVerdict> verdict;  // set when decided within the step
    if (zero_) {
      // Averaging, unscaling, the inf/NaN check, clipping and the update, on this rank's slice. A
      // loss that must be skipped is known before (the loss is all-reduced already): every rank then
      // leaves the optimizer alone, so ZeRO-1's collectives stay matched.
      double loss_host = 0;
      bool skip_before = false;
      if (decide_in_step_) {
        loss_host = losses[0].item<double>();
        skip_before = guard_.loss_skips(number, loss_host);
      }
      fault_point("optimizer", rank, number);
      if (skip_before) {
        found_inf = !std::isfinite(loss_host);  // the scaler backs off for a non-finite loss
        grad_norm = torch::tensor(NAN, torch::kFloat64);  // not computed
        // A finite stand-in for the norm, so a spike is recorded as a spike, not as non-finite.
        verdict = guard_.record(number, loss_host, std::isfinite(loss_host) ? 0.0 : NAN);
      } else {
        // Checked (a read-back) only where the step is decided within it, as without ZeRO-1.
        const auto r = zero_->step(lr, scaler_->enabled() ? scaler_->scale() : 1.0, max_norm, decide_in_step_);
        found_inf = r.found_inf;
        grad_norm = r.grad_norm_tensor;
        if (decide_in_step_) verdict = guard_.record(number, loss_host, r.grad_norm, scaler_backoff(r.found_inf));
        if (!found_inf && ema_) ema_->update();
      }
    } else {
      // Unscale before clipping; a non-finite gradient skips the update (weights untouched).
      found_inf = scaler_->enabled() && scaler_->unscale_and_check(grads_of);
      // The norm is reported before clipping; a clip of 0 only measures it. Clipping a non-finite
      // gradient scrambles it, which does not matter: such a step is skipped and its gradients zeroed.
      at::Tensor clip_divisor;  // clipping folded into the fused AdamW, when it is the only optimizer
      if (found_inf) grad_norm = torch::tensor(INFINITY, torch::kFloat64);
      else if (clip_in_update()) std::tie(grad_norm, clip_divisor) = grad_norm_and_clip_divisor_async(grads_of, max_norm);
      else grad_norm = clip_grad_norm_async(grads_of, max_norm);
      bool skip = found_inf;
      if (decide_in_step_) {
        // The step's one read-back: loss and grad norm, both identical on every rank.
        const at::Tensor host = torch::stack({losses[0].to(torch::kFloat64),
                                              grad_norm.to(losses.device(), torch::kFloat64).reshape({})})
                                    .to(torch::kCPU);
        verdict = guard_.record(number, host[0].item<double>(), host[1].item<double>(), scaler_backoff(found_inf));
        skip = verdict->skip;
      }
      fault_point("optimizer", rank, number);
      if (!skip) {
        opt_->step(lr, clip_divisor);
        if (opt_hidden_) opt_hidden_->step(lr * hidden_lr_mult_);
        if (muon_) muon_->step(muon_lr(lr));
        if (ema_) ema_->update();
      }
    }
    scaler_->update(found_inf);
    if (verdict) act_on(*verdict, number, found_inf && scaler_->enabled());
    if (buckets_) {
      buckets_->zero();
    } else {
      model_->zero_grad();
    }
    finish_step(t0, lr, step_tokens,
                torch::cat({losses.to(torch::kFloat64), grad_norm.to(losses.device()).reshape({1})}));
  }

  // The host's account of one step's batches (its data metrics).
  struct StepData {
    double wait_s = 0;  // time spent waiting for batches
    int64_t pieces = 0, rows = 0, tokens = 0;
  };

  // Counts batch b into d and moves the loader position past it.
  void consume(data::Batch& b, StepData& d) {
    d.pieces += b.pieces;
    d.rows += b.inputs.size(0);
    d.tokens += b.inputs.numel();
    loader_state_ = std::move(b.state_after);
  }

  void record(const StepData& d) {
    data_wait_s_ = d.wait_s;
    docs_per_row_ = static_cast<double>(d.pieces) / static_cast<double>(std::max<int64_t>(1, d.rows));
  }

  // The bookkeeping that ends every step: counters, the step time, and its [loss, aux, grad norm]
  // queued to the host.
  void finish_step(Clock::time_point t0, double lr, int64_t step_tokens, const at::Tensor& values) {
    ++step_;
    tokens_ += step_tokens;
    lr_ = lr;
    // The loop's period: once the host runs a step ahead, it is the device's step time.
    step_time_s_ = t_prev_step_ == Clock::time_point{} ? seconds_since(t0) : seconds_since(t_prev_step_);
    t_prev_step_ = Clock::now();
    queue_step_values(values);
  }

  // ---- The step as a CUDA graph (train.cuda_graph; the run allows it, see run()) ----
  // Each step the host copies the batches into fixed device tensors (GraphInputs) and the learning
  // rate into the optimizers; the device work then runs on the graph's stream for kGraphWarmupSteps
  // steps, is captured at the next one, and is replayed from then on. A packed batch with more
  // document pieces than the inputs have room for runs eagerly at its exact positions (that step
  // only). If the capture fails under "auto", the device work runs eagerly for the rest of the run
  // and the log says why.
  static constexpr int64_t kGraphWarmupSteps = 2;

  bool graph_mode() const { return graph_ != nullptr || graph_fallback_; }

  void train_step_graphed() {
    const int rank = comm_.rank();
    fault_point("step", rank, step_);
    const auto t0 = Clock::now();
    const double lr = lr_at(cfg_.train, step_);
    const int64_t number = step_ + 1;
    StepData fed;  // this step's batches, as the host counts them
    // Positions per micro-batch: the fixed ones, or a batch's own where it did not fit.
    std::vector<model::Positions> own_positions(static_cast<size_t>(cfg_.train.grad_accum));
    bool all_fit = true;
    for (int64_t micro = 0; micro < cfg_.train.grad_accum; ++micro) {
      data::Batch b = loader_->next(&fed.wait_s);
      if (graph_inputs_.size() <= static_cast<size_t>(micro)) {
        const int64_t B = b.inputs.size(0), T = b.inputs.size(1);
        const int64_t room = cfg_.train.cuda_graph_pieces > 0 ? std::max(B, cfg_.train.cuda_graph_pieces)
                                                              : graph_piece_room(B, b.pieces);
        graph_inputs_.push_back(std::make_unique<GraphInputs>(B, T, b.cu_seqlens.defined(), room, device_));
      }
      if (!graph_inputs_[static_cast<size_t>(micro)]->take(b)) {
        all_fit = false;
        own_positions[static_cast<size_t>(micro)] =
            model::packed_positions(b.cu_seqlens, b.inputs.size(0), b.inputs.size(1), device_);
        if (!graph_overflow_logged_) {
          log("info", "CUDA graph: step " + std::to_string(number) + " has " + std::to_string(b.pieces) +
                          " document pieces in a micro-batch, more than the captured step's room for " +
                          std::to_string(graph_inputs_[static_cast<size_t>(micro)]->max_pieces()) +
                          "; such steps run eagerly (logged once)");
          graph_overflow_logged_ = true;
        }
      }
      consume(b, fed);
    }
    record(fed);
    opt_->begin_step(lr);
    if (opt_hidden_) opt_hidden_->begin_step(lr * hidden_lr_mult_);
    if (muon_) muon_->begin_step(muon_lr(lr));
    at::Tensor values;
    if (!all_fit || !graph_) {
      // Replays update the weights without a version bump, and an update that does not write the
      // bf16 shadows itself (ATen's AdamW; ours and Muon's in a graph do) leaves them stale unseen:
      // an eager step after replays recasts them all.
      if (graph_ && graph_->captured()) model::invalidate_weight_shadows();
      values = step_eagerly(own_positions);
    } else if (graph_->captured()) {
      // The graph's forward reads the weights' bf16 shadows without the host's checks: recast any
      // that went stale since the last replay (a checkpoint load, an EMA swap left behind).
      model::refresh_weight_shadows();
      graph_->replay();
      values = graph_out_;
    } else if (graph_warmups_ < kGraphWarmupSteps) {
      graph_->run_on_graph_stream([&] { values = step_eagerly(own_positions); });
      ++graph_warmups_;
    } else {
      try {
        model_->zero_grad();  // the captured backward then writes every gradient, never adds to one
        // Shadows gone stale in the warm-up (Muon's ATen update bumps versions) are recast now, not
        // inside the capture, where the recast would become part of every replay.
        model::refresh_weight_shadows();
        graph_->capture([&] { graph_out_ = step_device_work(own_positions, /*capturing=*/true); });
        for (auto& [n, p] : params_) graph_grads_.push_back(p.grad());
        log("info", "CUDA graph: step " + std::to_string(number) + " captured; every step from here replays it");
        graph_->replay();
        values = graph_out_;
      } catch (const std::exception& e) {
        if (cfg_.train.cuda_graph == "on") throw std::runtime_error(std::string("CUDA graph capture failed: ") + e.what());
        log("warn", std::string("CUDA graph capture failed, the step runs eagerly: ") + e.what());
        graph_.reset();
        graph_fallback_ = true;
        graph_grads_.clear();
        model_->zero_grad();
        values = step_eagerly(own_positions);
      }
    }
    finish_step(t0, lr, fed.tokens, values);  // values are copied out before the next replay overwrites graph_out_
  }

  // The step's device work run eagerly, into fresh gradients: a captured graph's gradient tensors
  // (its fixed addresses) are set aside for the step and put back after it.
  at::Tensor step_eagerly(const std::vector<model::Positions>& own_positions) {
    for (auto& [n, p] : params_) p.mutable_grad() = at::Tensor();
    auto values = step_device_work(own_positions);
    for (size_t i = 0; i < params_.size(); ++i) params_[i].second.mutable_grad() = i < graph_grads_.size() ? graph_grads_[i] : at::Tensor();
    return values;
  }

  // Everything a step does on the device, from the fixed inputs: forward and backward of every
  // micro-batch, the grad norm and clipping, the updates (at the lr begin_step wrote), the EMA.
  // own_positions[m], where defined, replaces micro-batch m's fixed positions. `capturing`: the work
  // is being recorded as the graph. Returns [loss, aux loss, grad norm] (fp64). No host
  // synchronisation and no host decision.
  at::Tensor step_device_work(const std::vector<model::Positions>& own_positions, bool capturing = false) {
    const double accum = static_cast<double>(cfg_.train.grad_accum);
    at::Tensor loss_sum, aux_sum;
    model::GradSquareSumsScope square_sums(device_, grad_square_sums_from_producers_);  // through the norm
    model::ExpertGradsInPiecesScope expert_pieces(device_, expert_grads_in_pieces_);   // through the update
    for (size_t micro = 0; micro < graph_inputs_.size(); ++micro) {
      const GraphInputs& in = *graph_inputs_[micro];
      const model::Positions& pos = own_positions[micro].pos.defined() ? own_positions[micro] : in.positions();
      model::LossParts parts;
      {
        ForwardPrecision precision(cfg_.train.precision, device_, weight_grads_in_place_,
                                   /*graph_step=*/graph_ != nullptr);
        parts = model_->loss_parts_at(in.tokens(), in.labels(), pos);
      }
      (parts.total / accum).backward();
      auto ce = parts.ce.detach().to(torch::kFloat64) / accum;
      auto aux = parts.aux.detach().to(device_, torch::kFloat64) / accum;
      loss_sum = loss_sum.defined() ? loss_sum + ce : ce;
      aux_sum = aux_sum.defined() ? aux_sum + aux : aux;
    }
    model::join_weight_grad_stream(device_);  // the weight gradients' GEMMs (model/mixed_linear.h)
    std::vector<torch::Tensor> grads_of;
    for (auto& [n, p] : params_) grads_of.push_back(p);
    const double max_norm = cfg_.train.grad_clip > 0 ? cfg_.train.grad_clip : INFINITY;
    at::Tensor grad_norm, clip_divisor;
    if (clip_in_update()) std::tie(grad_norm, clip_divisor) = grad_norm_and_clip_divisor_async(grads_of, max_norm);
    else grad_norm = clip_grad_norm_async(grads_of, max_norm);
    opt_->update(clip_divisor);
    if (opt_hidden_) opt_hidden_->update();
    if (muon_) muon_->update(/*write_shadows=*/capturing);  // eagerly the version bump recasts them
    if (ema_) ema_->update();
    return torch::stack({loss_sum.reshape({}), aux_sum.reshape({}), grad_norm.to(torch::kFloat64).reshape({})});
  }

  // Whether gradient clipping rides in the optimizer's update (AdamW divides each gradient as its
  // fused kernel reads it) instead of a pass of its own over every gradient: when the fused AdamW
  // is the only optimizer reading the gradients.
  bool clip_in_update() const { return opt_ && opt_->fused() && !opt_hidden_ && !muon_; }

  // Muon's learning rate at the step whose AdamW lr is `lr`: train.muon_lr on the same schedule.
  double muon_lr(double lr) const { return lr * cfg_.train.muon_lr / cfg_.train.lr * hidden_lr_mult_; }

  // Starts or stops the step profiler (bench train --profile) at its step boundaries, with the device
  // drained on both sides so the window holds exactly those steps.
  void profile_boundary() {
    if (!lead_ || opts_.profile_steps <= 0) return;
    const int64_t from = opts_.profile_from_step, to = from + opts_.profile_steps;
    if (step_ != from && !(step_ == to && profile_)) return;
    settle_step_values();
    if (device_.is_cuda()) at::accelerator::synchronizeDevice(device_.index());
    if (step_ == from) {
      profile_ = StepProfile::start(device_.is_cuda() ? device_.index() : -1, !opts_.profile_trace.empty());
      t_profile_ = Clock::now();
    } else {
      const double ms = seconds_since(t_profile_) * 1e3 / static_cast<double>(opts_.profile_steps);
      log("profile", profile_->stop(opts_.profile_trace, opts_.profile_steps, ms, opts_.profile_top));
      profile_.reset();
    }
  }

  // A step's [loss, aux loss, grad norm] on their way to the host, and the metrics row to fill when
  // it is a logging step.
  struct StepValues {
    int64_t step = 0;
    at::Tensor host;                 // [3] fp64
    std::optional<c10::Event> copied;  // GPU: recorded after the copy was queued
    std::optional<MetricsEvent> row;
  };

  void queue_step_values(const at::Tensor& values) {
    StepValues v;
    v.step = step_;
    if (values.is_cuda()) {
      v.host = torch::empty({3}, torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(true));
      v.host.copy_(values, /*non_blocking=*/true);
      v.copied.emplace(c10::DeviceType::CUDA);
      v.copied->record(at::accelerator::getCurrentStream(device_.index()));
    } else {
      v.host = values.to(torch::kCPU);
    }
    const bool last = step_ == cfg_.train.steps;
    if (cfg_.run.log_interval > 0 && (step_ % cfg_.run.log_interval == 0 || last)) v.row = train_metrics_row();
    pending_.push_back(std::move(v));
  }

  // Reads the queued step values (all, or all but the newest) and emits their metrics rows. A
  // non-finite loss without loss scaling fails the run here, naming its step.
  void settle_step_values(bool keep_newest = false) {
    while (pending_.size() > (keep_newest ? 1u : 0u)) {
      StepValues v = std::move(pending_.front());
      pending_.pop_front();
      if (v.copied) v.copied->synchronize();
      const double loss = v.host[0].item<double>(), aux = v.host[1].item<double>(), norm = v.host[2].item<double>();
      if (v.row) {
        v.row->values[0].second = loss;
        v.row->values[1].second = norm;
        if (cfg_.model.moe_experts > 0) v.row->values.emplace_back("aux_loss", aux);
        push(std::move(*v.row));
      }
      // Judged here, one step late, only when not decided within the step (a GPU without loss
      // scaling): a non-finite loss then fails the run, a spike is flagged.
      if (!decide_in_step_) act_on(guard_.record(v.step, loss, norm), v.step, false);
    }
  }

  // Whether an overflow the loss scaler found is its own range search (a scale above 1, before
  // this step's update), which StepGuard skips without counting towards train.max_nonfinite_steps.
  bool scaler_backoff(bool found_inf) const { return found_inf && scaler_->enabled() && scaler_->scale() > 1.0; }

  // Applies a StepGuard verdict of step `number`: logs a skip or a spike (rank 0), fails the run for
  // a non-finite step when train.nonfinite says so, and marks the run diverged after
  // train.max_nonfinite_steps skips in a row (run() then ends it). `scaler_skip`: the loss scaler
  // skipped it (routine with fp16; the scaler's back-off events report those).
  void act_on(const StepVerdict& v, int64_t number, bool scaler_skip) {
    if (v.nonfinite && !nonfinite_skips_ && !scaler_skip) {
      throw std::runtime_error("the loss or gradient is not finite at step " + std::to_string(number) +
                               "; lower train.lr or enable gradient clipping (train.nonfinite = \"skip\" skips such "
                               "steps instead)");
    }
    const std::string in_a_row = std::to_string(guard_.skipped_in_a_row()) + " in a row, " +
                                 std::to_string(guard_.skipped_total()) + " in total";
    if (v.skip && !scaler_skip) {
      const std::string why = v.nonfinite ? "non-finite loss or gradients"
                                          : "loss spike (z = " + fixed(v.zscore, 1) + ")";
      log_at(number, "warn", "step " + std::to_string(number) + " skipped: " + why +
                                 "; weights and optimizer state unchanged (" + in_a_row + ")");
    } else if (v.spike) {
      log_at(number, "warn", "loss spike at step " + std::to_string(number) + ": " + fixed(v.zscore, 1) +
                                 " standard deviations above the mean " + fixed(v.mean, 4) + " of the last " +
                                 std::to_string(cfg_.train.spike_window) + " steps (flagged; train.spike_action = " +
                                 "\"skip\" skips such steps)");
    }
    if (v.diverged) {
      diverged_ = "diverged: " + std::to_string(guard_.skipped_in_a_row()) +
                  " skipped steps in a row (non-finite or spiking loss) reached train.max_nonfinite_steps = " +
                  std::to_string(cfg_.train.max_nonfinite_steps) + " at step " + std::to_string(number) +
                  "; the last checkpoint holds the weights from before them";
      log_at(number, "error", diverged_);
    }
  }

  // Test-only data faults (DELTADECK_FAULT nan/spike@loss, inf@grad; trainer/fault_inject.h).
  void inject_data_faults(model::LossParts& parts, int64_t number) {
    const int rank = comm_.rank();
    if (fault_fires("nan", "loss", rank, number)) {
      parts.total = parts.total * NAN;
      parts.ce = parts.ce * NAN;
    }
    if (fault_fires("spike", "loss", rank, number)) {
      parts.total = parts.total * 20.0;
      parts.ce = parts.ce * 20.0;
    }
    // d(total)/d(p0) becomes +inf for one element of the first parameter; the reported loss stays finite.
    if (fault_fires("inf", "grad", rank, number))
      parts.total = parts.total + params_.front().second.reshape({-1})[0] * INFINITY;
  }

  // The loss of one batch on the run's device under train.precision. The cu_seqlens stay on the
  // host: the model reads them there and copies them to the device once.
  model::LossParts forward(const data::Batch& b) {
    auto inputs = b.inputs.to(device_, /*non_blocking=*/true);
    auto labels = b.labels.to(device_, /*non_blocking=*/true);
    ForwardPrecision precision(cfg_.train.precision, device_, weight_grads_in_place_);
    return model_->loss_parts(inputs, labels, b.cu_seqlens);
  }

  double wall() const { return wall_offset_ + seconds_since(t_start_); }

  // The metrics row of the step just taken; loss and grad_norm (the first two values) are filled in
  // when the step's values reach the host.
  MetricsEvent train_metrics_row() {
    const double dt = std::max(1e-9, seconds_since(t_last_log_));
    const double tok_s = static_cast<double>(tokens_ - tokens_at_last_log_) / dt;
    t_last_log_ = Clock::now();
    tokens_at_last_log_ = tokens_;
    MetricsEvent m{step_, tokens_, wall(), {}};
    m.values = {{"loss", 0.0}, {"grad_norm", 0.0}, {"lr", lr_}, {"tokens_per_s", tok_s},
                {"step_time_ms", step_time_s_ * 1e3}};
    // The MoE load-balancing loss ("aux_loss") is added when the values arrive; "loss" stays the
    // cross-entropy.
    // Data: time this step waited for batches, batches ready in the queue, and packing density
    // (packing never pads, so the padding fraction is 0 by construction and reported as such).
    m.values.emplace_back("loss_scale", scaler_->scale());
    // Every skipped step: the loss scaler's, non-finite ones and skipped spikes (StepGuard counts all).
    m.values.emplace_back("skipped_steps", static_cast<double>(decide_in_step_ ? guard_.skipped_total()
                                                                               : scaler_->skipped_steps()));
    m.values.emplace_back("data_wait_ms", data_wait_s_ * 1e3);
    m.values.emplace_back("loader_queue", static_cast<double>(loader_->queue_depth()));
    m.values.emplace_back("docs_per_row", docs_per_row_);
    m.values.emplace_back("pad_frac", 0.0);
    // MFU: model FLOPs (MODEL.md §10) per second over the device's peak for this precision.
    if (peak_tflops_ > 0) m.values.emplace_back("mfu", tok_s * flops_per_token_ / (peak_tflops_ * 1e12));
    if (device_.is_cuda()) {
      const DeviceMemory mem = device_memory(device_, /*reset_peak=*/true);
      m.values.emplace_back("mem_allocated_gib", mem.allocated_gib);
      m.values.emplace_back("mem_reserved_gib", mem.reserved_gib);
      // A replayed graph's activations sit idle in its pool between replays (reserved, not allocated).
      const double graph_idle_gib =
          graph_ ? static_cast<double>(graph_->pool_idle_bytes()) / (1024.0 * 1024.0 * 1024.0) : 0.0;
      m.values.emplace_back("mem_peak_gib", mem.peak_gib + graph_idle_gib);
    }
    if (cfg_.train.precision == "fp8")
      m.values.emplace_back("fp8_saturations", static_cast<double>(model::take_fp8_saturations(device_)));
    if (comm_.world() > 1) add_rank_timings(m);
    return m;
  }

  // Every rank's step time and data wait as rank<r>.step_time_ms / rank<r>.data_wait_ms, so a
  // straggling GPU or node stands out. Every rank calls this at the same logged step; rank 0
  // gathers the values through the rendezvous store (no device synchronisation).
  void add_rank_timings(MetricsEvent& m) {
    char mine[64];
    std::snprintf(mine, sizeof mine, "%.17g %.17g", step_time_s_ * 1e3, data_wait_s_ * 1e3);
    const auto all = comm_.gather_text("timing/" + std::to_string(step_), mine);
    for (size_t r = 0; r < all.size(); ++r) {
      double step_ms = 0, wait_ms = 0;
      if (std::sscanf(all[r].c_str(), "%lf %lf", &step_ms, &wait_ms) != 2) continue;
      const std::string prefix = "rank" + std::to_string(r) + ".";
      m.values.emplace_back(prefix + "step_time_ms", step_ms);
      m.values.emplace_back(prefix + "data_wait_ms", wait_ms);
    }
  }

  // Mean validation cross-entropy over the fixed batches, weighted by rows. Rank r evaluates
  // batches r, r + world, ...; the sums are all-reduced, so no rank waits alone.
  double validation_loss() {
    torch::NoGradGuard no_grad;
    model_->eval();
    double sum = 0, weight = 0;
    try {
      const auto& batches = loader_->validation();
      for (size_t i = static_cast<size_t>(comm_.rank()); i < batches.size(); i += static_cast<size_t>(comm_.world())) {
        const auto& b = batches[i];
        const double rows = static_cast<double>(b.inputs.size(0));
        sum += rows * forward(b).ce.item<double>();
        weight += rows;
      }
    } catch (...) {
      model_->train();
      throw;
    }
    model_->train();
    if (comm_.world() > 1) {
      // On the ranks' device: NCCL reduces only device tensors.
      std::vector<at::Tensor> t{torch::tensor({sum, weight}, torch::kFloat64).to(device_)};
      comm_.all_reduce_sum(t, "summing the validation loss");
      const auto host = t[0].to(torch::kCPU);
      sum = host[0].item<double>();
      weight = host[1].item<double>();
    }
    return sum / weight;
  }

  void evaluate() {
    settle_step_values();  // the step's training metrics come first
    if (loader_->validation().empty()) return;
    const double val = validation_loss();
    MetricsEvent m{step_, tokens_, wall(), {{"val_loss", val}, {"val_ppl", std::exp(val)}}};
    if (ema_) {
      // The EMA weights are swapped in by pointer and swapped back even if evaluation throws.
      Ema::Swap swap(*ema_);
      const double val_ema = validation_loss();
      m.values.emplace_back("val_loss_ema", val_ema);
      m.values.emplace_back("val_ppl_ema", std::exp(val_ema));
    }
    last_val_step_ = step_;
    last_val_ = val;
    push(std::move(m));
  }

  // Every rank takes part (rank 0 gathers the data positions); rank 0 writes. The weights and the
  // optimizer state are the same on every rank.
  void save(const std::string& why) {
    settle_step_values();  // a run that went non-finite is not checkpointed
    if (step_ == last_saved_step_) return;
    const std::vector<std::string> positions = comm_.gather_text("loader/" + std::to_string(step_), loader_state_);
    NamedTensors optimizer_state = zero_ ? zero_->state_tensors() : NamedTensors{};  // a collective: every rank
    std::vector<std::pair<std::string, at::Tensor>> fp8_records;
    for (auto& [name, h] : model::fp8_histories(*model_)) fp8_records.emplace_back(name, h->records);
    NamedTensors fp8_state = fp8_record_state(fp8_records, comm_);  // a collective too; filled on the lead
    if (!lead_) {
      last_saved_step_ = step_;
      return;
    }
    CheckpointData d;
    d.step = step_;
    d.weights = params_;
    d.state = zero_ ? optimizer_state : opt_->state_tensors();
    if (opt_hidden_) for (auto& t : opt_hidden_->state_tensors()) d.state.push_back(t);
    if (muon_) for (auto& t : muon_->state_tensors()) d.state.push_back(t);
    if (ema_) for (auto& t : ema_->state_tensors()) d.state.push_back(t);
    // fp8's delayed scales come from these amaxes (every rank's): without them a resumed run would
    // quantise its first step differently.
    for (auto& t : fp8_state) d.state.push_back(std::move(t));
    d.config_toml = to_toml(cfg_);
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      d.state.emplace_back("rng.cpu", gen.get_state());
    }
    if (auto rng = device_rng_state(device_); rng.defined()) d.state.emplace_back("rng.device", rng);
    d.meta = {{"tokens", std::to_string(tokens_)},
              {"loader.state", loader_state_},
              {"optimizer.steps", std::to_string(zero_ ? zero_->steps_taken() : opt_->steps_taken())},
              {"scaler.scale", format_exact(scaler_->state()[0])},
              {"scaler.growth_tracker", format_exact(scaler_->state()[1])},
              {"scaler.skipped", format_exact(scaler_->state()[2])},
              {"wall_s", std::to_string(wall())},
              {"world_size", std::to_string(comm_.world())}};
    if (comm_.world() > 1) {
      d.meta.erase("loader.state");
      for (size_t r = 0; r < positions.size(); ++r) d.meta["loader.state." + std::to_string(r)] = positions[r];
    }
    // The best checkpoint by validation loss survives pruning; it is carried in the state so a
    // resumed run keeps protecting it.
    if (last_val_step_ == step_ && (best_step_ < 0 || last_val_ < best_val_)) {
      best_step_ = step_;
      best_val_ = last_val_;
    }
    d.meta["best.step"] = std::to_string(best_step_);
    d.meta["best.val_loss"] = format_exact(best_val_);
    d.meta["guard.state"] = guard_.state();
    d.compat = resume_fingerprint(cfg_, comm_.world());
    const std::string root = opts_.run_dir + "/checkpoints";
    const SavedCheckpoint saved = save_with_retries(root, d);
    last_saved_step_ = step_;
    // Pruned before the event, which names what went: the front ends drop those records at once
    // rather than at the next save (the last save's pruned checkpoints were never dropped).
    std::vector<int64_t> pruned = prune_checkpoints(root, cfg_.run.keep_checkpoints, best_step_);
    push(CheckpointEvent{step_, storage::files::absolute_path(saved.dir), saved.bytes, saved.sha256, std::move(pruned)});
    if (!why.empty()) log("info", why + ": checkpoint at step " + std::to_string(step_));
  }

  // save_checkpoint, retried run.save_retries times save_retry_delay_s apart (a full disk that
  // someone clears). The last failure fails the run naming the file, the reason and the checkpoint
  // a resume would use. Rank 0.
  SavedCheckpoint save_with_retries(const std::string& root, const CheckpointData& d) {
    // The app waits here until the metrics up to this step are committed, so no row up to a
    // committed checkpoint's step is ever lost to a crash right after the commit.
    const auto before_commit = [this] {
      if (opts_.before_checkpoint_commit) opts_.before_checkpoint_commit(step_);
    };
    for (int64_t attempt = 0;; ++attempt) {
      try {
        return save_checkpoint(root, d, storage::checkpoint_io(), before_commit);
      } catch (const std::exception& e) {
        const std::string what = "checkpoint at step " + std::to_string(step_) + " not written: " + e.what();
        if (attempt >= cfg_.run.save_retries) {
          const auto kept = list_checkpoints(root);
          throw std::runtime_error(what + "; " + (kept.empty() ? std::string("no earlier checkpoint exists")
                                                                 : "the resume target stays " + kept.back().second));
        }
        log("warn", what + "; retry " + std::to_string(attempt + 1) + " of " + std::to_string(cfg_.run.save_retries) +
                        " in " + fixed(cfg_.run.save_retry_delay_s, 1) + " s");
        std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.run.save_retry_delay_s));
      }
    }
  }

  // A Linear's fp8 amax records from a checkpoint (trainer/fp8_checkpoint.h); `state_name` is the
  // entry they came from, for errors.
  void restore_fp8_history(const std::string& state_name, const std::string& module, const at::Tensor& records,
                           const std::string& dir) {
    const std::string what = dir + "/state.safetensors: '" + state_name + "'";
    auto modules = model_->named_modules();
    auto* found = modules.find(module);
    auto* linear = found ? dynamic_cast<model::LinearImpl*>(found->get()) : nullptr;
    if (!linear) throw std::runtime_error(what + " names no linear layer of the configured model");
    linear->fp8.load(records, device_, what);
  }

  void restore(const CheckpointData& d, const std::string& dir) {
    std::map<std::string, at::Tensor> by_name(d.weights.begin(), d.weights.end());
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : params_) {
      auto it = by_name.find(name);
      if (it == by_name.end()) throw std::runtime_error(dir + "/model.safetensors: no tensor '" + name + "'");
      if (it->second.sizes() != p.sizes())
        throw std::runtime_error(dir + "/model.safetensors: '" + name + "' has shape " + c10::str(it->second.sizes()) +
                                 ", the configured model needs " + c10::str(p.sizes()));
      p.copy_(it->second);
    }
    NamedTensors opt_state;
    for (auto& [name, t] : d.state) {
      if (name == "rng.cpu") {
        auto gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(t);
      } else if (name == "rng.device") {
        set_device_rng_state(device_, t);
      } else if (!is_fp8_record_state(name)) {  // fp8 records: this rank's own, below
        opt_state.emplace_back(name, t);
      }
    }
    // This rank's own amax records (a resume keeps the world size, so every rank finds its own).
    for (const auto& e : fp8_records_for_rank(d.state, comm_.rank(), dir + "/state.safetensors"))
      restore_fp8_history(e.state_name, e.module, e.records, dir);
    // A checkpoint of another version (or edited by hand) may lack a key: say which, and where.
    auto meta_int = [&](const std::string& k) -> int64_t {
      const auto it = d.meta.find(k);
      try {
        if (it != d.meta.end()) return std::stoll(it->second);
      } catch (const std::exception&) {
      }
      throw std::runtime_error(dir + "/state.safetensors: metadata \"" + k + "\" is missing or not an integer");
    };
    if (zero_) zero_->load_state(opt_state, meta_int("optimizer.steps"));
    else opt_->load_state(opt_state, meta_int("optimizer.steps"));
    if (opt_hidden_) opt_hidden_->load_state(opt_state, meta_int("optimizer.steps"));
    if (muon_) muon_->load_state(opt_state);
    if (ema_) ema_->load_state(opt_state);
    if (d.meta.count("scaler.scale"))
      scaler_->load_state({std::stod(d.meta.at("scaler.scale")), std::stod(d.meta.at("scaler.growth_tracker")),
                           std::stod(d.meta.at("scaler.skipped"))});
    step_ = d.step;
    last_saved_step_ = d.step;
    tokens_ = meta_int("tokens");
    wall_at_resume_ = d.meta.count("wall_s") ? std::stod(d.meta.at("wall_s")) : 0.0;
    if (d.meta.count("best.step")) {
      best_step_ = meta_int("best.step");
      best_val_ = std::stod(d.meta.at("best.val_loss"));
    }
    // Checkpoints from before the step guard carry no state: it starts empty.
    if (auto it = d.meta.find("guard.state"); it != d.meta.end()) guard_.load_state(it->second);
  }

  void log(const std::string& level, const std::string& text) { push(LogEvent{step_, level, text}); }
  void log_at(int64_t step, const std::string& level, const std::string& text) { push(LogEvent{step, level, text}); }

 public:
  int64_t step() const { return step_; }

  // Stops the data loader's threads (CPU only; they read the run's config). For a loop that is
  // about to be abandoned rather than destroyed (run_rank).
  void stop_loader() { loader_.reset(); }

 private:

  const RunConfig& cfg_;
  const SessionOptions& opts_;
  Channel<Event>& events_;
  Channel<Command>& commands_;
  RunProgress& progress_;
  const RankContext& rank_;
  Communicator& comm_;
  const bool lead_;                     // rank 0: reads commands, reports, writes checkpoints
  bool paused_ = false;
  Clock::time_point paused_at_{};  // when the pause began (rank 0)
  std::unique_ptr<data::Loader> loader_;
  std::string loader_state_;  // the loader position after the last batch consumed
  model::DecoderLM model_{nullptr};
  NamedTensors params_;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<StepProfile> profile_;
  Clock::time_point t_profile_{};
  // Store keys of the latest command agreements; the oldest is deleted once every rank is past it.
  std::deque<std::string> command_keys_;
  bool stop_forwarded_ = false;
  bool stop_polled_ = false;
  int64_t command_round_ = 0;
  std::deque<StepValues> pending_;  // steps whose values are still on their way to the host
  Clock::time_point t_prev_step_{};
  std::unique_ptr<GradBuckets> buckets_;  // several ranks without ZeRO-1: gradients averaged during backward
  std::unique_ptr<ShardedAdamW> zero_;  // run.zero1 with several ranks: replaces opt_
  bool weight_grads_in_place_ = false;   // forward passes open a model::WeightGradInPlaceScope
  bool grad_square_sums_from_producers_ = false;  // steps open a model::GradSquareSumsScope
  bool expert_grads_in_pieces_ = false;           // steps open a model::ExpertGradsInPiecesScope
  std::unique_ptr<AdamW> opt_hidden_;   // mup_base_width > 0 with AdamW: the hidden matrices
  double hidden_lr_mult_ = 1.0;         // μP: mup_base_width / d_model, else 1
  double peak_tflops_ = 0, flops_per_token_ = 0;
  int64_t last_val_step_ = -1, best_step_ = -1;  // best: the checkpointed step with the lowest val loss
  double last_val_ = 0, best_val_ = 0;
  std::unique_ptr<Muon> muon_;          // optimizer = "muon": the hidden matrices
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<Ema> ema_;            // ema_decay > 0
  std::unique_ptr<StepGraph> graph_;    // the step as a CUDA graph (train.cuda_graph), until a capture fails
  bool graph_fallback_ = false;         // a capture failed: the graph path's device work runs eagerly
  int64_t graph_warmups_ = 0;           // eager steps on the graph's stream before the capture
  std::vector<std::unique_ptr<GraphInputs>> graph_inputs_;  // fixed device inputs, one per micro-batch
  std::vector<at::Tensor> graph_grads_; // the captured step's gradient tensors (params_ order)
  at::Tensor graph_out_;                // [loss, aux, grad norm], written by every replay
  bool graph_overflow_logged_ = false;  // a batch with more pieces than the room was logged
  StepGuard guard_;                     // non-finite steps, spikes, skips in a row (checkpointed)
  bool decide_in_step_ = false;         // StepGuard judges before the update (see run())
  bool nonfinite_skips_ = false;        // train.nonfinite resolved: skip (true) or fail
  std::string diverged_;                // set by act_on when the run must end as diverged
  int64_t step_ = 0, tokens_ = 0, last_saved_step_ = -1, tokens_at_last_log_ = 0;
  double data_wait_s_ = 0, docs_per_row_ = 0, lr_ = 0, step_time_s_ = 0, wall_offset_ = 0, wall_at_resume_ = 0;
  Clock::time_point t_start_, t_last_log_;
};

}  // namespace

namespace {
std::mutex cuda_block_mu;
std::string cuda_block_reason;
}  // namespace

void block_cuda(const std::string& why) {
  std::lock_guard<std::mutex> lk(cuda_block_mu);
  if (cuda_block_reason.empty()) cuda_block_reason = why;
}

std::string cuda_blocked_reason() {
  std::lock_guard<std::mutex> lk(cuda_block_mu);
  return cuda_block_reason;
}

EndedEvent run_rank(const RunConfig& cfg, const SessionOptions& opts, Channel<Event>& events,
                    Channel<Command>& commands, RunProgress& progress, const RankContext& rank) {
  auto loop = std::make_unique<TrainLoop>(cfg, opts, events, commands, progress, rank);
  try {
    return loop->run();
  } catch (const std::exception& e) {
    const int64_t step = loop->step();
    events.push(LogEvent{step, "error", e.what()});
    if (rank.device.is_cuda() && rank.comm->world() > 1) {
      // After a communicator error the GPU engine does no further CUDA work in this process: the
      // NCCL communicator may be aborted or wedged with kernels still queued on this device's
      // streams, and a synchronize, an event destroyed or a free reaching the driver could hang
      // forever. So the loop is leaked, not destroyed (its model, optimizer state, pending events
      // and gradient buckets with it; only its CPU loader threads are stopped), and later runs in
      // this process refuse CUDA (Session checks cuda_blocked_reason). A front end that stays open
      // (the desktop app) shows the failure and offers to resume in a fresh process.
      block_cuda("rank " + std::to_string(rank.comm->rank()) + " failed in a multi-GPU run (" + e.what() + ")");
      loop->stop_loader();
      static_cast<void>(loop.release());  // leaked on purpose
    }
    return EndedEvent{RunStatus::Failed, step, e.what()};
  }
}

}  // namespace trainer

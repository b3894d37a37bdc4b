// Session: the run's thread lifecycle, and resolve_config (what this build can run).
#include "trainer/session.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "storage/file_util.h"
#include "trainer/comm.h"
#include "trainer/data/source.h"
#include "trainer/device.h"
#include "trainer/data/tokenizer.h"
#include "trainer/telemetry.h"
#include "trainer/train_loop.h"

namespace trainer {

std::shared_ptr<Rendezvous> node_rendezvous(const ClusterSpec& node, std::chrono::milliseconds timeout) {
  // Under torchrun's agent store nobody serves: the launcher's agent on node 0 already does.
  return Rendezvous::tcp(node.master_addr, node.master_port, node.node_rank == 0 && !node.agent_store, node.nnodes,
                         timeout, node.agent_store ? "deltadeck/attempt_" + std::to_string(node.restart_count) : "");
}

std::vector<std::string> resolve_config(RunConfig& cfg) {
  std::vector<std::string> errors;
  // Recorded absolute: a resume from another folder, another node, and `runs delete` find it so.
  if (!cfg.run.checkpoint_dir.empty()) cfg.run.checkpoint_dir = storage::files::absolute_path(cfg.run.checkpoint_dir);
  std::vector<std::pair<std::string, std::string>> sources;  // (key, spec)
  for (size_t i = 0; i < cfg.data.train.size(); ++i)
    sources.emplace_back("data.train[" + std::to_string(i) + "]", cfg.data.train[i]);
  for (size_t i = 0; i < cfg.data.val_sources.size(); ++i)
    sources.emplace_back("data.val[" + std::to_string(i) + "]", cfg.data.val_sources[i]);
  bool any_text = false, any_tokens = false;
  for (const auto& [key, spec] : sources) (data::is_token_source(spec) ? any_tokens : any_text) = true;

  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::make_tokenizer(cfg.data.tokenizer);
    const int64_t tok_vocab = tok->vocab_size();
    if (cfg.model.vocab_size == 0 && any_tokens) {
      errors.push_back("model.vocab_size: required with token sources (llmc:, u16:, random:), which carry no tokenizer; e.g. "
                       "50304 for GPT-2 shards");
    } else if (cfg.model.vocab_size == 0) {
      cfg.model.vocab_size = tok_vocab;
    } else if (any_text && cfg.model.vocab_size < tok_vocab) {
      errors.push_back("model.vocab_size: " + std::to_string(cfg.model.vocab_size) + " is smaller than the " +
                       "tokenizer's vocabulary (" + std::to_string(tok_vocab) + " for data.tokenizer = \"" +
                       cfg.data.tokenizer + "\")");
    }
  } catch (const std::exception& e) {
    errors.push_back(e.what());
  }
  for (auto& e : check_device(cfg)) errors.push_back(std::move(e));
  if (!errors.empty() || !tok) return errors;
  resolve_precision(cfg);
  // Open (index and check) every source now, so bad data stops the run before anything is
  // written: wrong magic, truncation, token ids >= vocab, invalid UTF-8... The loader indexes them
  // again on the worker thread.
  for (const auto& [key, spec] : sources) {
    try {
      data::open_source(spec, data::source_options(cfg.data, cfg.model.vocab_size, key), *tok);
    } catch (const std::exception& e) {
      errors.push_back(e.what());
    }
  }
  return errors;
}

// How long the other ranks get to end once one rank failed.
constexpr std::chrono::seconds kRankGrace{15};

// The rank threads' outcomes, in the order they failed: the first failure is the cause, later ones
// (peers failing in a collective) its consequence.
class RankResults {
 public:
  explicit RankResults(int n) : outcomes_(n), failure_order_(n, -1), ended_(n, false), comms_(n, nullptr) {}

  // The rank's group while it runs (nullptr once it ends), so a failing rank can abort it. A rank
  // detaching its group waits for aborts in progress, which may still be using it.
  void attach(int r, Communicator* comm) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!comm) cv_.wait(lk, [&] { return aborting_ == 0; });
    comms_[r] = comm;
  }
  void finish(int r, EndedEvent out) {
    std::vector<Communicator*> peers;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (out.status == RunStatus::Failed) {
        if (failures_ == 0) {
          for (size_t i = 0; i < comms_.size(); ++i)
            if (comms_[i] && static_cast<int>(i) != r) peers.push_back(comms_[i]);
          aborting_ += static_cast<int>(peers.size());
        }
        failure_order_[r] = failures_++;
      }
      outcomes_[r] = std::move(out);
      ended_[r] = true;
    }
    cv_.notify_all();
    // Outside the lock: an abort that blocks on a wedged GPU must not stop the grace period from
    // running out (wait_all_or_grace) and the run from ending without that rank.
    for (Communicator* c : peers) c->abort("rank " + std::to_string(r) + " failed");
    if (!peers.empty()) {
      std::lock_guard<std::mutex> lk(mu_);
      aborting_ -= static_cast<int>(peers.size());
    }
    cv_.notify_all();
  }
  // Waits until every rank ended, or until `grace` after the first failure. Returns who ended.
  std::vector<bool> wait_all_or_grace(std::chrono::seconds grace) {
    std::unique_lock<std::mutex> lk(mu_);
    auto all_ended = [&] { return std::all_of(ended_.begin(), ended_.end(), [](bool e) { return e; }); };
    cv_.wait(lk, [&] { return all_ended() || failures_ > 0; });
    cv_.wait_for(lk, grace, all_ended);
    return ended_;
  }
  // Rank 0's outcome, or the first failure's message at rank 0's step.
  EndedEvent outcome() {
    std::lock_guard<std::mutex> lk(mu_);
    EndedEvent e = ended_[0] ? outcomes_[0] : EndedEvent{RunStatus::Failed, 0, "rank 0 hung"};
    for (size_t r = 0; r < outcomes_.size(); ++r) {
      if (failure_order_[r] == 0) {
        const int64_t step = e.step;
        e = outcomes_[r];
        e.step = step;
      }
    }
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<EndedEvent> outcomes_;
  std::vector<int> failure_order_;
  std::vector<bool> ended_;
  std::vector<Communicator*> comms_;
  int failures_ = 0;
  int aborting_ = 0;  // aborts of peers' groups running now (outside the lock)
};

struct Session::Impl : std::enable_shared_from_this<Session::Impl> {
  RunConfig cfg;
  SessionOptions opts;
  Channel<Event> events{4096};
  Channel<Command> commands{64};
  std::thread worker;
  RunProgress progress;
  // GPU telemetry: once a second while the worker runs (only where NVML loads).
  std::thread telemetry;
  std::mutex telemetry_mu;
  std::condition_variable telemetry_cv;
  bool worker_done = false;

  void telemetry_loop(std::unique_ptr<Telemetry> nvml) {
    std::unique_lock<std::mutex> lk(telemetry_mu);
    while (!telemetry_cv.wait_for(lk, std::chrono::seconds(1), [&] { return worker_done; })) {
      if (!progress.known.load()) continue;  // still building the model or loading the checkpoint
      MetricsEvent m{progress.step.load(), progress.tokens.load(), progress.wall_s.load(),
                     Telemetry::as_metrics(nvml->sample())};
      events.try_push(std::move(m));  // never block the reporting on a slow consumer
    }
  }
  // The worker calls this when it ends; the telemetry thread then exits within its wait.
  void stop_telemetry_async() {
    {
      std::lock_guard<std::mutex> lk(telemetry_mu);
      worker_done = true;
    }
    telemetry_cv.notify_all();
  }
  void stop_telemetry() {
    stop_telemetry_async();
    if (telemetry.joinable()) telemetry.join();
  }

  // The worker: one thread per rank, joined into one outcome. A failed rank fails the run with its
  // own message and aborts its local peers' groups, so they fail at their next collective instead of
  // waiting out the timeout. A rank that still has not ended kRankGrace after the first failure
  // (hung in user code or a driver) is abandoned: the run is recorded as failed without it.
  void run_all_ranks() {
    EndedEvent ended{RunStatus::Failed, 0, "no rank ran"};
    try {
      const std::vector<c10::Device> devices = rank_devices(cfg.run.devices);
      // After a failed multi-rank GPU run this process does no more CUDA work (see run_rank).
      if (const std::string why = cuda_blocked_reason(); !why.empty() && devices.front().is_cuda())
        throw std::runtime_error("this process can no longer use the GPU: " + why +
                                 "; resume the run in a new deltadeck process");
      const int local_world = static_cast<int>(devices.size());
      const ClusterSpec& node = opts.cluster;
      const int world = local_world * node.nnodes;
      const int first_rank = node.node_rank * local_world;  // global rank = node rank × local world + local rank
      const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.run.collective_timeout_s * 1000));
      std::shared_ptr<Rendezvous> rendezvous;
      if (node.nnodes > 1) {
        rendezvous = opts.rendezvous ? opts.rendezvous : node_rendezvous(node, timeout);
        // Every node must bring the same number of ranks, or global ranks would collide.
        const auto counts = rendezvous->exchange("local_world", node.node_rank, node.nnodes,
                                                 std::to_string(local_world), timeout);
        for (int n = 0; n < node.nnodes; ++n)
          if (counts[n] != std::to_string(local_world))
            throw std::runtime_error("run.devices: node " + std::to_string(n) + " runs " + counts[n] +
                                     " ranks and node " + std::to_string(node.node_rank) + " runs " +
                                     std::to_string(local_world) + "; every node needs the same number");
        // A resumed run: every node must start from the same checkpoint (the one node 0 resolved and
        // sent, app/train_command.cpp), or ranks would hold different weights.
        const auto starts = rendezvous->exchange("resume_from", node.node_rank, node.nnodes, opts.resume_from, timeout);
        for (int n = 0; n < node.nnodes; ++n)
          if (starts[n] != opts.resume_from)
            throw std::runtime_error("--resume: node " + std::to_string(n) + " starts from '" + starts[n] +
                                     "' and node " + std::to_string(node.node_rank) + " from '" + opts.resume_from +
                                     "'; every node must resume from the checkpoint node 0 resolved");
        // Node 0 may have recorded the run under another name than the config's (it was taken): the
        // other nodes name their logs after the recorded one.
        const auto names = rendezvous->exchange("run_name", node.node_rank, node.nnodes, opts.run_name, timeout);
        if (node.node_rank != 0) events.push(RunNamedEvent{names[0]});
      } else if (world > 1) {
        rendezvous = Rendezvous::in_process();
      }
      if (local_world > 1) {
        bind_thread(devices[0]);
        preload_cuda_libraries(devices[0]);
      }
      // Shared with the rank threads, which may outlive this call when abandoned.
      auto ranks = std::make_shared<RankResults>(local_world);
      // `self`, not `this`: a rank abandoned below may wake after the Session is destroyed.
      auto rank_body = [self = shared_from_this(), ranks, devices, rendezvous, first_rank, world, timeout](int r) {
        RunConfig& cfg = self->cfg;
        SessionOptions& opts = self->opts;
        Channel<Event>& events = self->events;
        Channel<Command>& commands = self->commands;
        RunProgress& progress = self->progress;
        EndedEvent out;
        std::unique_ptr<Communicator> comm;
        try {
          bind_thread(devices[r]);
          comm = world > 1 ? Communicator::join(rendezvous, first_rank + r, world, devices[r], timeout)
                           : Communicator::single();
          ranks->attach(r, comm.get());
          out = run_rank(cfg, opts, events, commands, progress, RankContext{devices[r], comm.get()});
        } catch (const std::exception& e) {
          events.push(LogEvent{0, "error", e.what()});
          out = EndedEvent{RunStatus::Failed, 0, e.what()};
        }
        ranks->attach(r, nullptr);
        // Recorded before this rank's group closes: a peer waiting in a collective sees the closed
        // connection and fails too, and a failure recorded first is taken as the run's cause.
        ranks->finish(r, std::move(out));
        comm.reset();
      };
      std::vector<std::thread> threads;
      for (int r = 0; r < local_world; ++r) threads.emplace_back(rank_body, r);
      const std::vector<bool> ended_ranks = ranks->wait_all_or_grace(kRankGrace);
      for (int r = 0; r < local_world; ++r) {
        if (ended_ranks[r]) {
          threads[r].join();
        } else {
          threads[r].detach();
          events.push(LogEvent{0, "error", "rank " + std::to_string(first_rank + r) + " did not stop within " +
                                                std::to_string(kRankGrace.count()) +
                                                " s of the failure (hung); abandoned"});
        }
      }
      ended = ranks->outcome();
    } catch (const std::exception& e) {
      events.push(LogEvent{0, "error", e.what()});
      ended = EndedEvent{RunStatus::Failed, 0, e.what()};
    }
    events.push(ended);
    events.close();
  }
};

Session::Session(RunConfig cfg, SessionOptions opts) : impl_(std::make_shared<Impl>()) {
  // A config that did not go through resolve_config (a caller of the API) still trains in a
  // concrete precision; rank_devices' error for devices this machine lacks comes at the start.
  try {
    resolve_precision(cfg);
  } catch (const std::exception&) {
  }
  impl_->cfg = std::move(cfg);
  impl_->opts = std::move(opts);
}

Session::~Session() {
  if (impl_->worker.joinable()) {
    impl_->commands.try_push(Command::Stop);
    impl_->commands.close();
    // Nobody may be draining events any more: closing lets a blocked push return.
    impl_->events.close();
    impl_->worker.join();
  }
  impl_->stop_telemetry();
}

void Session::start() {
  if (auto nvml = Telemetry::open())
    impl_->telemetry = std::thread([this, n = std::move(nvml)]() mutable { impl_->telemetry_loop(std::move(n)); });
  impl_->worker = std::thread([this] {
    impl_->run_all_ranks();
    impl_->stop_telemetry_async();
  });
}

Channel<Event>& Session::events() { return impl_->events; }

void Session::send(Command c) {
  // Commands wait for the next step boundary; while the engine is busy (building the model, a long
  // evaluation) a held-down save key fills the channel. A save-now that finds it full is dropped (one
  // checkpoint a step is all it can give) rather than blocking the caller's UI thread.
  if (c == Command::SaveNow) {
    impl_->commands.try_push(c);
    return;
  }
  impl_->commands.push(c);
}

void Session::join() {
  if (impl_->worker.joinable()) impl_->worker.join();
  impl_->stop_telemetry();
}

}  // namespace trainer

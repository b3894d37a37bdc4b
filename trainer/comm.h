// How ranks talk: c10d process groups (Gloo for CPU ranks, NCCL for GPU ranks) over a shared
// rendezvous store — an in-process HashStore when the ranks are threads of one process. Every
// rank-dependent decision in the engine goes through a Communicator; world 1 makes every call a
// no-op. Collective failures are rethrown as std::runtime_error naming the rank, host and operation.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/rendezvous.h"

namespace trainer {

// A collective in flight. wait() blocks until it is done (or fails, naming the operation).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  // World 1: no peers, nothing to exchange.
  static std::unique_ptr<Communicator> single();
  // Joins the group of `world` ranks at `rendezvous` as `rank`: Gloo when device is the CPU, NCCL
  // for a CUDA device. Blocks until every rank joined or the timeout passed.
  static std::unique_ptr<Communicator> join(const std::shared_ptr<Rendezvous>& rendezvous, int rank, int world,
                                            const c10::Device& device, std::chrono::milliseconds timeout);
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Sums the tensors across ranks, in place; `what` names the operation in errors.
  virtual void all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& what) = 0;
  // Starts summing `flat` (contiguous) across ranks in place and returns at once, so the caller can
  // go on computing (gradient buckets during backward). Collectives start in call order on every rank.
  virtual std::unique_ptr<PendingCollective> start_all_reduce_sum(const at::Tensor& flat, const std::string& what) = 0;
  // Copies root's tensors to every rank, in place.
  virtual void broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;
  // shard = the sum across ranks of flat's `rank`-th slice; flat.numel() == world × shard.numel().
  virtual void reduce_scatter_sum(at::Tensor& shard, const at::Tensor& flat, const std::string& what) = 0;
  // flat = every rank's shard, in rank order; flat.numel() == world × shard.numel().
  virtual void all_gather(at::Tensor& flat, const at::Tensor& shard, const std::string& what) = 0;
  // Rank 0's `text` on every rank, through the rendezvous store rather than a collective, so it
  // costs no device synchronisation (the step loop agrees on commands with it every step). `key`
  // must be unique per call; `forget_key` (optional) is an earlier key every rank has passed, which
  // rank 0 deletes so the store does not grow with the run.
  virtual std::string broadcast_text(const std::string& key, const std::string& text,
                                     const std::string& forget_key = "") = 0;
  // A named flag in the rendezvous store any rank can raise (e.g. "stop" when a node other than 0
  // got SIGTERM) and any rank can read without waiting; nullopt while nobody raised it.
  virtual void raise_flag(const std::string& name, const std::string& value) = 0;
  virtual std::optional<std::string> flag(const std::string& name) = 0;
  // Makes this rank's collectives fail from now on with `reason` (another rank of this process failed);
  // NCCL's communicators are aborted so a collective in flight returns. Callable from any thread.
  virtual void abort(const std::string& reason) = 0;
  // Rank 0 receives every rank's text (in rank order; other ranks get an empty list). `key` must be
  // unique per call (e.g. include the step).
  virtual std::vector<std::string> gather_text(const std::string& key, const std::string& text) = 0;
};

}  // namespace trainer

// Data-parallel gradient averaging that overlaps with backward. Every parameter's .grad is a view
// into one of a few flat buffers ("buckets" of about run.bucket_mb), so autograd accumulates
// straight into them; a hook on each parameter's gradient accumulator counts the bucket down,
// and a full bucket's all-reduce starts at once while backward goes on computing the earlier layers.
//
// Buckets hold the parameters in reverse registration order (backward reaches the last layers
// first) and start strictly in index order on every rank, so the collectives pair up even when a
// parameter gets no gradient on some rank (an idle MoE expert): its bucket then waits for finish().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace trainer {

class Communicator;
class PendingCollective;

class GradBuckets {
 public:
  // params: the model's parameters in registration order (all on one device, same dtype).
  GradBuckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes, Communicator& comm);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Zeroes every gradient (replaces zero_grad, which would detach .grad from the buckets).
  void zero();
  // Whether the coming backward communicates: only the last micro-step of gradient accumulation.
  void arm();
  // After the armed backward: starts the buckets not yet started (in order), waits for all, and
  // divides by the world size. Every .grad then holds the average over ranks.
  void finish();

  size_t bucket_count() const { return buckets_.size(); }
  // For tests: how many buckets the last armed backward had started by the time finish() ran.
  size_t started_before_finish() const { return started_before_finish_; }

  // Called by the hook of parameter `index` once its gradient is accumulated (autograd's thread).
  void on_grad_ready(size_t index);

 private:
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> params;  // indices into params_
    size_t pending = 0;          // params not ready yet in this backward
    std::unique_ptr<PendingCollective> inflight;
  };
  void start_ready_buckets_locked();
  void start_locked(size_t b);

  std::vector<at::Tensor> params_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // each parameter's AccumulateGrad
  std::vector<uintptr_t> hook_keys_;
  std::vector<size_t> bucket_of_;  // param index → bucket
  std::vector<bool> ready_;        // param index → gradient accumulated in this backward
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  std::mutex mu_;
  bool armed_ = false;
  size_t next_to_start_ = 0;
  size_t started_before_finish_ = 0;
};

}  // namespace trainer

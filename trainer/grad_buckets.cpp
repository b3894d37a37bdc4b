#include "trainer/grad_buckets.h"

#include "trainer/comm.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <stdexcept>

namespace trainer {
namespace {

// A post hook of the parameter's AccumulateGrad node: runs once that node has added this
// backward's gradient into the parameter's .grad (the hook c10d's own DDP reducer uses).
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(GradBuckets* owner, size_t index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner_->on_grad_ready(index_);
    return outputs;
  }

 private:
  GradBuckets* owner_;
  size_t index_;
};

}  // namespace

GradBuckets::GradBuckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes, Communicator& comm)
    : params_(params), bucket_of_(params.size()), ready_(params.size(), false), comm_(comm) {
  torch::NoGradGuard no_grad;
  // Assign in reverse registration order; a bucket closes when the next parameter would overflow it
  // or has another dtype.
  std::vector<std::vector<size_t>> groups;
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool dtype_change = !groups.empty() && params_[groups.back().front()].scalar_type() != p.scalar_type();
    if (groups.empty() || dtype_change || (filled > 0 && filled + bytes > bucket_bytes)) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(k);
    filled += bytes;
  }
  buckets_.resize(groups.size());
  for (size_t b = 0; b < groups.size(); ++b) {
    int64_t numel = 0;
    for (size_t k : groups[b]) numel += params_[k].numel();
    Bucket& bucket = buckets_[b];
    bucket.flat = torch::zeros({numel}, params_[groups[b].front()].options());
    bucket.params = groups[b];
    int64_t off = 0;
    for (size_t k : groups[b]) {
      auto& p = params_[k];
      // The gradient is a view of the bucket: autograd accumulates into it in place.
      p.mutable_grad() = bucket.flat.narrow(0, off, p.numel()).view_as(p);
      off += p.numel();
      bucket_of_[k] = b;
    }
  }
  // The parameter holds its accumulator node weakly; holding it here keeps node and hook alive.
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(this, k)));
    accumulators_.push_back(std::move(acc));
  }
}

GradBuckets::~GradBuckets() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

void GradBuckets::zero() {
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) b.flat.zero_();
}

void GradBuckets::arm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  next_to_start_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : buckets_) b.pending = b.params.size();
}

void GradBuckets::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;  // an earlier micro-step of gradient accumulation: keep accumulating
  if (ready_[index]) {
    // A second accumulation after its bucket may already be on the wire would be lost.
    throw std::logic_error("a parameter's gradient was accumulated twice in one backward; data-parallel "
                           "buckets need each parameter used in one place of the graph");
  }
  ready_[index] = true;
  --buckets_[bucket_of_[index]].pending;
  start_ready_buckets_locked();
}

void GradBuckets::start_ready_buckets_locked() {
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].pending == 0) start_locked(next_to_start_++);
}

void GradBuckets::start_locked(size_t b) {
  buckets_[b].inflight = comm_.start_all_reduce_sum(buckets_[b].flat, "averaging gradients (bucket " +
                                                                          std::to_string(b + 1) + " of " +
                                                                          std::to_string(buckets_.size()) + ")");
}

void GradBuckets::finish() {
  std::vector<std::unique_ptr<PendingCollective>> inflight;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!armed_) throw std::logic_error("GradBuckets::finish without arm");
    armed_ = false;
    started_before_finish_ = next_to_start_;
    // Parameters that got no gradient on this rank contribute their zeros.
    while (next_to_start_ < buckets_.size()) start_locked(next_to_start_++);
    for (auto& b : buckets_) inflight.push_back(std::move(b.inflight));
  }
  for (auto& f : inflight) f->wait();
  torch::NoGradGuard no_grad;
  const double inv = 1.0 / comm_.world();
  for (auto& b : buckets_) b.flat.mul_(inv);
}

}  // namespace trainer

#include "trainer/comm.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(DD_HAVE_CUDA)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>

namespace trainer {

struct Rendezvous::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // HashStore, or this process's TCPStore (node 0: the server)
  // TCP only: every rank thread gets its own client connection, because one TCPStore client
  // serialises its requests and a rank blocked in wait() would hold up the others' set().
  std::string addr;
  int port = 0;
  std::string prefix;  // every key under it (Rendezvous::tcp's prefix), or none
  // `rank_timeout`: the run's collective timeout (the nodes may have met with a longer one).
  c10::intrusive_ptr<c10d::Store> store_for_rank(std::chrono::milliseconds rank_timeout) const {
    if (addr.empty()) return store;
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = rank_timeout;
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(addr, o);
    if (prefix.empty()) return tcp;
    return c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
  }
};

std::shared_ptr<Rendezvous> Rendezvous::in_process() {
  auto r = std::make_shared<Rendezvous>();
  r->impl = std::make_shared<Impl>();
  r->impl->store = c10::make_intrusive<c10d::HashStore>();
  return r;
}

std::shared_ptr<Rendezvous> Rendezvous::tcp(const std::string& addr, int port, bool serve, int nodes,
                                           std::chrono::milliseconds timeout, const std::string& prefix) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = serve;
  o.numWorkers = static_cast<std::size_t>(nodes);
  o.waitWorkers = false;
  o.timeout = timeout;
  auto r = std::make_shared<Rendezvous>();
  r->impl = std::make_shared<Impl>();
  r->impl->addr = addr;
  r->impl->port = port;
  r->impl->prefix = prefix;
  try {
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(addr, o);
    r->impl->store = tcp;
    if (!prefix.empty()) r->impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(serve ? "serving" : "reaching") + " the rendezvous store at " + addr + ":" +
                             std::to_string(port) + " failed: " + e.what());
  }
  return r;
}

namespace {

// Text values in a c10d store: set, and wait-then-get.
void put_text(c10d::Store& store, const std::string& key, const std::string& text) {
  store.set(key, std::vector<uint8_t>(text.begin(), text.end()));
}
std::string wait_text(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  store.wait({key}, timeout);
  auto bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

std::vector<std::string> Rendezvous::exchange(const std::string& key, int node, int nodes, const std::string& value,
                                              std::chrono::milliseconds timeout) {
  publish(key, node, value);
  std::vector<std::string> out;
  for (int n = 0; n < nodes; ++n) out.push_back(value_of(key, n, timeout));
  return out;
}

void Rendezvous::publish(const std::string& key, int node, const std::string& value) {
  put_text(*impl->store, key + "/" + std::to_string(node), value);
}

std::string Rendezvous::value_of(const std::string& key, int node, std::chrono::milliseconds timeout) {
  return wait_text(*impl->store, key + "/" + std::to_string(node), timeout);
}

namespace {

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

class Done : public PendingCollective {
 public:
  void wait() override {}
};

class SingleRank : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void all_reduce_sum(std::vector<at::Tensor>&, const std::string&) override {}
  std::unique_ptr<PendingCollective> start_all_reduce_sum(const at::Tensor&, const std::string&) override {
    return std::make_unique<Done>();
  }
  void broadcast(std::vector<at::Tensor>&, int, const std::string&) override {}
  void barrier(const std::string&) override {}
  void reduce_scatter_sum(at::Tensor& shard, const at::Tensor& flat, const std::string&) override { shard.copy_(flat); }
  void all_gather(at::Tensor& flat, const at::Tensor& shard, const std::string&) override { flat.copy_(shard); }
  std::vector<std::string> gather_text(const std::string&, const std::string& text) override { return {text}; }
  std::string broadcast_text(const std::string&, const std::string& text, const std::string&) override { return text; }
  void raise_flag(const std::string& name, const std::string& value) override { flags_[name] = value; }
  std::optional<std::string> flag(const std::string& name) override {
    auto it = flags_.find(name);
    return it == flags_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  void abort(const std::string&) override {}

 private:
  std::map<std::string, std::string> flags_;
};

class C10dGroup : public Communicator {
 public:
  C10dGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend, int rank, int world,
            std::chrono::milliseconds timeout)
      : store_(std::move(store)), backend_(std::move(backend)), rank_(rank), world_(world), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& what) override {
    guarded(what, [&] {
      // One collective per tensor, all launched before the first wait.
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        works.push_back(backend_->allreduce(one, c10d::AllreduceOptions{}));
      }
      for (auto& w : works) w->wait(timeout_);
    });
  }

  std::unique_ptr<PendingCollective> start_all_reduce_sum(const at::Tensor& flat, const std::string& what) override {
    c10::intrusive_ptr<c10d::Work> work;
    guarded(what, [&] {
      std::vector<at::Tensor> one{flat};
      work = backend_->allreduce(one, c10d::AllreduceOptions{});
    });
    return std::make_unique<InFlight>(this, std::move(work), what);
  }

  void broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& what) override {
    guarded(what, [&] {
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        backend_->broadcast(one, o)->wait(timeout_);
      }
    });
  }

  void barrier(const std::string& what) override {
    guarded(what, [&] {
      // A one-element all-reduce: works the same on Gloo and NCCL and respects the timeout.
      std::vector<at::Tensor> t{at::zeros({1}, at::TensorOptions().device(device_of_backend()))};
      backend_->allreduce(t, c10d::AllreduceOptions{})->wait(timeout_);
    });
  }

  void reduce_scatter_sum(at::Tensor& shard, const at::Tensor& flat, const std::string& what) override {
    guarded(what, [&] { backend_->_reduce_scatter_base(shard, const_cast<at::Tensor&>(flat))->wait(timeout_); });
  }

  void all_gather(at::Tensor& flat, const at::Tensor& shard, const std::string& what) override {
    guarded(what, [&] { backend_->_allgather_base(flat, const_cast<at::Tensor&>(shard))->wait(timeout_); });
  }

  std::vector<std::string> gather_text(const std::string& key, const std::string& text) override {
    std::vector<std::string> out;
    guarded("gathering " + key, [&] {
      put_text(*store_, "gather/" + key + "/" + std::to_string(rank_), text);
      if (rank_ != 0) return;
      for (int r = 0; r < world_; ++r) {
        const std::string k = "gather/" + key + "/" + std::to_string(r);
        out.push_back(wait_text(*store_, k, timeout_));
        // Only rank 0 reads these keys: drop them so the store does not grow with the run.
        store_->deleteKey(k);
      }
    });
    return out;
  }

  std::string broadcast_text(const std::string& key, const std::string& text, const std::string& forget_key) override {
    std::string out;
    guarded("agreeing on " + key, [&] {
      const std::string k = "bcast/" + key;
      if (rank_ == 0) {
        put_text(*store_, k, text);
        if (!forget_key.empty()) store_->deleteKey("bcast/" + forget_key);
        out = text;
        return;
      }
      out = wait_text(*store_, k, timeout_);
    });
    return out;
  }

  void raise_flag(const std::string& name, const std::string& value) override {
    guarded("raising " + name, [&] { put_text(*store_, "flag/" + name, value); });
  }
  std::optional<std::string> flag(const std::string& name) override {
    std::optional<std::string> out;
    guarded("reading " + name, [&] {
      const std::string k = "flag/" + name;
      if (!store_->check({k})) return;
      auto bytes = store_->get(k);
      out = std::string(bytes.begin(), bytes.end());
    });
    return out;
  }

  void set_device(const c10::Device& d) { device_ = d; }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lk(abort_mu_);
      if (aborted_) return;
      abort_reason_ = reason;
      aborted_ = true;
    }
    if (device_.is_cuda()) backend_->abort();
  }

 private:
  class InFlight : public PendingCollective {
   public:
    InFlight(C10dGroup* group, c10::intrusive_ptr<c10d::Work> work, std::string what)
        : group_(group), work_(std::move(work)), what_(std::move(what)) {}
    void wait() override {
      if (!work_) return;
      auto work = std::move(work_);
      group_->guarded(what_, [&] { work->wait(group_->timeout_); });
    }

   private:
    C10dGroup* group_;
    c10::intrusive_ptr<c10d::Work> work_;
    std::string what_;
  };

  template <typename F>
  void guarded(const std::string& what, F&& f) {
    auto fail = [&](std::string why) {
      if (why.find("timed out") != std::string::npos || why.find("Timed out") != std::string::npos)
        why += " (no answer within run.collective_timeout_s = " + std::to_string(timeout_.count() / 1000) +
               " s: a peer rank is hung, gone or far behind)";
      return std::runtime_error("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " on " +
                                host_name() + ": " + what + " failed: " + why);
    };
    if (aborted_) {
      std::lock_guard<std::mutex> lk(abort_mu_);
      throw fail("stopped because " + abort_reason_);
    }
    try {
      f();
    } catch (const c10::Error& e) {
      throw fail(e.what_without_backtrace());  // c10's what() appends a stack trace
    } catch (const std::exception& e) {
      throw fail(e.what());
    }
  }
  c10::Device device_of_backend() const { return device_; }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  c10::Device device_{c10::kCPU};
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

}  // namespace

std::unique_ptr<Communicator> Communicator::single() { return std::make_unique<SingleRank>(); }

std::unique_ptr<Communicator> Communicator::join(const std::shared_ptr<Rendezvous>& rendezvous, int rank, int world,
                                                 const c10::Device& device, std::chrono::milliseconds timeout) {
  if (world == 1) return single();
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    store = c10::make_intrusive<c10d::PrefixStore>(device.is_cuda() ? "nccl" : "gloo",
                                                   rendezvous->impl->store_for_rank(timeout));
    if (device.is_cuda()) {
#if defined(DD_HAVE_CUDA)
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
#else
      throw std::runtime_error("this build has no CUDA");
#endif
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create_default(timeout);
      backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(rank) + " of " + std::to_string(world) + " on " + host_name() +
                             ": joining the " + (device.is_cuda() ? "NCCL" : "Gloo") + " group failed: " + e.what());
  }
  auto group = std::make_unique<C10dGroup>(store, backend, rank, world, timeout);
  group->set_device(device);
  return group;
}

}  // namespace trainer

// GradBuckets: gradients averaged in buckets that start during backward, in the same order on
// every rank. A stand-in communicator plays "the other rank" so the averaging is checked exactly.
#include "trainer/comm.h"
#include "trainer/grad_buckets.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace {

// World 2 where the peer's gradient is always `peer_value` everywhere. Records which bucket
// (by its size) started, in order.
class FakePeer : public trainer::Communicator {
 public:
  explicit FakePeer(double peer_value) : peer_value_(peer_value) {}
  int rank() const override { return 0; }
  int world() const override { return 2; }
  std::unique_ptr<trainer::PendingCollective> start_all_reduce_sum(const at::Tensor& flat,
                                                                   const std::string&) override {
    started_sizes.push_back(flat.numel());
    struct Pending : trainer::PendingCollective {
      at::Tensor t;
      double v;
      void wait() override { t.add_(v); }
    };
    auto p = std::make_unique<Pending>();
    p->t = flat;
    p->v = peer_value_;
    return p;
  }
  void all_reduce_sum(std::vector<at::Tensor>&, const std::string&) override {}
  void broadcast(std::vector<at::Tensor>&, int, const std::string&) override {}
  void barrier(const std::string&) override {}
  void reduce_scatter_sum(at::Tensor&, const at::Tensor&, const std::string&) override {}
  void all_gather(at::Tensor&, const at::Tensor&, const std::string&) override {}
  std::vector<std::string> gather_text(const std::string&, const std::string& t) override { return {t}; }
  void abort(const std::string&) override {}
  std::string broadcast_text(const std::string&, const std::string& t, const std::string&) override { return t; }
  void raise_flag(const std::string&, const std::string&) override {}
  std::optional<std::string> flag(const std::string&) override { return std::nullopt; }
  std::vector<int64_t> started_sizes;

 private:
  double peer_value_;
};

struct Net {
  std::vector<torch::Tensor> params;
  explicit Net(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      params.push_back(torch::randn({widths[i + 1], widths[i]}).requires_grad_(true));
  }
  torch::Tensor loss(const torch::Tensor& x) const {
    auto h = x;
    for (const auto& w : params) h = torch::tanh(torch::matmul(h, w.t()));
    return h.pow(2).sum();
  }
  std::vector<torch::Tensor> reference_grads(const torch::Tensor& x) const {
    std::vector<torch::Tensor> detached;
    for (const auto& w : params) detached.push_back(w.detach().clone().requires_grad_(true));
    auto h = x;
    for (const auto& w : detached) h = torch::tanh(torch::matmul(h, w.t()));
    return torch::autograd::grad({h.pow(2).sum()}, detached);
  }
};

}  // namespace

TEST(GradBuckets, BucketsStartDuringBackwardAndAverageWithThePeer) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 11);
  Net net({37, 64, 64, 64, 5});
  FakePeer peer(0.25);
  // 64×64 floats = 16 KiB per hidden matrix; buckets of 16 KiB hold about one each.
  trainer::GradBuckets buckets(net.params, 16 * 1024, peer);
  ASSERT_GE(buckets.bucket_count(), 3u);
  auto x = torch::randn({8, 37});
  const auto ref = net.reference_grads(x);
  buckets.arm();
  net.loss(x).backward();
  buckets.finish();
  // Hooks only run inside backward: these buckets were on the wire while earlier layers computed.
  EXPECT_GE(buckets.started_before_finish(), buckets.bucket_count() - 1);
  ASSERT_EQ(peer.started_sizes.size(), buckets.bucket_count());
  // The last layer's bucket first (backward reaches it first).
  EXPECT_EQ(peer.started_sizes.front(), 5 * 64);
  for (size_t i = 0; i < net.params.size(); ++i) {
    auto expected = (ref[i] + 0.25) / 2.0;
    EXPECT_TRUE(torch::allclose(net.params[i].grad(), expected, 1e-6, 1e-6)) << "parameter " << i;
  }
}

TEST(GradBuckets, AccumulatesEarlierMicroStepsAndCommunicatesOnce) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 12);
  Net net({9, 16, 16, 3});
  FakePeer peer(0.0);
  trainer::GradBuckets buckets(net.params, 1, peer);  // one parameter per bucket
  auto x1 = torch::randn({4, 9}), x2 = torch::randn({4, 9});
  const auto r1 = net.reference_grads(x1), r2 = net.reference_grads(x2);
  buckets.zero();
  net.loss(x1).backward();  // not armed: accumulates only
  EXPECT_TRUE(peer.started_sizes.empty());
  buckets.arm();
  net.loss(x2).backward();
  buckets.finish();
  EXPECT_EQ(peer.started_sizes.size(), net.params.size());
  for (size_t i = 0; i < net.params.size(); ++i)
    EXPECT_TRUE(torch::allclose(net.params[i].grad(), (r1[i] + r2[i]) / 2.0, 1e-5, 1e-6)) << "parameter " << i;
  // zero() clears the views in place; the next step starts from nothing.
  buckets.zero();
  for (const auto& p : net.params) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
}

TEST(GradBuckets, AParameterWithoutGradientStillSendsItsBucketInOrder) {
  torch::manual_seed(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) + 13);
  Net net({6, 8, 4});
  auto idle = torch::randn({7, 3}).requires_grad_(true);  // registered first: its bucket is started last
  std::vector<torch::Tensor> all{idle, net.params[0], net.params[1]};
  FakePeer peer(1.0);
  trainer::GradBuckets buckets(all, 1, peer);
  buckets.arm();
  net.loss(torch::randn({2, 6})).backward();
  buckets.finish();
  EXPECT_EQ(buckets.started_before_finish(), 2u);  // the idle parameter's bucket waited for finish()
  ASSERT_EQ(peer.started_sizes, (std::vector<int64_t>{4 * 8, 8 * 6, 7 * 3}));
  // The idle parameter averages zeros with the peer's ones.
  EXPECT_TRUE(torch::allclose(idle.grad(), torch::full({7, 3}, 0.5)));
}

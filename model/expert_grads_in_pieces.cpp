#include "model/expert_grads_in_pieces.h"

#include <ATen/ATen.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "model/expert_product.h"
#include "model/grad_square_sums.h"

namespace model {

namespace {

// One product's weights and their gradients' pieces.
struct Group {
  std::vector<at::Tensor> weights;
  std::vector<ExpertGradPieces> grads;  // one per weight
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<int, int>, int> on;  // (device type, index) -> open scopes
  std::vector<std::unique_ptr<Group>> groups;
  std::unordered_map<const c10::TensorImpl*, std::pair<Group*, size_t>> by_weight;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::atomic<bool> allowed{true};
std::atomic<int64_t> recorded{0};

std::pair<int, int> key_of(const at::Device& d) { return {static_cast<int>(d.type()), d.has_index() ? d.index() : -1}; }

// Takes the groups matching `pred` out of the registry (caller holds the lock).
template <typename Pred>
std::vector<std::unique_ptr<Group>> take_groups(Registry& r, Pred pred) {
  std::vector<std::unique_ptr<Group>> taken;
  for (auto it = r.groups.begin(); it != r.groups.end();) {
    if (pred(**it)) {
      for (const auto& w : (*it)->weights) r.by_weight.erase(w.unsafeGetTensorImpl());
      taken.push_back(std::move(*it));
      it = r.groups.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

// Takes the groups holding any of `weights` out of the registry (caller holds the lock).
std::vector<std::unique_ptr<Group>> take_groups_of(Registry& r, const std::vector<at::Tensor>& weights) {
  std::set<const Group*> wanted;
  for (const auto& w : weights) {
    auto it = r.by_weight.find(w.unsafeGetTensorImpl());
    if (it != r.by_weight.end()) wanted.insert(it->second.first);
  }
  if (wanted.empty()) return {};
  return take_groups(r, [&](const Group& g) { return wanted.count(&g) > 0; });
}

void scatter_groups(std::vector<std::unique_ptr<Group>>& groups) {
  for (auto& g : groups) {
    const ExpertGradPieces& first = g->grads.front();
    scatter_expert_weight_grads(g->weights, first.pieces, first.first, first.count);
  }
}

}  // namespace

// The norm of gradients in pieces can only come from their recorded sums, so the pieces also need
// producer sums allowed (`bench train --grad-norm read` then really reads every gradient).
ExpertGradsInPiecesScope::ExpertGradsInPiecesScope(const at::Device& device, bool on)
    : device_(device), on_(on && allowed && producer_grad_square_sums_allowed()) {
  if (!on_) return;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.on[key_of(device_)];
}

ExpertGradsInPiecesScope::~ExpertGradsInPiecesScope() {
  if (!on_) return;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // Scopes nest: the outermost one's end forgets the device's pieces.
  if (--r.on[key_of(device_)] > 0) return;
  r.on.erase(key_of(device_));
  take_groups(r, [&](const Group& g) { return g.grads.front().pieces.device() == device_; });
}

bool expert_grads_in_pieces(const at::Device& device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.on.count(key_of(device)) > 0;
}

void record_expert_grad_pieces(const std::vector<at::Tensor>& weights, const at::Tensor& pieces, const at::Tensor& first,
                               const at::Tensor& count, const at::Tensor& sums) {
  TORCH_CHECK(!weights.empty() && pieces.dim() == 3 && sums.dim() == 1 && sums.size(0) == static_cast<int64_t>(weights.size()) &&
                  sums.scalar_type() == at::kDouble,
              "record_expert_grad_pieces: expected pieces [G, N, K] and fp64 sums [", weights.size(), "], got ",
              pieces.sizes(), " and ", sums.sizes(), " ", sums.scalar_type());
  auto group = std::make_unique<Group>();
  group->weights = weights;
  int64_t row = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const int64_t rows = weights[i].size(1);
    group->grads.push_back({pieces, first, count, row, rows, sums[static_cast<int64_t>(i)]});
    row += rows;
  }
  TORCH_CHECK(row == pieces.size(1), "record_expert_grad_pieces: the weights' rows sum to ", row, ", the pieces have ",
              pieces.size(1));
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  TORCH_CHECK(r.on.count(key_of(pieces.device())) > 0, "record_expert_grad_pieces: not inside an ExpertGradsInPiecesScope on ",
              pieces.device());
  // Every check before the first entry, so a refused group leaves nothing behind.
  std::set<const c10::TensorImpl*> seen;
  for (const auto& w : weights) {
    TORCH_CHECK(seen.insert(w.unsafeGetTensorImpl()).second, "record_expert_grad_pieces: a weight appears twice");
    TORCH_CHECK(r.by_weight.count(w.unsafeGetTensorImpl()) == 0,
                "record_expert_grad_pieces: a weight already has a gradient in pieces (materialize it first)");
  }
  for (size_t i = 0; i < weights.size(); ++i) r.by_weight[weights[i].unsafeGetTensorImpl()] = {group.get(), i};
  r.groups.push_back(std::move(group));
  ++recorded;
}

int64_t expert_grad_pieces_recorded() { return recorded; }

const ExpertGradPieces* expert_grad_pieces_of(const at::Tensor& param) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_weight.find(param.unsafeGetTensorImpl());
  if (it == r.by_weight.end()) return nullptr;
  return &it->second.first->grads[it->second.second];
}

int64_t materialize_expert_grad_pieces() {
  std::vector<std::unique_ptr<Group>> groups;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    groups = take_groups(r, [](const Group&) { return true; });
  }
  int64_t n = 0;
  for (const auto& g : groups) n += static_cast<int64_t>(g->weights.size());
  scatter_groups(groups);
  return n;
}

void materialize_expert_grad_pieces(const std::vector<at::Tensor>& weights) {
  std::vector<std::unique_ptr<Group>> groups;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    groups = take_groups_of(r, weights);
  }
  scatter_groups(groups);
}

void materialize_expert_grad_pieces_beside_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> both;
  for (const auto& p : params)
    if (p.grad().defined() && expert_grad_pieces_of(p) != nullptr) both.push_back(p);
  if (!both.empty()) materialize_expert_grad_pieces(both);
}

void forget_expert_grad_pieces(const std::vector<at::Tensor>& weights) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  take_groups_of(r, weights);
}

void expert_grads_in_pieces_allowed(bool on) { allowed = on; }

}  // namespace model

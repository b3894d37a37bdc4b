#include "model/weight_shadow.h"

#include <torch/torch.h>

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "model/mixed_linear.h"

#include "model/layers.h"

namespace model {

namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// One product's weights and their shadow. The weights are held weakly: a shadow never keeps a
// dropped model's parameters alive, and an expired one is pruned.
struct Group {
  std::vector<WeakImpl> weights;
  std::vector<int64_t> versions;       // each weight's version when the shadow was last written whole
  std::vector<const void*> data;       // and its data pointer then
  std::vector<int64_t> row_offsets;    // each weight's first row in the buffer (per expert when stacked)
  int64_t rows = 0;                    // Σ out_i
  at::Tensor buffer;                   // [Σ out_i, in], or [E, Σ out_i, in] for experts, in the group's dtype;
                                       // plain weights' may have zero rows past Σ out_i (padded_rows)
  bool current = false;                // false: recast before the next use (invalidate_weight_shadows)
};

// Key: the first weight's TensorImpl, the number of weights, the dtype.
using Key = std::tuple<const c10::TensorImpl*, size_t, at::ScalarType>;

std::mutex mu;
std::map<Key, Group> groups;
// Each shadowed weight's group and place in it, for the optimizer's lookups (every step).
std::map<const c10::TensorImpl*, std::pair<Key, size_t>> owners;
std::atomic<bool> enabled{true};
std::atomic<int64_t> casts{0};

bool same_weights(const Group& g, at::TensorList weights) {
  if (g.weights.size() != weights.size()) return false;
  for (size_t i = 0; i < weights.size(); ++i) {
    auto held = g.weights[i].lock();
    if (!held || held.get() != weights[i].unsafeGetTensorImpl()) return false;
  }
  return true;
}

// Whether the shadow still holds the weights' values (they are alive, unchanged through ATen, not swapped).
bool up_to_date(const Group& g) {
  if (!g.current) return false;
  for (size_t i = 0; i < g.weights.size(); ++i) {
    auto held = g.weights[i].lock();
    if (!held) return false;
    at::Tensor w(held);
    if (w._version() != g.versions[i] || w.data_ptr() != g.data[i]) return false;
  }
  return true;
}

// Casts the weights into the group's buffer and records what it now matches.
// The buffer's version goes up as an in-place op's would: a backward that saved the old shadow
// then fails autograd's check instead of using the new values. While a CUDA graph is being
// captured the cast is only recorded, not run: the group stays stale on the host (a failed
// capture's eager fallback, or the refresh before the first replay, casts it for real).
void recast(Group& g, at::TensorList weights) {
  torch::NoGradGuard no_grad;  // the cat fallback must not record autograd history into the buffer
  at::Tensor weight_rows = g.buffer.size(-2) == g.rows ? g.buffer : g.buffer.narrow(-2, 0, g.rows);
  cast_weight_blocks_into(weight_rows, weights);
  g.buffer.unsafeGetTensorImpl()->bump_version();
  ++casts;
  if (g.buffer.is_cuda() && cuda_stream_capturing()) return;
  for (size_t i = 0; i < weights.size(); ++i) {
    g.versions[i] = weights[i]._version();
    g.data[i] = weights[i].data_ptr();
  }
  g.current = true;
}

void erase_group(std::map<Key, Group>::iterator it) {
  for (auto o = owners.begin(); o != owners.end();) o = o->second.first == it->first ? owners.erase(o) : std::next(o);
  groups.erase(it);
}

bool expired(const Group& g) {
  for (const auto& w : g.weights)
    if (w.expired()) return true;
  return false;
}

void prune_expired() {
  for (auto it = groups.begin(); it != groups.end();) {
    if (expired(it->second)) erase_group(it++);
    else ++it;
  }
}

// Both kinds of groups: plain weights [out_i, in] (dims 2) or stacked experts [E, out_i, in] (dims 3).
at::Tensor shadowed_blocks(at::TensorList weights, at::ScalarType dtype, int64_t dims, int64_t padded_rows) {
  TORCH_CHECK(!weights.empty(), "shadowed_weight_blocks: no weights");
  // Any device: the trainer only reaches this on a GPU (model/mixed_linear.h), and on the CPU the
  // same bookkeeping is tested without one.
  bool fits = enabled && (dtype == at::kBFloat16 || dtype == at::kHalf);
  for (const auto& w : weights)
    fits = fits && w.scalar_type() == at::kFloat && w.dim() == dims && w.is_contiguous() &&
           w.device() == weights[0].device() && w.size(-1) == weights[0].size(-1) &&
           (dims == 2 || w.size(0) == weights[0].size(0));  // experts stack per expert: one E
  if (!fits) return cast_weight_blocks(weights, dtype);
  std::lock_guard<std::mutex> lock(mu);
  const Key key{weights[0].unsafeGetTensorImpl(), weights.size(), dtype};
  auto it = groups.find(key);
  // A group whose weights are gone (a dropped model whose TensorImpl's address came back) goes.
  if (it != groups.end() && expired(it->second)) {
    erase_group(it);
    it = groups.end();
  }
  // The same first weight in another grouping: no shadow (live groups are never erased here, as a
  // captured graph may hold their buffers).
  if (it != groups.end() && !same_weights(it->second, weights)) return cast_weight_blocks(weights, dtype);
  if (it == groups.end()) {
    // A graph being captured must not allocate memory that outlives it: cast as before.
    if (weights[0].is_cuda() && cuda_stream_capturing()) return cast_weight_blocks(weights, dtype);
    prune_expired();  // first: a dropped weight's owner entry must not claim a new weight at its address
    // A weight already shadowed in another group: the optimizer writes one shadow per weight, so
    // a second one would go stale unseen. Cast as before.
    for (const auto& w : weights)
      if (owners.count(w.unsafeGetTensorImpl())) return cast_weight_blocks(weights, dtype);
    Group g;
    int64_t rows = 0;
    for (const auto& w : weights) {
      g.weights.emplace_back(w.getIntrusivePtr());
      g.row_offsets.push_back(rows);
      rows += w.size(-2);
    }
    g.versions.assign(weights.size(), -1);
    g.data.assign(weights.size(), nullptr);
    g.rows = rows;
    const int64_t buffer_rows = dims == 2 && padded_rows > rows ? padded_rows : rows;
    std::vector<int64_t> shape{buffer_rows, weights[0].size(-1)};
    if (dims == 3) shape.insert(shape.begin(), weights[0].size(0));
    g.buffer = torch::empty(shape, weights[0].options().dtype(dtype));
    if (buffer_rows > rows) g.buffer.narrow(0, rows, buffer_rows - rows).zero_();
    it = groups.emplace(key, std::move(g)).first;
    for (size_t i = 0; i < weights.size(); ++i) owners[weights[i].unsafeGetTensorImpl()] = {key, i};
  }
  Group& g = it->second;
  if (!up_to_date(g)) recast(g, weights);
  // The padding's rows only for a caller that asks for that width.
  if (g.buffer.size(-2) == g.rows || g.buffer.size(-2) == padded_rows) return g.buffer;
  return g.buffer.narrow(-2, 0, g.rows);
}

}  // namespace

at::Tensor shadowed_weight_blocks(at::TensorList weights, at::ScalarType dtype, int64_t padded_rows) {
  return shadowed_blocks(weights, dtype, 2, padded_rows);
}

at::Tensor shadowed_expert_blocks(at::TensorList weights, at::ScalarType dtype) {
  return shadowed_blocks(weights, dtype, 3, 0);
}

at::Tensor weight_shadow_of(const at::Tensor& weight) {
  if (!enabled || !weight.defined()) return {};
  std::lock_guard<std::mutex> lock(mu);
  const c10::TensorImpl* impl = weight.unsafeGetTensorImpl();
  auto o = owners.find(impl);
  if (o == owners.end()) return {};
  auto it = groups.find(o->second.first);
  const size_t i = o->second.second;
  if (it == groups.end() || i >= it->second.weights.size()) return {};
  auto held = it->second.weights[i].lock();
  if (!held || held.get() != impl) return {};
  // A stacked group's block is contiguous per expert only (AdamW writes it in runs).
  return it->second.buffer.narrow(-2, it->second.row_offsets[i], weight.size(-2));
}

void refresh_weight_shadows() {
  std::lock_guard<std::mutex> lock(mu);
  prune_expired();
  for (auto& [key, g] : groups) {
    if (up_to_date(g)) continue;
    std::vector<at::Tensor> weights;
    for (const auto& w : g.weights) weights.emplace_back(w.lock());
    recast(g, weights);
  }
}

void release_weight_shadows(const std::vector<at::Tensor>& weights) {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& w : weights) {
    if (!w.defined()) continue;
    auto o = owners.find(w.unsafeGetTensorImpl());
    if (o == owners.end()) continue;
    auto it = groups.find(o->second.first);
    if (it != groups.end()) erase_group(it);
    else owners.erase(o);
  }
}

void invalidate_weight_shadows() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [key, g] : groups) g.current = false;
}

void weight_shadows(bool on) {
  // Switched off, the optimizer stops writing the shadows: whatever is kept is stale from then on.
  if (!on) invalidate_weight_shadows();
  enabled = on;
}

void clear_weight_shadows() {
  std::lock_guard<std::mutex> lock(mu);
  owners.clear();
  groups.clear();
}

int64_t weight_shadow_groups() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<int64_t>(groups.size());
}

int64_t weight_shadow_casts() { return casts; }

}  // namespace model

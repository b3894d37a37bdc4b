#include "model/grad_square_sums.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <map>
#include <unordered_map>

#include "model/expert_grads_in_pieces.h"

namespace model {

namespace {

struct Recorded {
  at::Tensor grad;  // held, so its address cannot be reused by another gradient while recorded
  int64_t grad_version = 0;
  at::Tensor square_sum;
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<int, int>, int> collecting;  // (device type, index) -> open scopes
  std::unordered_map<const c10::TensorImpl*, Recorded> sums;  // by parameter
};

std::atomic<bool> allowed{true};
std::atomic<int64_t> taken{0};

Registry& registry() {
  static Registry r;
  return r;
}

std::pair<int, int> key_of(const at::Device& d) { return {static_cast<int>(d.type()), d.has_index() ? d.index() : -1}; }

}  // namespace

void collect_grad_square_sums(const at::Device& device, bool on) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // Nested starts and ends count; the sums are forgotten where collection begins and ends.
  int& open = r.collecting[key_of(device)];
  open += on ? 1 : -1;
  if (open < 0) open = 0;
  if ((on && open > 1) || (!on && open > 0)) return;
  for (auto it = r.sums.begin(); it != r.sums.end();) {
    if (it->second.square_sum.device() == device) it = r.sums.erase(it);
    else ++it;
  }
  if (open == 0) r.collecting.erase(key_of(device));
}

bool grad_square_sums_collecting(const at::Device& device) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.collecting.count(key_of(device)) > 0;
}

void record_grad_square_sum(const at::Tensor& param, const at::Tensor& square_sum) {
  const at::Tensor& grad = param.grad();
  TORCH_CHECK(grad.defined(), "record_grad_square_sum: the parameter has no gradient");
  TORCH_CHECK(square_sum.dim() == 0 && square_sum.scalar_type() == at::kDouble && square_sum.device() == grad.device(),
              "record_grad_square_sum: expected a 0-dim fp64 sum on ", grad.device(), ", got ", square_sum.sizes(), " ",
              square_sum.scalar_type(), " on ", square_sum.device());
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.collecting.count(key_of(grad.device())) == 0) return;
  r.sums[param.unsafeGetTensorImpl()] = {grad, grad._version(), square_sum};
}

at::Tensor recorded_grad_square_sum(const at::Tensor& param) {
  const at::Tensor& grad = param.grad();
  const ExpertGradPieces* pieces = expert_grad_pieces_of(param);
  if (pieces != nullptr) {
    // A gradient left in pieces for the optimizer has its sum recorded with it; beside a defined
    // .grad neither alone is the gradient (the caller writes the pieces out first).
    if (grad.defined()) return {};
    ++taken;
    return pieces->square_sum;
  }
  if (!grad.defined()) return {};
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.sums.find(param.unsafeGetTensorImpl());
  if (it == r.sums.end() || !it->second.grad.is_same(grad) || it->second.grad_version != grad._version())
    return {};
  ++taken;
  return it->second.square_sum;
}

int64_t grad_square_sums_taken() { return taken; }

GradSquareSumsScope::GradSquareSumsScope(const at::Device& device, bool on) : device_(device), on_(on && allowed) {
  if (on_) collect_grad_square_sums(device_, true);
}

GradSquareSumsScope::~GradSquareSumsScope() {
  if (on_) collect_grad_square_sums(device_, false);
}

void producer_grad_square_sums(bool on) { allowed = on; }
bool producer_grad_square_sums_allowed() { return allowed; }

}  // namespace model

#include "trainer/graph_inputs.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/gdr_plan_slots.h"

namespace trainer {

int64_t graph_piece_room(int64_t B, int64_t first_pieces) {
  const int64_t room = std::max<int64_t>(2 * B, (3 * first_pieces + 1) / 2);
  return (room + 7) / 8 * 8;
}

GraphInputs::GraphInputs(int64_t B, int64_t T, bool packed, int64_t max_pieces, const c10::Device& device)
    : B_(B), T_(T), max_pieces_(packed ? max_pieces : 0), packed_(packed) {
  if (packed && max_pieces < B) throw std::invalid_argument("GraphInputs: room for fewer pieces than rows");
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
  tokens_ = torch::zeros({B, T}, i64);
  labels_ = torch::zeros({B, T}, i64);
  if (!packed) {
    positions_ = model::dense_positions(B, T, device);
    return;
  }
  // Until the first batch arrives: every row one document, the rest empty.
  auto cu = torch::full({max_pieces + 1}, B * T, torch::kInt64);
  cu.narrow(0, 0, B + 1).copy_(torch::arange(0, B * T + 1, T, torch::kInt64));
  positions_.pos = torch::arange(T, i64).repeat({B, 1});
  positions_.cu_seqlens = cu;
  positions_.cu_seqlens_device = cu.to(torch::TensorOptions().dtype(torch::kInt32).device(device));
  positions_.doc_ids = torch::arange(B, i64).repeat_interleave(T);
  positions_.max_seqlen = T;
  positions_.gdr_slots = std::make_shared<model::GdrPlanSlots>(B, T, max_pieces, device);
}

bool GraphInputs::take(const data::Batch& b) {
  if (b.inputs.size(0) != B_ || b.inputs.size(1) != T_ || b.cu_seqlens.defined() != packed_) {
    throw std::runtime_error("CUDA graph step: a batch of shape " + c10::str(b.inputs.sizes()) +
                             (b.cu_seqlens.defined() ? " with" : " without") +
                             " document boundaries, but the captured step takes [" + std::to_string(B_) + ", " +
                             std::to_string(T_) + "]" + (packed_ ? " with" : " without") +
                             " them (set train.cuda_graph = \"off\")");
  }
  tokens_.copy_(b.inputs, /*non_blocking=*/true);
  labels_.copy_(b.labels, /*non_blocking=*/true);
  if (!packed_) return true;
  auto cu = b.cu_seqlens.to(torch::kInt64).contiguous();
  const int64_t pieces = cu.size(0) - 1;
  if (pieces > max_pieces_) return false;
  // Validated and laid out on the host, then copied in from pinned memory (asynchronous; the
  // pinned buffers go back to the host allocator only once the copies are done).
  const auto host = model::packed_positions(cu, B_, T_, torch::kCPU);
  auto padded = torch::full({max_pieces_ + 1}, B_ * T_, torch::kInt32);
  padded.narrow(0, 0, pieces + 1).copy_(cu);
  auto staged = [&](const torch::Tensor& t) { return tokens_.is_cuda() ? t.pin_memory() : t; };
  positions_.pos.copy_(staged(host.pos), /*non_blocking=*/true);
  positions_.doc_ids.copy_(staged(host.doc_ids), /*non_blocking=*/true);
  positions_.cu_seqlens_device.copy_(staged(padded), /*non_blocking=*/true);
  positions_.cu_seqlens.copy_(padded);  // the host copy, for whoever reads it outside the graph
  positions_.gdr_slots->set_batch(positions_.cu_seqlens);
  return true;
}

}  // namespace trainer

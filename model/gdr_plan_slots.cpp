#include "model/gdr_plan_slots.h"

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "model/layers.h"

namespace model {
namespace {

// src (CPU) into the device buffer dst, without a host wait (pinned staging; see host_to_device).
void copy_in(torch::Tensor& dst, const torch::Tensor& src) {
  dst.copy_(dst.is_cuda() ? src.pin_memory() : src, /*non_blocking=*/true);
}

// gdr_chunk_token_rows's map of a host plan for H heads, [T, H] int32 on the CPU: token t at chunk
// slot n·C + c is row (n·H + h)·C + c of head h (model/gdr_chunk_layout.cpp's token_rows).
torch::Tensor host_token_rows(const GdrChunkLayout& l, int64_t H) {
  TORCH_CHECK(l.n_chunks * H * l.C < (int64_t{1} << 31), "GdrPlanSlots: at most 2^31 output rows, got ",
              l.n_chunks * H * l.C);
  const auto slot = l.token_slot.contiguous();
  const int64_t* s = slot.data_ptr<int64_t>();
  const int64_t T = slot.numel(), C = l.C;
  auto out = torch::empty({T, H}, torch::kInt32);
  int32_t* o = out.data_ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = s[t] / C, c = s[t] % C;
    for (int64_t h = 0; h < H; ++h) o[t * H + h] = static_cast<int32_t>((n * H + h) * C + c);
  }
  return out;
}

// GdrChunkLayout::row_map of a token-rows map (host_token_rows'), int32 on the CPU: the rows it
// names keep their index, the others (chunk padding) −1.
torch::Tensor host_row_map(const GdrChunkLayout& l, int64_t H, const torch::Tensor& token_rows) {
  auto out = torch::full({l.n_chunks * H * l.C}, -1, torch::kInt32);
  int32_t* o = out.data_ptr<int32_t>();
  const int32_t* r = token_rows.data_ptr<int32_t>();
  for (int64_t i = 0; i < token_rows.numel(); ++i) {
    TORCH_CHECK(o[r[i]] < 0, "GdrPlanSlots: the token rows name a row twice");
    o[r[i]] = r[i];
  }
  return out;
}

// The rows a row map (host_row_map's) leaves out, ascending, int32 on the CPU: every (token, head)
// names its own row, so there are n_chunks·H·C − T·H of them for any batch at a fixed capacity.
torch::Tensor host_pad_rows(const torch::Tensor& row_map, int64_t named) {
  auto out = torch::empty({row_map.numel() - named}, torch::kInt32);
  const int32_t* m = row_map.data_ptr<int32_t>();
  int32_t* o = out.data_ptr<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < row_map.numel(); ++i) {
    if (m[i] < 0) o[n++] = static_cast<int32_t>(i);
  }
  return out;
}

// The maps of one head count for the current plan into their device buffers.
void fill_head_maps(torch::Tensor& rows, torch::Tensor& pad_rows, torch::Tensor& row_map, const GdrChunkLayout& l,
                    int64_t H) {
  const auto host_rows = host_token_rows(l, H);
  const auto host_map = host_row_map(l, H, host_rows);
  copy_in(rows, host_rows);
  copy_in(pad_rows, host_pad_rows(host_map, host_rows.numel()));
  copy_in(row_map, host_map);
}

}  // namespace

GdrPlanSlots::GdrPlanSlots(int64_t B, int64_t T, int64_t max_pieces, const torch::Device& device)
    : B_(B), T_(T), max_pieces_(max_pieces), device_(device) {
  TORCH_CHECK(B > 0 && T > 0 && max_pieces >= B, "GdrPlanSlots: expected B, T > 0 and max_pieces >= B, got B=", B,
              ", T=", T, ", max_pieces=", max_pieces);
  // Until the first batch: every row one document.
  cu_ = torch::full({max_pieces + 1}, B * T, torch::kInt64);
  cu_.narrow(0, 0, B + 1).copy_(torch::arange(0, B * T + 1, T, torch::kInt64));
}

void GdrPlanSlots::upload(Slot& s, GdrChunkLayout host) {
  s.host = std::move(host);
  const auto& l = s.host;
  std::vector<int32_t> table(l.chunk_start);
  table.insert(table.end(), l.chunk_len.begin(), l.chunk_len.end());
  // The kernel's step offsets for every step of the capacity (steps no document reaches point past
  // the list), and each sorted document's chunk count.
  std::vector<int32_t> step_off(static_cast<size_t>(s.cap.steps), static_cast<int32_t>(l.n_chunks));
  std::vector<int32_t> doc_chunks(static_cast<size_t>(s.cap.docs), 0);
  for (size_t m = 0; m < l.scan.step_off.size(); ++m) {
    step_off[m] = static_cast<int32_t>(l.scan.step_off[m]);
    for (int64_t d = 0; d < l.scan.step_count[m]; ++d) ++doc_chunks[static_cast<size_t>(d)];
  }
  std::vector<int64_t> doc_slot(l.order.size());
  for (size_t pos = 0; pos < l.order.size(); ++pos) doc_slot[static_cast<size_t>(l.order[pos])] = static_cast<int64_t>(pos);
  auto i32 = [](const std::vector<int32_t>& v) { return torch::tensor(v, torch::kInt32); };
  if (!s.table.defined()) {
    auto on = [&](torch::ScalarType dt, int64_t n) { return torch::empty({n}, torch::TensorOptions().dtype(dt).device(device_)); };
    s.token_slot = on(torch::kInt64, B_ * T_);
    s.table = on(torch::kInt32, 2 * s.cap.chunks).view({2, s.cap.chunks});
    s.step_off = on(torch::kInt32, s.cap.steps);
    s.doc_chunks = on(torch::kInt32, s.cap.docs);
    s.doc_slot = on(torch::kInt64, s.cap.docs);
  }
  copy_in(s.token_slot, l.token_slot);
  copy_in(s.table, i32(table).view({2, s.cap.chunks}));
  copy_in(s.step_off, i32(step_off));
  copy_in(s.doc_chunks, i32(doc_chunks));
  copy_in(s.doc_slot, torch::tensor(doc_slot, torch::kInt64));
  for (auto& m : s.maps) fill_head_maps(m.rows, m.pad_rows, m.row_map, l, m.heads);
}

GdrChunkLayout GdrPlanSlots::plan(const Slot& s, const torch::Tensor& cu) const {
  return gdr_chunk_layout_fixed(B_ * T_, /*H=*/1, s.C, cu, s.cap, torch::kCPU);
}

void GdrPlanSlots::set_batch(const torch::Tensor& cu_seqlens) {
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2, "GdrPlanSlots: expected cu_seqlens [pieces+1], got ",
              cu_seqlens.sizes());
  TORCH_CHECK(cu_seqlens.size(0) <= max_pieces_ + 1, "GdrPlanSlots: cu_seqlens has ", cu_seqlens.size(0) - 1,
              " pieces, more than the room's ", max_pieces_);
  // A private copy (the caller's tensor may change), planned for every chunk size before any
  // buffer is touched: a batch that does not fit leaves every slot on the previous batch.
  auto cu = cu_seqlens.to(torch::kInt64).clone().contiguous();
  std::vector<GdrChunkLayout> planned;
  for (const auto& s : slots_) planned.push_back(plan(s, cu));
  cu_ = cu;
  for (size_t i = 0; i < slots_.size(); ++i) upload(slots_[i], std::move(planned[i]));
}

GdrChunkLayout GdrPlanSlots::layout(int64_t H, int64_t C) {
  Slot* slot = nullptr;
  for (auto& s : slots_) {
    if (s.C == C) slot = &s;
  }
  if (slot == nullptr) {
    TORCH_CHECK(!(device_.is_cuda() && cuda_stream_capturing()), "GdrPlanSlots: chunk size ", C,
                " was first asked for during a CUDA graph capture (the eager warm-up steps must ask first)");
    slots_.push_back(Slot{});
    slot = &slots_.back();
    slot->C = C;
    slot->cap = gdr_layout_capacity(B_, T_, C, max_pieces_);
    upload(*slot, plan(*slot, cu_));
  }
  Slot::HeadMaps* maps = nullptr;
  for (auto& m : slot->maps) {
    if (m.heads == H) maps = &m;
  }
  if (maps == nullptr) {
    TORCH_CHECK(!(device_.is_cuda() && cuda_stream_capturing()), "GdrPlanSlots: ", H,
                " heads were first asked for during a CUDA graph capture (the eager warm-up steps must ask first)");
    const auto i32 = torch::TensorOptions().dtype(torch::kInt32).device(device_);
    Slot::HeadMaps m;
    m.heads = H;
    m.rows = torch::empty({B_ * T_, H}, i32);
    m.pad_rows = torch::empty({slot->host.n_chunks * H * C - B_ * T_ * H}, i32);
    m.row_map = torch::empty({slot->host.n_chunks * H * C}, i32);
    fill_head_maps(m.rows, m.pad_rows, m.row_map, slot->host, H);
    slot->maps.push_back(std::move(m));
    maps = &slot->maps.back();
  }
  GdrChunkLayout l = slot->host;
  l.scan.heads = H;
  l.token_rows = maps->rows;
  l.pad_rows = maps->pad_rows;
  l.row_map = maps->row_map;
  l.token_slot = slot->token_slot;
  l.fixed = true;
  l.table = slot->table;
  l.doc_slot = slot->doc_slot;
  l.scan.device_step_off = slot->step_off;
  l.scan.device_doc_chunks = slot->doc_chunks;
  return l;
}

}  // namespace model

#include "model/gdr_chunk_layout.h"

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "model/layers.h"

namespace model {
namespace {

// x as a contiguous tensor of dtype dt, in at most one copy (a cast and a relayout together).
torch::Tensor contiguous_as(const torch::Tensor& x, torch::ScalarType dt) {
  if (x.scalar_type() == dt) return x.contiguous();
  auto out = torch::empty(x.sizes(), x.options().dtype(dt));
  out.copy_(x);
  return out;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of x [R, D] picked by idx [M] (each row at most once), and in the backward the gradient
// written back to those rows (zeros elsewhere) by a plain scatter: index_select's own backward is
// an index_add with atomics over a [R, D] zero tensor.
class PickRowsFn : public torch::autograd::Function<PickRowsFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& idx) {
    ctx->saved_data["idx"] = idx;
    ctx->saved_data["rows"] = x.size(0);
    return x.index_select(0, idx);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto idx = ctx->saved_data["idx"].toTensor();
    const auto& g = grads[0];
    auto dx = torch::zeros({ctx->saved_data["rows"].toInt(), g.size(1)}, g.options());
    dx.index_copy_(0, idx, g.contiguous());
    return {dx, torch::Tensor()};
  }
};

void plan_dense(GdrChunkLayout& l) {
  const int64_t nc = (l.T + l.C - 1) / l.C;
  l.scan.n_docs = l.B;
  l.n_chunks = nc * l.B;
  for (int64_t m = 0; m < nc; ++m) {
    l.scan.step_count.push_back(l.B);
    l.scan.step_off.push_back(m * l.B);
    for (int64_t b = 0; b < l.B; ++b) {  // chunk m·B + b
      l.chunk_start.push_back(static_cast<int32_t>(b * l.T + m * l.C));
      l.chunk_len.push_back(static_cast<int32_t>(std::min(l.C, l.T - m * l.C)));
    }
  }
}

// One document of a packed row: its tokens [start, start + len) and its chunk count (a fixed
// layout's dummy documents have chunks of no tokens, its empty ones no chunks).
struct DocPiece {
  int64_t start = 0, len = 0, chunks = 0;
};

// The step-major chunk list of the documents, sorted by chunk count (descending, stable), and the
// token slots of their tokens.
void plan_pieces(GdrChunkLayout& l, const std::vector<DocPiece>& docs) {
  const int64_t n_docs = static_cast<int64_t>(docs.size()), C = l.C;
  l.scan.n_docs = n_docs;
  l.order.resize(static_cast<size_t>(n_docs));
  std::iota(l.order.begin(), l.order.end(), 0);
  std::stable_sort(l.order.begin(), l.order.end(), [&](int64_t a, int64_t b) { return docs[a].chunks > docs[b].chunks; });
  const int64_t max_nc = n_docs > 0 ? docs[l.order[0]].chunks : 0;
  int64_t off = 0;
  for (int64_t m = 0; m < max_nc; ++m) {
    int64_t cnt = 0;
    while (cnt < n_docs && docs[l.order[cnt]].chunks > m) ++cnt;
    l.scan.step_count.push_back(cnt);
    l.scan.step_off.push_back(off);
    for (int64_t s = 0; s < cnt; ++s) {
      const DocPiece& d = docs[l.order[s]];
      const int64_t first = d.start + m * C, len = std::max<int64_t>(0, std::min(C, d.start + d.len - first));
      l.chunk_start.push_back(static_cast<int32_t>(len > 0 ? first : 0));
      l.chunk_len.push_back(static_cast<int32_t>(len));
    }
    off += cnt;
  }
  l.n_chunks = off;
  auto slot_t = torch::empty({l.T}, torch::kInt64);
  int64_t* slot = slot_t.data_ptr<int64_t>();
  for (int64_t s = 0; s < n_docs; ++s) {
    const DocPiece& d = docs[l.order[s]];
    for (int64_t t = d.start; t < d.start + d.len; ++t) {
      const int64_t pos = t - d.start, m = pos / C, i = pos % C;
      slot[t] = (l.scan.step_off[m] + s) * C + i;
    }
  }
  l.token_slot = slot_t;
}

void plan_varlen(GdrChunkLayout& l, const torch::Tensor& cu_seqlens) {
  auto cu_t = cu_seqlens.contiguous();
  const int64_t* cu = cu_t.data_ptr<int64_t>();
  const int64_t n_seq = cu_t.size(0) - 1, C = l.C;
  TORCH_CHECK(cu[0] == 0 && cu[n_seq] == l.T, "gdr: cu_seqlens must run from 0 to T=", l.T);
  std::vector<DocPiece> docs(static_cast<size_t>(n_seq));
  for (int64_t n = 0; n < n_seq; ++n) {
    const int64_t len = cu[n + 1] - cu[n];
    TORCH_CHECK(len > 0, "gdr: cu_seqlens must be strictly increasing (entry ", n + 1, ")");
    docs[n] = {cu[n], len, (len + C - 1) / C};
  }
  plan_pieces(l, docs);
}

// Row of (token, head) in an output [N,H,C,D] viewed as [N·H·C, D], int64 [B·T, H]: token t at
// chunk slot n·C + c (chunk n = m·B + b for dense rows, token_slot for a packed row) and head h
// is row (n·H + h)·C + c.
torch::Tensor token_rows(const GdrChunkLayout& l, int64_t H, const torch::Device& device) {
  const int64_t C = l.C;
  auto opt = torch::TensorOptions().dtype(torch::kInt64).device(device);
  torch::Tensor n, c;  // [B·T]
  if (l.token_slot.defined()) {
    n = l.token_slot.div(C, "floor");
    c = l.token_slot.remainder(C);
  } else {
    auto t = torch::arange(l.T, opt), b = torch::arange(l.B, opt);
    n = ((t.div(C, "floor") * l.B).unsqueeze(0) + b.unsqueeze(1)).reshape({-1});
    c = t.remainder(C).repeat({l.B});
  }
  return ((n * H).unsqueeze(1) + torch::arange(H, opt).unsqueeze(0)) * C + c.unsqueeze(1);
}

}  // namespace

GdrChunkLayout gdr_chunk_layout(int64_t B, int64_t T, int64_t H, int64_t C, const torch::Tensor& cu_seqlens,
                                const torch::Device& device) {
  TORCH_CHECK(B * T < (int64_t{1} << 31), "gdr: at most 2^31 tokens per call, got ", B * T);
  GdrChunkLayout l;
  l.B = B;
  l.T = T;
  l.C = C;
  l.scan.heads = H;
  if (cu_seqlens.defined()) {
    plan_varlen(l, cu_seqlens);
    l.token_slot = host_to_device(l.token_slot, device);
  } else {
    plan_dense(l);
  }
  return l;
}

GdrLayoutCapacity gdr_layout_capacity(int64_t B, int64_t T, int64_t C, int64_t pieces) {
  TORCH_CHECK(B > 0 && T > 0 && C > 0 && pieces >= B, "gdr_layout_capacity: expected B, T, C > 0 and pieces >= B, got B=",
              B, ", T=", T, ", C=", C, ", pieces=", pieces);
  GdrLayoutCapacity cap;
  cap.steps = (T + C - 1) / C;
  cap.chunks = B * cap.steps + pieces - B;
  cap.docs = pieces + (pieces - B + cap.steps - 1) / cap.steps;
  return cap;
}

GdrChunkLayout gdr_chunk_layout_fixed(int64_t T, int64_t H, int64_t C, const torch::Tensor& cu_seqlens,
                                      const GdrLayoutCapacity& cap, const torch::Device& device) {
  TORCH_CHECK(T < (int64_t{1} << 31), "gdr: at most 2^31 tokens per call, got ", T);
  TORCH_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2 && cu_seqlens.device().is_cpu() &&
                  cu_seqlens.scalar_type() == torch::kInt64,
              "gdr: cu_seqlens must be int64 CPU [n_docs+1], got ", cu_seqlens.sizes());
  GdrChunkLayout l;
  l.B = 1;
  l.T = T;
  l.C = C;
  l.scan.heads = H;
  auto cu_t = cu_seqlens.contiguous();
  const int64_t* cu = cu_t.data_ptr<int64_t>();
  const int64_t n_cu = cu_t.size(0) - 1;
  TORCH_CHECK(cu[0] == 0 && cu[n_cu] == T, "gdr: cu_seqlens must run from 0 to T=", T);
  std::vector<DocPiece> docs;
  int64_t n_chunks = 0;
  for (int64_t n = 0; n < n_cu; ++n) {
    const int64_t len = cu[n + 1] - cu[n];
    if (len == 0 && cu[n] == T) {  // the padding at the end
      for (int64_t e = n + 1; e <= n_cu; ++e)
        TORCH_CHECK(cu[e] == T, "gdr: cu_seqlens must stay at T=", T, " once its padding starts (entry ", e, ")");
      break;
    }
    TORCH_CHECK(len > 0, "gdr: cu_seqlens must be strictly increasing up to its padding at T (entry ", n + 1, ")");
    docs.push_back({cu[n], len, (len + C - 1) / C});
    TORCH_CHECK(docs.back().chunks <= cap.steps, "gdr: document ", n, " has ", docs.back().chunks,
                " chunks, more than the fixed layout's ", cap.steps, " steps");
    n_chunks += docs.back().chunks;
  }
  TORCH_CHECK(n_chunks <= cap.chunks, "gdr: the batch has ", n_chunks, " chunks, more than the fixed layout's ",
              cap.chunks);
  // The spare chunks as dummy documents of up to `steps` chunks each, then empty documents.
  for (int64_t spare = cap.chunks - n_chunks; spare > 0; spare -= cap.steps) {
    docs.push_back({0, 0, std::min(spare, cap.steps)});
  }
  TORCH_CHECK(static_cast<int64_t>(docs.size()) <= cap.docs, "gdr: the batch needs ", docs.size(),
              " documents with its dummies, more than the fixed layout's ", cap.docs);
  docs.resize(static_cast<size_t>(cap.docs));
  plan_pieces(l, docs);
  l.token_slot = host_to_device(l.token_slot, device);
  return l;
}

torch::Tensor gdr_gather_chunks(const torch::Tensor& x, const GdrChunkLayout& l, torch::ScalarType dt) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), C = l.C, N = l.n_chunks;
  if (!l.token_slot.defined()) {
    const int64_t nc = N / B;
    auto xp = nc * C == T ? x : torch::constant_pad_nd(x, {0, 0, 0, 0, 0, nc * C - T});
    // [B,NC,C,H,D] -> [NC,B,H,C,D]: step-major, chunk n = m·B + b.
    auto xs = xp.view({B, nc, C, H, D}).permute({1, 0, 3, 2, 4});
    return contiguous_as(xs, dt).view({N, H, C, D});
  }
  auto rows = torch::zeros({N * C, H, D}, x.options().dtype(dt));
  rows = rows.index_copy(0, l.token_slot, x.select(0, 0).to(dt));
  return rows.view({N, C, H, D}).permute({0, 2, 1, 3}).contiguous();
}

torch::Tensor gdr_scatter_chunks(const torch::Tensor& o, const GdrChunkLayout& l) {
  const int64_t H = o.size(1), C = o.size(2), D = o.size(3), B = l.B, T = l.T, N = l.n_chunks;
  if (!l.token_slot.defined()) {
    const int64_t nc = N / B;
    auto y = o.view({nc, B, H, C, D}).permute({1, 0, 3, 2, 4}).reshape({B, nc * C, H, D});
    return nc * C == T ? y : y.narrow(1, 0, T);
  }
  // Picked in place, without first copying o into token-slot order.
  auto idx = token_rows(l, H, l.token_slot.device());
  auto picked = PickRowsFn::apply(o.contiguous().view({N * H * C, D}), idx.view({-1}));
  return picked.view({1, -1, H, D});
}

torch::Tensor gdr_chunk_token_rows(const GdrChunkLayout& l, int64_t H, const torch::Device& device) {
  TORCH_CHECK(l.n_chunks * H * l.C < (int64_t{1} << 31), "gdr: at most 2^31 output rows per call, got ",
              l.n_chunks * H * l.C);
  if (l.token_rows.defined() && l.token_rows.size(1) == H && l.token_rows.device() == device) {
    return l.token_rows.view({l.B, l.T, H});
  }
  return token_rows(l, H, device).to(torch::kInt32).view({l.B, l.T, H});
}

torch::Tensor gdr_chunk_row_targets(const GdrChunkLayout& l, int64_t H, const torch::Device& device) {
  const int64_t rows = l.n_chunks * H * l.C;
  TORCH_CHECK(rows < (int64_t{1} << 31) && l.B * l.T * H < (int64_t{1} << 31),
              "gdr: at most 2^31 output rows per call, got ", std::max(rows, l.B * l.T * H));
  // The map depends on the chunk table alone, and dense batches (and any repeated packing) ask for
  // the same one every call: the last few are kept, so a repeat costs no launches.
  struct Key {
    int device;
    int64_t B, T, C, H;
    std::vector<int32_t> start, len;
    bool operator==(const Key& o) const {
      return device == o.device && B == o.B && T == o.T && C == o.C && H == o.H && start == o.start && len == o.len;
    }
  };
  static std::mutex mu;
  static std::deque<std::pair<Key, torch::Tensor>> recent;  // newest first
  constexpr size_t kKept = 8;
  Key key{device.is_cpu() ? -1 : device.index(), l.B, l.T, l.C, H, l.chunk_start, l.chunk_len};
  // A fixed layout's map is made from its device token slots every time: a captured step replays
  // the making with each batch's slots, where a cached map would hold the capture's batch.
  if (!l.fixed) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [k, t] : recent) {
      if (k == key) return t;
    }
  }
  auto targets = torch::full({rows}, -1, torch::TensorOptions().dtype(torch::kInt32).device(device));
  const auto token_head = torch::arange(l.B * l.T * H, targets.options());
  targets.index_copy_(0, token_rows(l, H, device).view({-1}), token_head);
  // Made inside a graph capture, it holds its values only once the graph has run.
  if (l.fixed || (!device.is_cpu() && cuda_stream_capturing())) return targets;
  std::lock_guard<std::mutex> lock(mu);
  recent.emplace_front(std::move(key), targets);
  if (recent.size() > kKept) recent.pop_back();
  return targets;
}

}  // namespace model

// Packed causal attention on cuDNN's fused kernel through its frontend graphs (model/cudnn_attention.h).
// The graph cache is keyed by the shape and the cuDNN handle: LibTorch hands each thread its own
// handle per device, and the backward runs on autograd's device thread, so each thread builds and
// runs its own graphs. Entries are never freed: the process holds a few shapes, and destroying
// cuDNN descriptors during static destruction could outlive the library.
#include "model/cudnn_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#if defined(DD_HAVE_CUDNN_FRONTEND)
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <cudnn_frontend.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>
#endif

namespace model {

namespace {
std::atomic<bool> g_packed_cudnn{true};
}  // namespace

void packed_attention_cudnn(bool on) { g_packed_cudnn = on; }
bool packed_attention_cudnn_enabled() { return g_packed_cudnn; }

int64_t packed_attention_pieces(int64_t pieces) {
  int64_t step = 8;
  if (pieces > 64) {
    int64_t pow2 = 64;
    while (pow2 < pieces) pow2 *= 2;
    step = pow2 / 8;
  }
  return (std::max<int64_t>(pieces, 1) + step - 1) / step * step;
}

#if defined(DD_HAVE_CUDNN_FRONTEND)

bool cudnn_frontend_built() { return true; }

namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor uids of both graphs; the variant packs map them to device pointers. The ragged offsets
// take kOffsets + the index of their token stride in the entry's distinct strides.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqLen, kOffsets = 100 };

// Which graph, which shape, on which handle: the cache key.
using Key = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int, int, double, cudnnHandle_t>;
Key key_of(const PackedAttentionShape& s, bool backward, cudnnHandle_t h) {
  // Only the backward's workspace depends on N (max_total_seq_len).
  return {backward, backward ? s.tokens : 0, s.pieces, s.S, s.H, s.Hkv, s.dqk, s.dv, s.q_token_stride, s.q_head_stride,
          s.k_token_stride, s.k_head_stride, s.v_token_stride, s.v_head_stride, static_cast<int>(s.dtype),
          static_cast<int>(s.device.index()), s.scale, h};
}

// One built graph, or why it could not be built.
struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null where it could not be built
  std::string refusal;
  bool permanent = true;  // the refusal is cuDNN's word on the shape (cached), not a passing failure
  int64_t workspace_bytes = 0;
  std::vector<int64_t> token_strides;  // the distinct token strides the ragged offsets scale cu_seqlens by
  at::Tensor strides_column;           // [n, 1] int32 on the device: token_strides, for one multiply
};
using EntryPtr = std::shared_ptr<const Entry>;

void check(fe::error_t e, const char* what) {
  TORCH_CHECK(e.is_good(), "cuDNN packed attention (", what, "): ", e.get_message());
}

// The token strides a graph's ragged tensors use, each once: q, k, v (and their gradients), o (and
// dO), the statistics.
std::vector<int64_t> distinct_token_strides(const PackedAttentionShape& s) {
  std::vector<int64_t> all{s.q_token_stride, s.k_token_stride, s.v_token_stride, s.H * s.dv, s.H};
  std::vector<int64_t> out;
  for (int64_t t : all)
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  return out;
}

// Builds one graph: q, k, v (and o, dO) as [pieces, heads, S, D] over token-major rows, each with
// the ragged offset of its token stride; the piece lengths as both padding masks; the softmax
// statistics token-major too ([N,H] fp32), so that they and the backward's fp32 accumulators are
// sized by the N tokens (times the inputs' token strides; for GQA's K and V gradients times H/Hkv),
// not by pieces × S (which the empty pieces and short documents inflate).
Entry build_entry(const PackedAttentionShape& s, bool backward, cudnnHandle_t handle) {
  Entry e;
  e.token_strides = distinct_token_strides(s);
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.dtype == at::kHalf ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t P = s.pieces, S = s.S;
  std::vector<TensorAttr> offsets;
  for (size_t i = 0; i < e.token_strides.size(); ++i) {
    offsets.push_back(g->tensor(fe::graph::Tensor_attributes()
                                    .set_name("ragged_offset_" + std::to_string(i))
                                    .set_uid(kOffsets + static_cast<int64_t>(i))
                                    .set_dim({P + 1, 1, 1, 1})
                                    .set_stride({1, 1, 1, 1})
                                    .set_data_type(fe::DataType_t::INT32)));
  }
  auto offset_of = [&](int64_t token_stride) {
    const auto it = std::find(e.token_strides.begin(), e.token_strides.end(), token_stride);
    return offsets[static_cast<size_t>(it - e.token_strides.begin())];
  };
  auto seq_len = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("seq_len")
                               .set_uid(kSeqLen)
                               .set_dim({P, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_data_type(fe::DataType_t::INT32));
  auto input = [&](int64_t uid, const char* name, int64_t heads, int64_t D, int64_t ts, int64_t hs) {
    auto t = g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({P, heads, S, D}).set_stride(
        {S * ts, hs, ts, 1}));
    t->set_ragged_offset(offset_of(ts));
    return t;
  };
  auto output = [&](const TensorAttr& t, int64_t uid, int64_t heads, int64_t D) {
    t->set_output(true).set_uid(uid).set_dim({P, heads, S, D}).set_stride({S * heads * D, D, heads * D, 1});
    t->set_ragged_offset(offset_of(heads * D));
  };
  // [pieces, H, S, 1] over [N, H] fp32 rows.
  auto stats_layout = [&](fe::graph::Tensor_attributes& t) {
    t.set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({P, s.H, S, 1}).set_stride({S * s.H, 1, s.H, 1});
    t.set_ragged_offset(offset_of(s.H));
  };
  auto Q = input(kQ, "q", s.H, s.dqk, s.q_token_stride, s.q_head_stride);
  auto K = input(kK, "k", s.Hkv, s.dqk, s.k_token_stride, s.k_head_stride);
  auto V = input(kV, "v", s.Hkv, s.dv, s.v_token_stride, s.v_head_stride);
  const float scale = static_cast<float>(s.scale);
  if (!backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("packed_attention")
                     .set_generate_stats(true)
                     .set_attn_scale(scale)
                     .set_padding_mask(true)
                     .set_seq_len_q(seq_len)
                     .set_seq_len_kv(seq_len)
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0);
    auto [O, stats] = g->sdpa(Q, K, V, attrs);
    output(O, kO, s.H, s.dv);
    stats->set_output(true);
    stats_layout(*stats);
  } else {
    auto O = input(kO, "o", s.H, s.dv, s.H * s.dv, s.dv);
    auto dO = input(kDO, "do", s.H, s.dv, s.H * s.dv, s.dv);
    fe::graph::Tensor_attributes stats_attrs;
    stats_attrs.set_name("stats");
    stats_layout(stats_attrs);
    auto stats = g->tensor(stats_attrs);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("packed_attention_backward")
                     .set_attn_scale(scale)
                     .set_padding_mask(true)
                     .set_seq_len_q(seq_len)
                     .set_seq_len_kv(seq_len)
                     .set_max_total_seq_len_q(s.tokens)
                     .set_max_total_seq_len_kv(s.tokens)
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, attrs);
    // The gradients are laid out as their inputs: with max_total_seq_len set, cuDNN 9.19 sized its
    // fp32 dQ (and GQA's per-head dK, dV) accumulators by the gradients' layout but read them as the
    // inputs' (stop 51, call C: q|k|v as views into one projection gave dq 1.2 off and dk NaN).
    auto same_as_input = [&](const TensorAttr& t, int64_t uid, int64_t heads, int64_t D, int64_t ts, int64_t hs) {
      t->set_output(true).set_uid(uid).set_dim({P, heads, S, D}).set_stride({S * ts, hs, ts, 1});
      t->set_ragged_offset(offset_of(ts));
    };
    same_as_input(dQ, kDQ, s.H, s.dqk, s.q_token_stride, s.q_head_stride);
    same_as_input(dK, kDK, s.Hkv, s.dqk, s.k_token_stride, s.k_head_stride);
    same_as_input(dV, kDV, s.Hkv, s.dv, s.v_token_stride, s.v_head_stride);
  }
  // Each step's error: "not supported" and malformed-graph codes are cuDNN's answer for this shape
  // (kept); the others (a CUDA or backend call failing, out of memory while building plans) and
  // exceptions may pass, and entry() tries again a few times.
  auto failed = [&](fe::error_t err, const char* what) {
    if (err.is_good()) return false;
    using C = fe::error_code_t;
    const C code = err.get_code();
    e.permanent = code == C::GRAPH_NOT_SUPPORTED || code == C::ATTRIBUTE_NOT_SET || code == C::INVALID_VALUE ||
                  code == C::SHAPE_DEDUCTION_FAILED || code == C::INVALID_TENSOR_NAME ||
                  code == C::UNSUPPORTED_GRAPH_FORMAT || code == C::HEURISTIC_QUERY_FAILED;
    e.refusal = std::string(what) + ": " + err.get_message();
    return true;
  };
  try {
    if (failed(g->validate(), "validate") || failed(g->build_operation_graph(handle), "build_operation_graph") ||
        failed(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
        failed(g->check_support(handle), "check_support") || failed(g->build_plans(handle), "build_plans") ||
        failed(g->get_workspace_size(e.workspace_bytes), "get_workspace_size"))
      return e;
    std::vector<int32_t> strides(e.token_strides.begin(), e.token_strides.end());
    // Built outside any CUDA graph capture (entry() refuses during one), so this copy is allowed.
    e.strides_column = torch::tensor(strides, torch::kInt32).view({-1, 1}).to(s.device);
  } catch (const c10::Error& err) {
    e.refusal = err.what_without_backtrace();
    e.permanent = false;
    return e;
  } catch (const std::exception& err) {  // the frontend's own exceptions
    e.refusal = err.what();
    e.permanent = false;
    return e;
  }
  e.graph = std::move(g);
  return e;
}

cudnnHandle_t handle_on_current_stream() {
  cudnnHandle_t h = at::native::getCudnnHandle();
  TORCH_CHECK(cudnnSetStream(h, c10::cuda::getCurrentCUDAStream().stream()) == CUDNN_STATUS_SUCCESS,
              "cuDNN packed attention: cudnnSetStream failed");
  return h;
}

// The graph of this shape on this thread's handle: cached, or built now. Not built while the
// stream is being captured into a CUDA graph (the trainer's eager warm-up steps, forward and
// backward, build every graph a captured step needs); such a refusal is not cached, and a build
// that failed for a passing reason is tried again up to kBuildAttempts times before it is.
constexpr int kBuildAttempts = 3;
EntryPtr entry(const PackedAttentionShape& s, bool backward) {
  static std::mutex* mu = new std::mutex;
  static auto* cache = new std::map<Key, EntryPtr>;
  static auto* attempts = new std::map<Key, int>;
  const cudnnHandle_t h = handle_on_current_stream();
  const Key key = key_of(s, backward, h);
  std::lock_guard<std::mutex> lock(*mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    auto refused = std::make_shared<Entry>();
    refused->refusal = "not built during a CUDA graph capture";
    refused->permanent = false;
    return refused;
  }
  auto built = std::make_shared<const Entry>(build_entry(s, backward, h));
  if (!built->graph && (s.dtype == at::kBFloat16 || s.dtype == at::kHalf)) {
    std::fprintf(stderr,
                 "deltadeck: cuDNN packed attention %s not built for %lld tokens, pieces %lld, S %lld, heads "
                 "%lld/%lld, widths %lld/%lld (flash varlen instead%s): %s\n",
                 backward ? "backward" : "forward", (long long)s.tokens, (long long)s.pieces, (long long)s.S,
                 (long long)s.H, (long long)s.Hkv, (long long)s.dqk, (long long)s.dv,
                 built->permanent ? "" : "; tried again on the next call", built->refusal.c_str());
  }
  if (built->graph || built->permanent || ++(*attempts)[key] >= kBuildAttempts) cache->emplace(key, built);
  return built;
}

// The shape of one call, from its tensors (layouts checked by the callers).
PackedAttentionShape shape_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t pieces, int64_t S,
                              double scale, bool backward) {
  PackedAttentionShape s;
  s.tokens = q.size(0);
  s.pieces = pieces;
  s.S = S;
  s.H = q.size(1);
  s.Hkv = k.size(1);
  s.dqk = q.size(2);
  s.dv = v.size(2);
  s.q_token_stride = q.stride(0);
  s.q_head_stride = q.stride(1);
  s.k_token_stride = k.stride(0);
  s.k_head_stride = k.stride(1);
  s.v_token_stride = v.stride(0);
  s.v_head_stride = v.stride(1);
  s.dtype = q.scalar_type();
  s.device = q.device();
  s.scale = scale;
  s.backward = backward;
  return s;
}

// What cuDNN's kernel needs of q, k and v beyond their shapes: unit-stride head rows, strides and
// addresses aligned to 16 bytes (8 half-width elements), and no two elements at one address (an
// expanded K or V: its gradient, laid out as it, would take several heads' writes).
bool aligned(const at::Tensor& t) {
  if (t.stride(2) != 1 || t.stride(1) % 8 != 0 || t.stride(0) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
    return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that step
  for (int64_t d = 0; d < 3; ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t reach = i == 0 ? 1 : dims[i - 1].first * dims[i - 1].second;
    if (dims[i].first < reach) return false;
  }
  return true;
}

// Whether every element cuDNN addresses fits int32: each tensor's last element ((N−1)·token stride
// + (heads−1)·head stride + D), and GQA's per-head K and V gradient accumulators, which reuse K's
// and V's offsets times H/Hkv.
bool offsets_fit_int32(const PackedAttentionShape& s) {
  const int64_t N = s.tokens, g = s.backward && s.Hkv > 0 ? s.H / s.Hkv : 1;
  const int64_t reach[] = {(N - 1) * s.q_token_stride + (s.H - 1) * s.q_head_stride + s.dqk,
                           g * ((N - 1) * s.k_token_stride + (s.Hkv - 1) * s.k_head_stride + s.dqk),
                           g * ((N - 1) * s.v_token_stride + (s.Hkv - 1) * s.v_head_stride + s.dv), N * s.H * s.dv,
                           N * s.H};
  return *std::max_element(std::begin(reach), std::end(reach)) < (int64_t{1} << 31);
}

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu) {
  TORCH_CHECK(q.is_cuda() && q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "cudnn_packed_attention: expected q, k and v [N,heads,D] on a GPU, got ", q.sizes(), ", ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == v.size(1) &&
                  q.size(1) % k.size(1) == 0 && k.size(2) == q.size(2) && k.device() == q.device() &&
                  v.device() == q.device(),
              "cudnn_packed_attention: k and v must be [N,Hkv,·] on q's device with Hkv dividing H and k as wide as q, "
              "got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "cudnn_packed_attention: q, k and v must share a dtype");
  TORCH_CHECK(cu.scalar_type() == at::kInt && cu.dim() == 1 && cu.size(0) >= 2 && cu.device() == q.device() &&
                  cu.is_contiguous(),
              "cudnn_packed_attention: cu_seqlens must be contiguous int32 [pieces+1] on q's device, got ",
              cu.sizes(), " ", cu.scalar_type(), " on ", cu.device());
}

void check_aligned(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(aligned(q) && aligned(k) && aligned(v),
              "cudnn_packed_attention: q, k and v need unit-stride head rows and 16-byte aligned strides and "
              "addresses, got strides ", q.strides(), ", ", k.strides(), " and ", v.strides());
}

// The statistics' shape: [N,H] fp32, contiguous, on q's device.
void check_stats(const char* fn, const at::Tensor& stats, const at::Tensor& q) {
  TORCH_CHECK(stats.is_contiguous() && stats.sizes() == at::IntArrayRef({q.size(0), q.size(1)}) &&
                  stats.scalar_type() == at::kFloat && stats.device() == q.device(),
              fn, ": stats must be contiguous fp32 [N,H] = [", q.size(0), ",", q.size(1), "] on q's device, got ",
              stats.sizes(), " ", stats.scalar_type());
}

// The pieces' lengths [pieces] and the ragged offsets [strides, pieces+1] (one row per distinct
// token stride, rows 16-byte aligned) of cu_seqlens: two small kernels, no host copy (so a CUDA
// graph may capture them).
struct Ragged {
  at::Tensor seq_len, offsets;
};
Ragged ragged(const Entry& e, const at::Tensor& cu) {
  const int64_t P = cu.size(0) - 1;
  const int64_t row = (P + 1 + 3) / 4 * 4;
  Ragged r;
  r.seq_len = at::sub(cu.narrow(0, 1, P), cu.narrow(0, 0, P));
  r.offsets = at::empty({e.strides_column.size(0), row}, cu.options());
  auto used = r.offsets.narrow(1, 0, P + 1);
  at::mul_out(used, e.strides_column, cu.unsqueeze(0));
  return r;
}

void execute(const Entry& e, std::unordered_map<int64_t, void*>& pack, const Ragged& r, const at::Tensor& like) {
  pack[kSeqLen] = r.seq_len.data_ptr();
  for (int64_t i = 0; i < r.offsets.size(0); ++i) pack[kOffsets + i] = r.offsets[i].data_ptr();
  auto ws = at::empty({std::max<int64_t>(e.workspace_bytes, 1)}, like.options().dtype(at::kByte));
  check(e.graph->execute(handle_on_current_stream(), pack, ws.data_ptr()), "execute");
}

EntryPtr entry_or_throw(const PackedAttentionShape& s, bool backward) {
  TORCH_CHECK(offsets_fit_int32(s), "cuDNN packed attention: ", s.tokens,
              " tokens overflow cuDNN's int32 ragged offsets at these strides");
  auto e = entry(s, backward);
  TORCH_CHECK(e->graph, "cuDNN packed attention: the ", backward ? "backward" : "forward",
              " graph could not be built: ", e->refusal);
  return e;
}

// q, k and v as [N,H,D]: [B,T,H,D] tokens-major ones (rows one token stride apart across B, as
// cudnn_packed_attention checks) flattened to N = B·T rows, views taken inside the autograd
// function so that their gradients reach its caller as the tensors gradient_like makes.
at::Tensor token_rows(const at::Tensor& t) {
  return t.dim() == 4 ? t.view({t.size(0) * t.size(1), t.size(2), t.size(3)}) : t;
}

// The gradient of x laid out as x in its storage: the same sizes, strides and storage offset, on a
// fresh storage as large as x's, so that a caller that made x as a view into wider rows (MLA's V:
// columns of its K|V projection's rows) finds the gradient at the same place in rows of the same
// width, which it may fill in (model/fused_rope.cpp). The tensor is set on the storage, not a view
// of another tensor, so that it is the storage's only holder. Where x's storage is more than four
// times x's own elements (a small view into a large buffer), the gradient takes x's reach only.
at::Tensor gradient_like(const at::Tensor& x) {
  const auto es = static_cast<int64_t>(x.element_size());
  const auto storage_elems = static_cast<int64_t>(x.storage().nbytes()) / es;
  if (storage_elems <= 4 * x.numel()) {
    auto rows = at::empty({storage_elems}, x.options());
    return at::empty({0}, x.options()).set_(rows.storage(), x.storage_offset(), x.sizes(), x.strides());
  }
  return at::empty_strided(x.sizes(), x.strides(), x.options());
}

class PackedAttentionFn : public torch::autograd::Function<PackedAttentionFn> {
 public:
  // cu is already padded to packed_attention_pieces(n) + 1 entries. q, k and v are [N,H,D] or
  // [B,T,H,D] (token_rows); o comes back as [N,H,dv] or [B,T,H,dv] likewise.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& cu, int64_t S, double scale) {
    const auto qr = token_rows(q), kr = token_rows(k), vr = token_rows(v);
    const int64_t N = qr.size(0), H = qr.size(1), dv = vr.size(2);
    auto o = q.dim() == 4 ? at::empty({q.size(0), q.size(1), H, dv}, q.options()) : at::empty({N, H, dv}, q.options());
    auto stats = at::empty({N, H}, q.options().dtype(at::kFloat));
    cudnn_packed_attention_forward(qr, kr, vr, cu, S, scale, token_rows(o), stats);
    ctx->save_for_backward({q, k, v, o, stats, cu});
    ctx->saved_data["S"] = S;
    ctx->saved_data["scale"] = scale;
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &stats = saved[4], &cu = saved[5];
    // Laid out as q, k and v (build_entry says why): a view's gradient takes its input's strides.
    auto dq = gradient_like(q), dk = gradient_like(k), dv = gradient_like(v);
    cudnn_packed_attention_backward(token_rows(q), token_rows(k), token_rows(v), token_rows(o),
                                    token_rows(grads[0].contiguous()), stats, cu, ctx->saved_data["S"].toInt(),
                                    ctx->saved_data["scale"].toDouble(), token_rows(dq), token_rows(dk),
                                    token_rows(dv));
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool cudnn_packed_attention_supported(const PackedAttentionShape& s) {
  // The cuDNN these graphs were checked against (9.19, PyTorch 2.11's): older ones laid out the
  // ragged statistics and the backward's accumulators differently, so they keep the flash kernel.
  static const bool cudnn_recent = cudnnGetVersion() >= 91900;
  if (!cudnn_recent || !g_packed_cudnn || s.device.type() != c10::DeviceType::CUDA ||
      (s.dtype != at::kBFloat16 && s.dtype != at::kHalf) || s.tokens < 1 || !offsets_fit_int32(s))
    return false;
  try {
    return entry(s, false)->graph && (!s.backward || entry(s, true)->graph);
  } catch (const std::exception&) {
    return false;
  }
}

void cudnn_packed_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& cu, int64_t S, double scale, const at::Tensor& o,
                                    const at::Tensor& stats) {
  check_shapes(q, k, v, cu);
  check_aligned(q, k, v);
  const int64_t N = q.size(0), H = q.size(1), pieces = cu.size(0) - 1;
  TORCH_CHECK(pieces == packed_attention_pieces(pieces), "cudnn_packed_attention_forward: ", pieces,
              " pieces; pad cu_seqlens to packed_attention_pieces = ", packed_attention_pieces(pieces));
  TORCH_CHECK(o.is_contiguous() && o.sizes() == at::IntArrayRef({N, H, v.size(2)}) &&
                  o.scalar_type() == q.scalar_type() && o.device() == q.device(),
              "cudnn_packed_attention_forward: o must be contiguous [N,H,dv] like q, got ", o.sizes());
  check_stats("cudnn_packed_attention_forward", stats, q);
  const auto e = entry_or_throw(shape_of(q, k, v, pieces, S, scale, false), false);
  std::unordered_map<int64_t, void*> pack{{kQ, q.data_ptr()}, {kK, k.data_ptr()},     {kV, v.data_ptr()},
                                          {kO, o.data_ptr()}, {kStats, stats.data_ptr()}};
  execute(*e, pack, ragged(*e, cu), q);
}

void cudnn_packed_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& o, const at::Tensor& dO, const at::Tensor& stats,
                                     const at::Tensor& cu, int64_t S, double scale, const at::Tensor& dq,
                                     const at::Tensor& dk, const at::Tensor& dv) {
  check_shapes(q, k, v, cu);
  check_aligned(q, k, v);
  const int64_t N = q.size(0), H = q.size(1), pieces = cu.size(0) - 1;
  TORCH_CHECK(pieces == packed_attention_pieces(pieces), "cudnn_packed_attention_backward: ", pieces,
              " pieces; pad cu_seqlens to packed_attention_pieces = ", packed_attention_pieces(pieces));
  auto like = [&](const at::Tensor& t, at::IntArrayRef sizes) {
    return t.is_contiguous() && t.sizes() == sizes && t.scalar_type() == q.scalar_type() && t.device() == q.device();
  };
  TORCH_CHECK(like(o, {N, H, v.size(2)}) && like(dO, {N, H, v.size(2)}),
              "cudnn_packed_attention_backward: o and dO must be contiguous [N,H,dv] like q, got ", o.sizes(), " and ",
              dO.sizes());
  auto strided_like = [&](const at::Tensor& g, const at::Tensor& x) {
    return g.sizes() == x.sizes() && g.strides() == x.strides() && g.scalar_type() == x.scalar_type() &&
           g.device() == x.device();
  };
  TORCH_CHECK(strided_like(dq, q) && strided_like(dk, k) && strided_like(dv, v),
              "cudnn_packed_attention_backward: dq, dk and dv must have the sizes and strides of q, k and v");
  check_stats("cudnn_packed_attention_backward", stats, q);
  const auto e = entry_or_throw(shape_of(q, k, v, pieces, S, scale, true), true);
  std::unordered_map<int64_t, void*> pack{{kQ, q.data_ptr()},   {kK, k.data_ptr()},   {kV, v.data_ptr()},
                                          {kO, o.data_ptr()},   {kDO, dO.data_ptr()}, {kStats, stats.data_ptr()},
                                          {kDQ, dq.data_ptr()}, {kDK, dk.data_ptr()}, {kDV, dv.data_ptr()}};
  execute(*e, pack, ragged(*e, cu), q);
}

at::Tensor cudnn_packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens, int64_t S, double scale) {
  if (q.dim() == 4 || k.dim() == 4 || v.dim() == 4) {
    auto rows_apart = [&](const at::Tensor& t) {
      return t.dim() == 4 && t.size(0) == q.size(0) && t.size(1) == q.size(1) &&
             (t.size(0) == 1 || t.stride(0) == t.size(1) * t.stride(1));
    };
    TORCH_CHECK(rows_apart(q) && rows_apart(k) && rows_apart(v),
                "cudnn_packed_attention: [B,T,H,D] q, k and v must all be 4-d over the same B and T, with rows one "
                "token stride apart across B, got q ",
                q.sizes(), " ", q.strides(), ", k ", k.sizes(), " ", k.strides(), ", v ", v.sizes(), " ", v.strides());
  }
  const auto qr = token_rows(q), kr = token_rows(k), vr = token_rows(v);
  check_shapes(qr, kr, vr, cu_seqlens);
  if (!aligned(qr) || !aligned(kr) || !aligned(vr)) return {};
  const int64_t n = cu_seqlens.size(0) - 1, pieces = packed_attention_pieces(n);
  const bool grad = torch::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!cudnn_packed_attention_supported(shape_of(qr, kr, vr, pieces, S, scale, grad))) return {};
  // Spare pieces start at the end (N) and hold no token.
  auto cu = pieces == n ? cu_seqlens : at::constant_pad_nd(cu_seqlens, {0, pieces - n}, qr.size(0));
  return PackedAttentionFn::apply(q, k, v, cu, S, scale);
}

#else  // no cuDNN frontend in this build: callers keep the flash kernel

bool cudnn_frontend_built() { return false; }
bool cudnn_packed_attention_supported(const PackedAttentionShape&) { return false; }
at::Tensor cudnn_packed_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                  double) {
  return {};
}
void cudnn_packed_attention_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                    double, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "cudnn_packed_attention_forward: this build has no cuDNN frontend");
}
void cudnn_packed_attention_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double,
                                     const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "cudnn_packed_attention_backward: this build has no cuDNN frontend");
}

#endif

}  // namespace model

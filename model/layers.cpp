// Shared layers: RMSNorm, RoPE, SwiGLU, GPT attention. Plain LibTorch ops; the fused CUDA
// kernels of the GPU-speed issue replace these on the fast path and are tested against them.
#include "model/layers.h"

#include "model/cudnn_attention.h"
#include "model/fused_rope.h"
#include "model/fp8_swiglu_mlp.h"
#include "model/fused_swiglu.h"

#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

namespace model {

torch::Tensor host_to_device(const torch::Tensor& host, const torch::Device& device) {
  if (device.is_cpu()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

bool cuda_stream_capturing() {
#if defined(DD_HAVE_CUDA)
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

torch::Tensor cached_device_ints(const std::vector<int32_t>& values, const torch::Device& device) {
  using Key = std::pair<int, std::vector<int32_t>>;
  static std::mutex mu;
  static std::map<Key, torch::Tensor> cache;
  constexpr size_t kMaxTables = 256;
  Key key{device.is_cpu() ? -1 : device.index(), values};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= kMaxTables) cache.clear();
  auto host = torch::tensor(values, torch::TensorOptions().dtype(torch::kInt32));
  auto t = host_to_device(host, device);
  cache.emplace(std::move(key), t);
  return t;
}

AutocastOff::AutocastOff()
    : was_enabled_(at::autocast::is_autocast_enabled(at::kCUDA)),
      was_enabled_cpu_(at::autocast::is_autocast_enabled(at::kCPU)) {
  if (was_enabled_) at::autocast::set_autocast_enabled(at::kCUDA, false);
  if (was_enabled_cpu_) at::autocast::set_autocast_enabled(at::kCPU, false);
}

AutocastOff::~AutocastOff() {
  if (was_enabled_) at::autocast::set_autocast_enabled(at::kCUDA, true);
  if (was_enabled_cpu_) at::autocast::set_autocast_enabled(at::kCPU, true);
}

RMSNormImpl::RMSNormImpl(int64_t dim, bool affine, double eps) : eps_(eps) {
  if (affine) weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor rms_norm_plain(const torch::Tensor& x, double eps) {
  auto xf = x.to(torch::kFloat32);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return y.to(x.scalar_type());
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // On a GPU the fused kernels (model/fused_rmsnorm.h); elsewhere the ATen formula they match.
  return fused_rms_norm(x, weight, eps_);
}

at::ScalarType matmul_dtype(const torch::Tensor& x) {
  const auto dev = x.device().type();
  if (x.scalar_type() != torch::kFloat64 && at::autocast::is_autocast_enabled(dev))
    return at::autocast::get_autocast_dtype(dev);
  return x.scalar_type();
}

AddNormOut RMSNormImpl::add_forward(const torch::Tensor& x, const torch::Tensor& b, bool for_matmul) {
  const auto h_dtype = b.defined() ? c10::promoteTypes(x.scalar_type(), b.scalar_type()) : x.scalar_type();
  return fused_add_rms_norm(x, b, weight, eps_, for_matmul ? matmul_dtype(x) : h_dtype);
}

RopeTables make_rope_tables(int64_t rotary_dim, int64_t max_pos, double theta) {
  TORCH_CHECK(rotary_dim % 2 == 0, "rope: rotary dim must be even, got ", rotary_dim);
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto j = torch::arange(rotary_dim / 2, opts);
  auto inv = torch::pow(theta, -2.0 * j / static_cast<double>(rotary_dim));  // [r/2]
  auto pos = torch::arange(max_pos, opts);                                   // [P]
  auto ang = torch::outer(pos, inv);                                        // [P, r/2]
  return {torch::cos(ang), torch::sin(ang)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& t) {
  TORCH_CHECK(x.dim() == 4, "rope: expected x [B,T,nh,r], got ", x.sizes());
  const int64_t half = x.size(-1) / 2;
  TORCH_CHECK(t.cos.size(1) == half, "rope: table has ", t.cos.size(1), " frequencies, x needs ", half);
  // Gather per-token angles [B,T,1,r/2] in the compute dtype (fp32 for fp32/bf16 inputs).
  auto compute = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  // No bounds check here: it would read a GPU scalar every call; index() itself rejects a
  // position beyond the table.
  auto cos = t.cos.index({pos}).to(compute).unsqueeze(2);
  auto sin = t.sin.index({pos}).to(compute).unsqueeze(2);
  auto xc = x.to(compute);
  auto x1 = xc.narrow(-1, 0, half);
  auto x2 = xc.narrow(-1, half, half);
  auto out = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  return out.to(x.scalar_type());
}

SwiGLUImpl::SwiGLUImpl(int64_t d, int64_t hidden) {
  gate = register_module("gate", Linear(d, hidden));
  up = register_module("up", Linear(d, hidden));
  down = register_module("down", Linear(hidden, d));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  if (Fp8Scope::active() && fp8_swiglu_mlp_enabled()) {
    // FP8: the whole feed-forward as one function that quantises SwiGLU's activation as it computes it.
    const std::vector<torch::Tensor> w_gate_up = {gate->weight, up->weight};
    if (fp8_swiglu_mlp_fits(x, w_gate_up, down->weight))
      return fp8_swiglu_mlp(x, w_gate_up, down->weight, gate->fp8, down->fp8);
  }
  // gate and up as one matmul, the activation as one kernel over its [.., 2·hidden] output.
  return down(swiglu(linear_cat(x, {gate, up})));
}

void SwiGLUImpl::reset_parameters(double std0, double std_out) {
  torch::NoGradGuard no_grad;
  gate->weight.normal_(0.0, std0);
  up->weight.normal_(0.0, std0);
  down->weight.normal_(0.0, std_out);
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : nh_(c.attn_heads), nkv_(c.attn_kv_heads), dh_(c.attn_head_dim), qk_norm_(c.qk_norm),
      rope_(make_rope_tables(c.attn_head_dim, c.max_seq_len, c.rope_theta)) {
  // Buffers, so the tables follow the module to its device.
  rope_.cos = register_buffer("rope_cos", rope_.cos);
  rope_.sin = register_buffer("rope_sin", rope_.sin);
  auto lin = [&](int64_t in, int64_t out) {
    return Linear(in, out);
  };
  wq = register_module("wq", lin(c.d, nh_ * dh_));
  wk = register_module("wk", lin(c.d, nkv_ * dh_));
  wv = register_module("wv", lin(c.d, nkv_ * dh_));
  wo = register_module("wo", lin(nh_ * dh_, c.d));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& u, const Positions& p) {
  const int64_t B = u.size(0), T = u.size(1);
  torch::Tensor q, k, v;
  if (!Fp8Scope::active()) {
    // One matmul, RoPE (and QK-norm) on q and k; the three gradients land in one tensor
    // (model/fused_rope.h).
    const auto qkv = linear_cat(u, {wq, wk, wv});
    auto r = qk_norm_ ? rope_norm_qkv(qkv, nh_, nkv_, dh_, p.pos, rope_) : rope_qkv(qkv, nh_, nkv_, dh_, p.pos, rope_);
    q = r.q;
    k = r.k;
    v = r.v;
  } else {
    // fp8: q, k and v from one matmul; split (not narrow) so backward quantises their gradients as
    // one where they are.
    auto qkv = linear_cat_split(u, {wq, wk, wv});
    // RoPE, then QK-norm when on: one kernel each for q and k on a GPU.
    auto rotate = [&](const torch::Tensor& x) { return qk_norm_ ? rope_qk_norm(x, p.pos, rope_) : rope(x, p.pos, rope_); };
    q = rotate(qkv[0].view({B, T, nh_, dh_}));
    k = rotate(qkv[1].view({B, T, nkv_, dh_}));
    v = qkv[2].view({B, T, nkv_, dh_});
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh_));
  auto o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, p);
  return wo(o.transpose(1, 2).reshape({B, T, nh_ * dh_}));
}

void AttentionImpl::reset_parameters(double std0, double std_out) {
  torch::NoGradGuard no_grad;
  for (auto* lin : {&wq, &wk, &wv}) (*lin)->weight.normal_(0.0, std0);
  wo->weight.normal_(0.0, std_out);
}

torch::Tensor AttentionImpl::step(const torch::Tensor& u, MixerCache& cache) {
  const int64_t B = u.size(0);
  TORCH_CHECK(u.size(1) == 1, "attention step: expected one token, got ", u.sizes());
  auto pos = torch::full({B, 1}, cache.pos, torch::TensorOptions().dtype(torch::kInt64).device(u.device()));
  auto q = apply_rope(wq(u).view({B, 1, nh_, dh_}), pos, rope_);
  auto k = apply_rope(wk(u).view({B, 1, nkv_, dh_}), pos, rope_);
  auto v = wv(u).view({B, 1, nkv_, dh_});
  if (qk_norm_) {
    q = rms_norm_plain(q);
    k = rms_norm_plain(k);
  }
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  cache.k = cache.k.defined() ? torch::cat({cache.k, k}, 2) : k;
  cache.v = cache.v.defined() ? torch::cat({cache.v, v}, 2) : v;
  cache.pos += 1;
  // The newest query sees every cached key: no mask needed.
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh_));
  auto o = at::scaled_dot_product_attention(q.transpose(1, 2), cache.k, cache.v, {}, 0.0, false, scale,
                                            /*enable_gqa=*/nkv_ != nh_);
  return wo(o.transpose(1, 2).reshape({B, 1, nh_ * dh_}));
}

Positions dense_positions(int64_t B, int64_t T, torch::Device device) {
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(device));
  Positions p;
  p.pos = pos.unsqueeze(0).expand({B, T});
  p.max_seqlen = T;
  return p;
}

torch::Tensor document_ids(const torch::Tensor& cu_seqlens, int64_t N, torch::Device device) {
  auto cu = cu_seqlens.to(torch::kCPU, torch::kInt64).contiguous();
  auto lengths = cu.narrow(0, 1, cu.size(0) - 1) - cu.narrow(0, 0, cu.size(0) - 1);
  auto ids = torch::repeat_interleave(torch::arange(lengths.size(0), torch::kInt64), lengths);
  TORCH_CHECK(ids.size(0) == N, "cu_seqlens covers ", ids.size(0), " tokens, the row has ", N);
  return ids.to(device);
}

Positions packed_positions(const torch::Tensor& cu_seqlens, int64_t N, torch::Device device) {
  auto cu = cu_seqlens.to(torch::kCPU, torch::kInt64).contiguous();
  TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 2, "cu_seqlens: expected [n_docs+1], got ", cu.sizes());
  const int64_t* c = cu.data_ptr<int64_t>();
  TORCH_CHECK(c[0] == 0 && c[cu.size(0) - 1] == N, "cu_seqlens: must start at 0 and end at N=", N);
  int64_t max_len = 0;
  for (int64_t i = 1; i < cu.size(0); ++i) {
    TORCH_CHECK(c[i] > c[i - 1], "cu_seqlens: must be strictly increasing (entry ", i, ")");
    max_len = std::max(max_len, c[i] - c[i - 1]);
  }
  auto ids = document_ids(cu, N, torch::kCPU);
  auto pos = torch::arange(N, torch::kInt64) - cu.index({ids});
  Positions p;
  p.pos = pos.unsqueeze(0).to(device);
  p.cu_seqlens = cu;
  p.max_seqlen = max_len;
  p.cu_seqlens_device = cu.to(torch::TensorOptions().dtype(torch::kInt32).device(device));
  p.doc_ids = ids.to(device);
  return p;
}

Positions packed_positions(const torch::Tensor& cu_seqlens, int64_t B, int64_t T, torch::Device device) {
  auto p = packed_positions(cu_seqlens, B * T, torch::kCPU);
  if (B > 1) {
    // A piece crossing a row would see the next row's tokens as its own continuation.
    const int64_t* c = p.cu_seqlens.data_ptr<int64_t>();
    const int64_t n = p.cu_seqlens.size(0);
    int64_t j = 0;
    for (int64_t r = 1; r < B; ++r) {
      while (j < n && c[j] < r * T) ++j;
      TORCH_CHECK(j < n && c[j] == r * T, "cu_seqlens: a document piece crosses the end of row ", r - 1,
                  " (cu_seqlens must include every multiple of T=", T, ")");
    }
  }
  p.pos = p.pos.view({B, T}).to(device);
  p.cu_seqlens_device = p.cu_seqlens_device.to(device);
  p.doc_ids = p.doc_ids.to(device);
  return p;
}

namespace {

// Zero-pads V's head dim up to Q's: every SDPA backend then sees equal head dims, and the padded
// output columns are exactly zero (they are cut off again by the caller).
torch::Tensor pad_values(const torch::Tensor& v, int64_t dqk) {
  const int64_t dv = v.size(-1);
  return dv < dqk ? torch::constant_pad_nd(v, {0, dqk - dv}) : v;
}

// The flash kernel's varlen entry takes packed [N, heads, D] rows and int32 cu_seqlens on the
// device. It exists only on CUDA, for half types and head dims that are multiples of 8 up to 256.
bool flash_varlen_usable(const torch::Tensor& q) {
  const auto dt = q.scalar_type();
  const int64_t D = q.size(-1);
  return q.is_cuda() && (dt == torch::kBFloat16 || dt == torch::kHalf) && D % 8 == 0 && D <= 256;
}

// [B,H,T,D] -> [B*T,H,D], the packed kernels' (flash's and cuDNN's) layout: a view when the
// memory is token-major ([B,T,H,D] with unit-stride rows, any token and head strides; for B = 1
// any layout with unit-stride rows), else one copy.
torch::Tensor tokens_major(const torch::Tensor& t) {
  const int64_t B = t.size(0), T = t.size(2);
  auto r = t.transpose(1, 2);  // [B,T,H,D]
  auto f = B == 1 ? r.select(0, 0) : r.reshape({B * T, t.size(1), t.size(3)});
  return f.stride(2) == 1 ? f : f.contiguous();
}

// The piece count and the span S a packed batch's cuDNN graphs take (model/cudnn_attention.h):
// S a power of two covering the longest piece, at most the row length T, so that a run meets few
// graph shapes; 0 where a piece is longer than a row (cuDNN's pieces are row-bound; flash then).
int64_t packed_pieces(const Positions& p) {
  return (p.cu_seqlens_device.defined() ? p.cu_seqlens_device : p.cu_seqlens).size(0) - 1;
}
int64_t packed_span(const Positions& p, int64_t T) {
  if (p.max_seqlen > T) return 0;
  int64_t S = 64;
  while (S < p.max_seqlen) S *= 2;
  return std::min(S, T);
}

torch::Tensor packed_cu_int32(const Positions& p, const torch::Device& device) {
  return p.cu_seqlens_device.defined() ? p.cu_seqlens_device
                                       : p.cu_seqlens.to(torch::TensorOptions().dtype(torch::kInt32).device(device));
}

torch::Tensor causal_attention_flash_varlen(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& vp,
                                            double scale, const Positions& p) {
  const int64_t B = q.size(0), T = q.size(2);
  const auto cu = packed_cu_int32(p, q.device());
  auto out = at::_flash_attention_forward(tokens_major(q), tokens_major(k), tokens_major(vp), cu, cu, p.max_seqlen,
                                          p.max_seqlen, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*return_debug_mask=*/false, scale);
  return std::get<0>(out).view({B, T, q.size(1), vp.size(3)}).transpose(1, 2);  // [B,H,T,D]
}

// Packed rows on cuDNN's kernel (V at its own width): [B,H,T,dv], or undefined where it does not
// apply (switched off, no frontend, a shape cuDNN refuses): the caller then takes flash.
torch::Tensor causal_attention_cudnn_packed(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            double scale, const Positions& p) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), dv = v.size(3), S = packed_span(p, T);
  if (!packed_attention_cudnn_enabled() || !cudnn_frontend_built() || S == 0) return {};
  auto o = cudnn_packed_attention(tokens_major(q), tokens_major(k), tokens_major(v), packed_cu_int32(p, q.device()),
                                  S, scale);
  return o.defined() ? o.view({B, T, H, dv}).transpose(1, 2) : o;
}

}  // namespace

namespace {

class HeadsToTokensFn : public torch::autograd::Function<HeadsToTokensFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& o, int64_t dv) {
    const int64_t B = o.size(0), H = o.size(1), T = o.size(2);
    ctx->saved_data["H"] = H;
    ctx->saved_data["D"] = o.size(3);
    return o.narrow(-1, 0, dv).transpose(1, 2).reshape({B, T, H * dv});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t H = ctx->saved_data["H"].toInt(), D = ctx->saved_data["D"].toInt();
    const auto& g = grads[0];  // [B,T,H·dv]
    const int64_t B = g.size(0), T = g.size(1), dv = g.size(2) / H;
    auto g4 = g.reshape({B, T, H, dv});  // a view unless autograd handed over odd strides
    if (dv == D) return {g4.transpose(1, 2), torch::Tensor()};
    auto dout = torch::empty({B, T, H, D}, g.options());
    dout.narrow(-1, dv, D - dv).zero_();
    dout.narrow(-1, 0, dv).copy_(g4);
    return {dout.transpose(1, 2), torch::Tensor()};  // [B,H,T,D] over [B,T,H,D] memory
  }
};

}  // namespace

torch::Tensor heads_to_tokens(const torch::Tensor& o, int64_t dv) {
  TORCH_CHECK(o.dim() == 4 && dv >= 1 && dv <= o.size(3), "heads_to_tokens: expected o [B,H,T,D] and 1 <= dv <= D, got ",
              o.sizes(), " and dv = ", dv);
  return HeadsToTokensFn::apply(o, dv);
}

torch::Tensor causal_attention_masked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      double scale, const Positions& p) {
  const int64_t dqk = q.size(-1), dv = v.size(-1);
  const int64_t B = q.size(0), T = q.size(2);
  // Pieces never cross rows, so each row gets its own block-diagonal causal mask [B,1,T,T]:
  // same document and not in the future. O(T²) memory per row, the reference.
  auto doc = (p.doc_ids.defined() ? p.doc_ids : document_ids(p.cu_seqlens, B * T, q.device())).view({B, T});
  auto idx = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(q.device()));
  auto mask = (doc.unsqueeze(2) == doc.unsqueeze(1)) & (idx.view({1, T, 1}) >= idx.view({1, 1, T}));
  auto o = at::scaled_dot_product_attention(q, k, pad_values(v, dqk), mask.unsqueeze(1), 0.0,
                                            /*is_causal=*/false, scale, /*enable_gqa=*/q.size(1) != k.size(1));
  return dv < dqk ? o.narrow(-1, 0, dv) : o;
}

namespace {

std::atomic<bool> g_narrow_values{true};

// Whether SDPA runs dense causal attention over these very tensors on cuDNN's kernel.
bool sdpa_picks_cudnn(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale) {
  if (!q.is_cuda()) return false;
  const auto pick = at::_fused_sdp_choice(q, k, v, {}, 0.0, /*is_causal=*/true, scale,
                                          /*enable_gqa=*/q.size(1) != k.size(1));
  return pick == static_cast<int64_t>(at::SDPBackend::cudnn_attention);
}

}  // namespace

void attention_narrow_values(bool on) { g_narrow_values = on; }

bool dense_attention_takes_narrow_values(int64_t B, int64_t T, int64_t H, int64_t dqk, int64_t dv,
                                         const torch::TensorOptions& opt, double scale) {
  if (!g_narrow_values || dv >= dqk || !opt.device().is_cuda()) return false;
  // Uninitialised tensors from the caching allocator: no kernel runs, and a captured CUDA graph
  // records nothing for them.
  const bool grad = torch::GradMode::is_enabled();
  auto qk = torch::empty({B, T, H, dqk}, opt).transpose(1, 2).requires_grad_(grad);
  auto v = torch::empty({B, T, H, dv}, opt).transpose(1, 2).requires_grad_(grad);
  return sdpa_picks_cudnn(qk, qk, v, scale);
}

bool packed_attention_takes_narrow_values(int64_t B, int64_t T, int64_t H, int64_t dqk, int64_t dv,
                                          const torch::TensorOptions& opt, double scale, const Positions& p,
                                          int64_t v_head_stride) {
  const int64_t span = packed_span(p, T);
  if (!g_narrow_values || dv >= dqk || !opt.device().is_cuda() || !packed_attention_cudnn_enabled() || span == 0)
    return false;
  PackedAttentionShape s;
  s.tokens = B * T;
  s.pieces = packed_attention_pieces(packed_pieces(p));
  s.S = span;
  s.H = s.Hkv = H;
  s.dqk = dqk;
  s.dv = dv;
  s.q_token_stride = s.k_token_stride = H * dqk;
  s.q_head_stride = s.k_head_stride = dqk;
  s.v_head_stride = v_head_stride != 0 ? v_head_stride : dv;
  s.v_token_stride = H * s.v_head_stride;
  s.dtype = c10::typeMetaToScalarType(opt.dtype());
  s.device = opt.device();
  s.scale = scale;
  s.backward = torch::GradMode::is_enabled();
  return cudnn_packed_attention_supported(s);
}

torch::Tensor causal_attention_token_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          double scale, const Positions& p, int64_t dv) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && dv >= 1 && dv <= v.size(3),
              "causal_attention_token_rows: expected q, k and v [B,T,H,D] and 1 <= dv <= V's width, got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes(), " and dv = ", dv);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2);
  // Straight to cuDNN's packed kernel where it runs: no autograd view between the caller's tensors
  // and the kernel's, so their gradients come back laid out as the kernel's backward makes them.
  auto rows_apart = [&](const torch::Tensor& t) { return B == 1 || t.stride(0) == T * t.stride(1); };
  if (p.varlen() && flash_varlen_usable(q) && packed_attention_cudnn_enabled() && cudnn_frontend_built() &&
      rows_apart(q) && rows_apart(k) && rows_apart(v)) {
    if (const int64_t S = packed_span(p, T); S > 0) {
      auto o = cudnn_packed_attention(q, k, v, packed_cu_int32(p, q.device()), S, scale);
      if (o.defined()) return dv == v.size(3) ? o.view({B, T, H * dv}) : heads_to_tokens(o.transpose(1, 2), dv);
    }
  }
  return heads_to_tokens(causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, p), dv);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                               const Positions& p) {
  const int64_t dqk = q.size(-1), dv = v.size(-1);
  if (p.varlen() && !flash_varlen_usable(q)) return causal_attention_masked(q, k, v, scale, p);
  if (p.varlen()) {
    if (auto o = causal_attention_cudnn_packed(q, k, v, scale, p); o.defined()) return o;
    auto o = causal_attention_flash_varlen(q, k, pad_values(v, dqk), scale, p);
    return dv < dqk ? o.narrow(-1, 0, dv) : o;
  }
  const bool narrow = dv < dqk && g_narrow_values && sdpa_picks_cudnn(q, k, v, scale);
  auto o = at::scaled_dot_product_attention(q, k, narrow ? v : pad_values(v, dqk), {}, 0.0, /*is_causal=*/true, scale,
                                            /*enable_gqa=*/q.size(1) != k.size(1));
  return dv < o.size(-1) ? o.narrow(-1, 0, dv) : o;
}

}  // namespace model

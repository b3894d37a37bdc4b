#include "model/fused_rope.h"

#include <atomic>
#include <utility>
#include <vector>

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/rope.h"
#include "model/kernel_dtype.h"
#include "model/sole_storage.h"
#endif

namespace model {

namespace {
std::atomic<bool> g_rope_qkv_fused{true};
std::atomic<bool> g_mla_qkv_fused{true};
std::atomic<int64_t> g_mla_grads_in_place{0};
}  // namespace

void rope_qkv_fused(bool on) { g_rope_qkv_fused = on; }
void mla_qkv_fused(bool on) { g_mla_qkv_fused = on; }
int64_t mla_gradients_in_place() { return g_mla_grads_in_place; }

bool fused_rope_applies(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables) {
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  return x.is_cuda() && x.dim() == 4 && kernel_dtype(x.scalar_type(), dt) && x.stride(3) == 1 &&
         x.size(3) % 2 == 0 && x.size(1) > 1 && pos.dim() == 2 && pos.scalar_type() == torch::kInt64 &&
         pos.device() == x.device() && pos.size(0) == x.size(0) && pos.size(1) == x.size(1) &&
         tables.cos.device() == x.device() && tables.cos.scalar_type() == torch::kFloat64 &&
         tables.cos.is_contiguous() && tables.sin.is_contiguous() && tables.cos.size(1) == x.size(3) / 2 &&
         x.size(1) <= tables.cos.size(0);
#else
  (void)x, (void)pos, (void)tables;
  return false;
#endif
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor launch(const torch::Tensor& x, const torch::Tensor& pos, const torch::Tensor& cos,
                     const torch::Tensor& sin, bool inverse) {
  kernels::DType dt{};
  kernel_dtype(x.scalar_type(), dt);
  auto out = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  kernels::RopeShape s{x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2),
                       pos.stride(0), pos.stride(1)};
  check_kernel_launch(kernels::rope_apply(out.data_ptr(), x.data_ptr(), dt, pos.data_ptr<int64_t>(),
                                          cos.data_ptr<double>(), sin.data_ptr<double>(), s, inverse,
                                          c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                      inverse ? "RoPE backward" : "RoPE forward");
  return out;
}

// One part of rope_apply_parts: x [B,T,H,D] (unit-stride last dim) into out, whose heads are
// contiguous within a token and whose tokens are out_st elements apart.
kernels::RopePart rope_part(const torch::Tensor& x, const torch::Tensor& out, int64_t out_st, bool rotate) {
  return kernels::RopePart{x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), x.size(2), out.data_ptr(), out_st,
                           rotate};
}

// rotated_width: the rotated parts' head width (0: like's last dim).
void launch_parts(const std::vector<kernels::RopePart>& parts, const torch::Tensor& like, const torch::Tensor& pos,
                  const torch::Tensor& cos, const torch::Tensor& sin, bool inverse, const char* what,
                  int64_t rotated_width = 0) {
  TORCH_CHECK(!parts.empty() && parts.size() <= static_cast<size_t>(kernels::kRopeMaxParts), what, ": ",
              parts.size(), " parts for one launch, at most ", kernels::kRopeMaxParts);
  kernels::DType dt{};
  kernel_dtype(like.scalar_type(), dt);
  kernels::RopeParts p;
  p.B = like.size(0);
  p.T = like.size(1);
  p.D = rotated_width != 0 ? rotated_width : like.size(3);
  p.pos_sb = pos.stride(0);
  p.pos_st = pos.stride(1);
  p.n = static_cast<int>(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) p.part[i] = parts[i];
  check_kernel_launch(kernels::rope_apply_parts(p, dt, pos.data_ptr<int64_t>(), cos.data_ptr<double>(),
                                                sin.data_ptr<double>(), inverse,
                                                c10::cuda::getCurrentCUDAStream(like.device().index()).stream()),
                      what);
}

// A gradient as the kernel reads it: unit stride in the last dim.
torch::Tensor unit_last(const torch::Tensor& g) { return g.stride(3) == 1 ? g : g.contiguous(); }

class FusedRopeFn : public torch::autograd::Function<FusedRopeFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& pos,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->save_for_backward({pos, cos, sin});
    return launch(x, pos, cos, sin, /*inverse=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    // The rotation is orthogonal: its transpose is the rotation by −θ.
    return {launch(unit_last(grads[0]), saved[0], saved[1], saved[2], /*inverse=*/true), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

// q, k and v out of the fused projection's rows qkv [B, T, (nh + 2 nkv) · dh]; see rope_qkv.
class FusedRopeQkvFn : public torch::autograd::Function<FusedRopeQkvFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, const torch::Tensor& pos,
                               const torch::Tensor& cos, const torch::Tensor& sin, int64_t nh, int64_t nkv,
                               int64_t dh) {
    const int64_t B = qkv.size(0), T = qkv.size(1);
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: its columns are zeroed
    ctx->save_for_backward({pos, cos, sin});
    ctx->saved_data["nh"] = nh;
    ctx->saved_data["nkv"] = nkv;
    ctx->saved_data["dh"] = dh;
    auto part = [&](int64_t col, int64_t heads) { return qkv.narrow(2, col * dh, heads * dh).view({B, T, heads, dh}); };
    auto q = part(0, nh), k = part(nh, nkv);
    auto q_rot = torch::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    auto k_rot = torch::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
    launch_parts({rope_part(q, q_rot, nh * dh, true), rope_part(k, k_rot, nkv * dh, true)}, q, pos, cos, sin, false,
                 "RoPE q|k forward");
    return {q_rot, k_rot, part(nh + nkv, nkv)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t nh = ctx->saved_data["nh"].toInt(), nkv = ctx->saved_data["nkv"].toInt();
    const int64_t dh = ctx->saved_data["dh"].toInt(), W = (nh + 2 * nkv) * dh;
    const torch::Tensor* any = nullptr;
    for (const auto& g : grads) any = (any == nullptr && g.defined()) ? &g : any;
    if (any == nullptr) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
                                torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const int64_t B = any->size(0), T = any->size(1);
    auto dqkv = torch::empty({B, T, W}, any->options().memory_format(at::MemoryFormat::Contiguous));
    auto part = [&](int64_t col, int64_t heads) { return dqkv.narrow(2, col * dh, heads * dh); };
    // dq and dk rotated back straight into their columns and dv copied into its own, in one launch:
    // the three gradients in one tensor with no concatenation. A missing gradient is zeros.
    const int64_t cols[3] = {0, nh, nh + nkv}, heads[3] = {nh, nkv, nkv};
    std::vector<kernels::RopePart> parts;
    std::vector<torch::Tensor> read;  // keeps any contiguous copy alive until the launch
    for (int i = 0; i < 3; ++i) {
      if (grads[i].defined()) {
        read.push_back(unit_last(grads[i]));
        parts.push_back(rope_part(read.back(), part(cols[i], heads[i]), W, /*rotate=*/i < 2));
      } else {
        part(cols[i], heads[i]).zero_();
      }
    }
    launch_parts(parts, *any, saved[0], saved[1], saved[2], /*inverse=*/true, "RoPE q|k|v backward");
    return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// Whether g [B,T,H,D] sits in rows of `row` elements (its heads D_row = row / H apart, unit-stride
// rows, tokens one row apart) at column `col` of each head, in a storage that holds all B·T rows
// from col elements before g's first one and that nothing but g holds: a gradient the caller may
// widen into those rows and fill in (cuDNN's backward lays V's gradient out so,
// model/cudnn_attention.h).
bool sole_rows_at(const torch::Tensor& g, int64_t head_row, int64_t col) {
  if (!g.defined() || g.dim() != 4 || g.stride(3) != 1 || g.stride(2) != head_row ||
      g.stride(1) != g.size(2) * head_row || (g.size(0) > 1 && g.stride(0) != g.size(1) * g.stride(1)))
    return false;
  return sole_storage_with_room(g, col, g.size(0) * g.size(1) * g.size(2) * head_row);
}

// MLA's Q, K and V from its projections' pieces; see mla_qkv. Inputs: q [B,T,nh,dn+dr], kv
// [B,T,nh,dn+dva], k_r [B,T,dr] (strided, unit-stride last dim), dva <= dn + dr. V is dn + dr
// wide (zero-padded) when pad_v, else dva; with v_view (not pad_v) the view of kv's V columns.
class MlaQkvFn : public torch::autograd::Function<MlaQkvFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& kv,
                               const torch::Tensor& k_r, const torch::Tensor& pos, const torch::Tensor& cos,
                               const torch::Tensor& sin, int64_t dn, bool pad_v, bool v_view) {
    const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), dqk = q.size(3), dr = dqk - dn;
    const int64_t dva = kv.size(3) - dn, st = nh * dqk, dv_out = pad_v ? dqk : dva;
    ctx->save_for_backward({pos, cos, sin});
    ctx->saved_data["dn"] = dn;
    ctx->saved_data["dva"] = dva;
    ctx->saved_data["dqk"] = dqk;
    ctx->saved_data["kv_row"] = kv.stride(2);  // elements between kv's heads: where dV's rows would be
    auto opt = q.options().memory_format(at::MemoryFormat::Contiguous);
    auto Q = torch::empty({B, T, nh, dqk}, opt), K = torch::empty({B, T, nh, dqk}, opt);
    auto tail = [](const torch::Tensor& x, int64_t from) { return static_cast<char*>(x.data_ptr()) + from * x.element_size(); };
    auto piece = [&](const torch::Tensor& x, int64_t col, int64_t width, int64_t heads, int64_t x_sh, void* out,
                     bool rotate) {
      return kernels::RopePart{tail(x, col), x.stride(0), x.stride(1), x_sh, heads, out, st, rotate, width, dqk};
    };
    std::vector<kernels::RopePart> parts = {
        piece(q, 0, dn, nh, q.stride(2), Q.data_ptr(), false),              // q_n
        piece(q, dn, dr, nh, q.stride(2), tail(Q, dn), true),               // RoPE(q_r)
        piece(kv, 0, dn, nh, kv.stride(2), K.data_ptr(), false),            // kv_n
        piece(k_r, 0, dr, nh, 0, tail(K, dn), true)};                       // RoPE(k_r), every head
    // V as kv's own columns where the attention takes them strided (cuDNN's packed kernel): no copy,
    // and its gradient comes back in rows laid out as kv's.
    torch::Tensor V = v_view ? kv.narrow(3, dn, dva) : torch::empty({B, T, nh, dv_out}, opt);
    if (!v_view) {
      parts.push_back(kernels::RopePart{tail(kv, dn), kv.stride(0), kv.stride(1), kv.stride(2), nh, V.data_ptr(),
                                        nh * dv_out, false, dva, dv_out});  // kv_v
      if (dva < dv_out)
        parts.push_back(kernels::RopePart{nullptr, 0, 0, 0, nh, tail(V, dva), st, false, dqk - dva, dqk});
    }
    launch_parts(parts, Q, pos, cos, sin, /*inverse=*/false, "MLA q|k|v forward", dr);
    return {Q, K, V};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t dn = ctx->saved_data["dn"].toInt(), dva = ctx->saved_data["dva"].toInt();
    const int64_t dqk = ctx->saved_data["dqk"].toInt(), dr = dqk - dn, kv_row = ctx->saved_data["kv_row"].toInt();
    const torch::Tensor* any = nullptr;
    for (const auto& g : grads) any = (any == nullptr && g.defined()) ? &g : any;
    const int64_t B = any->size(0), T = any->size(1), nh = any->size(2);
    auto zeros = [&](int64_t width) { return torch::zeros({B, T, nh, width}, any->options()); };
    auto opt = any->options().memory_format(at::MemoryFormat::Contiguous);
    // dq is Q's gradient with its rope columns turned back in place, where Q's gradient is a
    // contiguous buffer nothing else holds (cuDNN's), nor the tensor itself: two references are this
    // call's (CppNode hands backward a copy of its own list), a third (a hook, a gradient handed to
    // two inputs) would see it change. dkv is the rows V's gradient sits in, where it sits in rows of
    // kv's width (cuDNN's, for a V viewed in kv): only kv's other columns are written there.
    const bool dq_in_place = sole_rows_at(grads[0], dqk, 0) && grads[0].use_count() <= 2;
    const bool dkv_in_place = kv_row == dn + dva && sole_rows_at(grads[2], dn + dva, dn);
    auto dQ = dq_in_place ? grads[0] : (grads[0].defined() ? unit_last(grads[0]) : zeros(dqk));
    auto dK = grads[1].defined() ? unit_last(grads[1]) : zeros(dqk);
    auto dq = dq_in_place ? grads[0] : torch::empty({B, T, nh, dqk}, opt);
    torch::Tensor dkv;
    if (dkv_in_place) {
      const auto& g = grads[2];
      dkv = torch::empty({0}, g.options())
                .set_(g.storage(), g.storage_offset() - dn, {B, T, nh, dn + dva},
                      {T * nh * (dn + dva), nh * (dn + dva), dn + dva, 1});
    } else {
      dkv = torch::empty({B, T, nh, dn + dva}, opt);
    }
    g_mla_grads_in_place += static_cast<int64_t>(dq_in_place) + static_cast<int64_t>(dkv_in_place);
    auto dkr_heads = torch::empty({B, T, nh, dr}, opt);
    auto at = [](const torch::Tensor& x, int64_t col) { return static_cast<char*>(x.data_ptr()) + col * x.element_size(); };
    auto piece = [&](const torch::Tensor& g, int64_t col, int64_t width, void* out, int64_t out_st, int64_t out_sh,
                     bool rotate) {
      return kernels::RopePart{at(g, col), g.stride(0), g.stride(1), g.stride(2), nh, out, out_st, rotate, width, out_sh};
    };
    // The rotation is orthogonal: its transpose is the rotation by −θ. In place, each pair of dQ's
    // rope columns is read and written by the same thread.
    std::vector<kernels::RopePart> parts = {piece(dQ, dn, dr, at(dq, dn), nh * dqk, dqk, true),
                                            piece(dK, 0, dn, dkv.data_ptr(), nh * (dn + dva), dn + dva, false),
                                            piece(dK, dn, dr, dkr_heads.data_ptr(), nh * dr, dr, true)};
    if (!dq_in_place) parts.push_back(piece(dQ, 0, dn, dq.data_ptr(), nh * dqk, dqk, false));
    if (!dkv_in_place) {
      auto dV = grads[2].defined() ? unit_last(grads[2]) : zeros(dva);  // only its first dva columns are read
      parts.push_back(piece(dV, 0, dva, at(dkv, dn), nh * (dn + dva), dn + dva, false));
    }
    launch_parts(parts, dq, saved[0], saved[1], saved[2], /*inverse=*/true, "MLA q|k|v backward", dr);
    return {dq,           dkv,           dkr_heads.sum(2), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

kernels::RopeShape shape_of(const torch::Tensor& x, const torch::Tensor& pos) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2), pos.stride(0),
          pos.stride(1)};
}

// RoPE + QK-norm of x [B,T,H,D] (strided, unit-stride last dim) through the forward kernel: y
// contiguous, and the per-(token, head) rstd the backward reads.
std::pair<torch::Tensor, torch::Tensor> rope_norm_forward(const torch::Tensor& x, const torch::Tensor& pos,
                                                          const torch::Tensor& cos, const torch::Tensor& sin,
                                                          double eps, const char* what) {
  kernels::DType dt{};
  kernel_dtype(x.scalar_type(), dt);
  auto y = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  auto rstd = torch::empty({x.size(0) * x.size(1) * x.size(2)}, x.options().dtype(torch::kFloat32));
  check_kernel_launch(kernels::rope_rmsnorm_forward(y.data_ptr(), rstd.data_ptr<float>(), x.data_ptr(), dt,
                                                    pos.data_ptr<int64_t>(), cos.data_ptr<double>(),
                                                    sin.data_ptr<double>(), shape_of(x, pos), static_cast<float>(eps),
                                                    c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                      what);
  return {y, rstd};
}

class FusedRopeNormFn : public torch::autograd::Function<FusedRopeNormFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& pos,
                               const torch::Tensor& cos, const torch::Tensor& sin, double eps) {
    auto [y, rstd] = rope_norm_forward(x, pos, cos, sin, eps, "RoPE + QK-norm forward");
    ctx->save_for_backward({y, rstd, pos, cos, sin});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& y = saved[0];
    kernels::DType dt{};
    kernel_dtype(y.scalar_type(), dt);
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(y);
    check_kernel_launch(kernels::rope_rmsnorm_backward(dx.data_ptr(), dy.data_ptr(), y.data_ptr(),
                                                       saved[1].data_ptr<float>(), dt, saved[2].data_ptr<int64_t>(),
                                                       saved[3].data_ptr<double>(), saved[4].data_ptr<double>(),
                                                       shape_of(y, saved[2]),
                                                       c10::cuda::getCurrentCUDAStream(y.device().index()).stream()),
                        "RoPE + QK-norm backward");
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// q and k with RoPE and QK-norm, and v, out of the fused projection's rows qkv [B, T, (nh + 2 nkv)
// · dh]; see rope_norm_qkv.
class FusedRopeNormQkvFn : public torch::autograd::Function<FusedRopeNormQkvFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, const torch::Tensor& pos,
                               const torch::Tensor& cos, const torch::Tensor& sin, int64_t nh, int64_t nkv,
                               int64_t dh, double eps) {
    const int64_t B = qkv.size(0), T = qkv.size(1);
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: its columns are zeroed
    auto part = [&](int64_t col, int64_t heads) { return qkv.narrow(2, col * dh, heads * dh).view({B, T, heads, dh}); };
    auto [q, q_rstd] = rope_norm_forward(part(0, nh), pos, cos, sin, eps, "RoPE + QK-norm forward (q)");
    auto [k, k_rstd] = rope_norm_forward(part(nh, nkv), pos, cos, sin, eps, "RoPE + QK-norm forward (k)");
    ctx->save_for_backward({q, q_rstd, k, k_rstd, pos, cos, sin});
    ctx->saved_data["nh"] = nh;
    ctx->saved_data["nkv"] = nkv;
    ctx->saved_data["dh"] = dh;
    return {q, k, part(nh + nkv, nkv)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t nh = ctx->saved_data["nh"].toInt(), nkv = ctx->saved_data["nkv"].toInt();
    const int64_t dh = ctx->saved_data["dh"].toInt();
    const auto& pos = saved[4];
    const torch::Tensor* any = nullptr;
    for (const auto& g : grads) any = (any == nullptr && g.defined()) ? &g : any;
    variable_list out(8);
    if (any == nullptr) return out;
    const int64_t B = any->size(0), T = any->size(1);
    auto dqkv = torch::empty({B, T, (nh + 2 * nkv) * dh}, any->options().memory_format(at::MemoryFormat::Contiguous));
    kernels::DType dt{};
    kernel_dtype(dqkv.scalar_type(), dt);
    // One launch: dq and dk through the norm's and the rotation's backward straight into their
    // columns, dv copied into its own (no tensors of their own to concatenate); a missing gradient
    // is zeros. dv is read where it is (cuDNN's is a view at the projection's row width) when its
    // strides suit the kernel's 8-byte loads.
    const auto dq = grads[0].defined() ? grads[0].contiguous() : torch::Tensor();
    const auto dk = grads[1].defined() ? grads[1].contiguous() : torch::Tensor();
    auto dv = grads[2].defined() ? unit_last(grads[2]) : torch::Tensor();
    const int64_t v = 8 / dqkv.element_size();
    if (dv.defined() && (dv.stride(0) % v != 0 || dv.stride(1) % v != 0 || dv.stride(2) % v != 0 ||
                         reinterpret_cast<uintptr_t>(dv.data_ptr()) % 8 != 0)) {
      dv = dv.contiguous();
    }
    kernels::RopeNormQkvGrads g;
    g.dqkv = dqkv.data_ptr();
    g.dq = dq.defined() ? dq.data_ptr() : nullptr;
    g.dk = dk.defined() ? dk.data_ptr() : nullptr;
    g.yq = saved[0].data_ptr();
    g.yk = saved[2].data_ptr();
    g.rstd_q = saved[1].data_ptr<float>();
    g.rstd_k = saved[3].data_ptr<float>();
    if (dv.defined()) {
      g.dv = dv.data_ptr();
      g.dv_sb = dv.stride(0);
      g.dv_st = dv.stride(1);
      g.dv_sh = dv.stride(2);
    }
    g.B = B;
    g.T = T;
    g.nh = nh;
    g.nkv = nkv;
    g.D = dh;
    g.pos_sb = pos.stride(0);
    g.pos_st = pos.stride(1);
    check_kernel_launch(kernels::rope_rmsnorm_qkv_backward(g, dt, pos.data_ptr<int64_t>(), saved[5].data_ptr<double>(),
                                                           saved[6].data_ptr<double>(),
                                                           c10::cuda::getCurrentCUDAStream(dqkv.device().index()).stream()),
                        "RoPE + QK-norm q|k|v backward");
    out[0] = dqkv;
    return out;
  }
};

}  // namespace
#endif

torch::Tensor rope_qk_norm(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables, double eps) {
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (fused_rope_applies(x, pos, tables) && kernel_dtype(x.scalar_type(), dt) &&
      kernels::rope_rmsnorm_supported(dt, shape_of(x, pos), x.data_ptr()))
    return FusedRopeNormFn::apply(x, pos, tables.cos, tables.sin, eps);
#endif
  return rms_norm_plain(apply_rope(x, pos, tables), eps);
}

namespace {

// q, k and v as views of a fused projection's rows qkv [B, T, (nh + 2 nkv) · dh]; `what` names the
// caller in the error for another shape.
RopedQkv qkv_views(const torch::Tensor& qkv, int64_t nh, int64_t nkv, int64_t dh, const char* what) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) == (nh + 2 * nkv) * dh, what, ": expected qkv [B, T, ",
              (nh + 2 * nkv) * dh, "], got ", qkv.sizes());
  const int64_t B = qkv.size(0), T = qkv.size(1);
  auto parts = qkv.split_with_sizes({nh * dh, nkv * dh, nkv * dh}, -1);
  return {parts[0].view({B, T, nh, dh}), parts[1].view({B, T, nkv, dh}), parts[2].view({B, T, nkv, dh})};
}

}  // namespace

RopedQkv rope_qkv(const torch::Tensor& qkv, int64_t nh, int64_t nkv, int64_t dh, const torch::Tensor& pos,
                  const RopeTables& tables) {
  const auto [q, k, v] = qkv_views(qkv, nh, nkv, dh, "rope_qkv");
#if defined(DD_HAVE_CUDA)
  if (g_rope_qkv_fused && qkv.is_contiguous() && fused_rope_applies(q, pos, tables) &&
      fused_rope_applies(k, pos, tables)) {
    auto out = FusedRopeQkvFn::apply(qkv, pos, tables.cos, tables.sin, nh, nkv, dh);
    return {out[0], out[1], out[2]};
  }
#endif
  return {rope(q, pos, tables), rope(k, pos, tables), v};
}

RopedQkv rope_norm_qkv(const torch::Tensor& qkv, int64_t nh, int64_t nkv, int64_t dh, const torch::Tensor& pos,
                       const RopeTables& tables, double eps) {
  const auto [q, k, v] = qkv_views(qkv, nh, nkv, dh, "rope_norm_qkv");
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (g_rope_qkv_fused && qkv.is_contiguous() && fused_rope_applies(q, pos, tables) &&
      fused_rope_applies(k, pos, tables) && kernel_dtype(qkv.scalar_type(), dt) &&
      kernels::rope_rmsnorm_supported(dt, shape_of(q, pos), q.data_ptr()) &&
      kernels::rope_rmsnorm_supported(dt, shape_of(k, pos), k.data_ptr())) {
    auto out = FusedRopeNormQkvFn::apply(qkv, pos, tables.cos, tables.sin, nh, nkv, dh, eps);
    return {out[0], out[1], out[2]};
  }
#endif
  return {rope_qk_norm(q, pos, tables, eps), rope_qk_norm(k, pos, tables, eps), v};
}

MlaQkv mla_qkv(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& k_r, int64_t dn,
               const torch::Tensor& pos, const RopeTables& tables, bool pad_v, bool v_view) {
  TORCH_CHECK(q.dim() == 4 && kv.dim() == 4 && k_r.dim() == 3 && kv.sizes().slice(0, 3) == q.sizes().slice(0, 3) &&
                  k_r.size(0) == q.size(0) && k_r.size(1) == q.size(1) && 0 < dn && dn < q.size(3) &&
                  k_r.size(2) == q.size(3) - dn && kv.size(3) > dn,
              "mla_qkv: expected q [B,T,nh,dn+dr], kv [B,T,nh,dn+dva] and k_r [B,T,dr] with dn=", dn, ", got ",
              q.sizes(), ", ", kv.sizes(), ", ", k_r.sizes());
  TORCH_CHECK(!(pad_v && v_view), "mla_qkv: V cannot be both padded and a view of kv");
  const int64_t B = q.size(0), T = q.size(1), nh = q.size(2), dqk = q.size(3), dr = dqk - dn, dva = kv.size(3) - dn;
  auto q_parts = q.split_with_sizes({dn, dr}, -1);
  auto kv_parts = kv.split_with_sizes({dn, dva}, -1);
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  const auto k_heads = k_r.unsqueeze(2);
  if (g_mla_qkv_fused && dva <= dqk && dn % 2 == 0 && dva % 2 == 0 && kernel_dtype(q.scalar_type(), dt) &&
      kv.scalar_type() == q.scalar_type() && k_r.scalar_type() == q.scalar_type() && kv.device() == q.device() &&
      k_r.device() == q.device() && kv.stride(3) == 1 && fused_rope_applies(q_parts[1], pos, tables) &&
      fused_rope_applies(k_heads, pos, tables)) {
    auto out = MlaQkvFn::apply(q, kv, k_r, pos, tables.cos, tables.sin, dn, pad_v, v_view);
    return {out[0], out[1], out[2]};
  }
#endif
  auto Q = torch::cat({q_parts[0], rope(q_parts[1], pos, tables)}, -1);
  auto K = torch::cat({kv_parts[0], rope(k_r.unsqueeze(2), pos, tables).expand({B, T, nh, dr})}, -1);
  auto V = pad_v && dva < dqk ? torch::constant_pad_nd(kv_parts[1], {0, dqk - dva})
                              : (v_view ? kv_parts[1] : kv_parts[1].contiguous());
  return {Q, K, V};
}

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables) {
#if defined(DD_HAVE_CUDA)
  if (fused_rope_applies(x, pos, tables)) return FusedRopeFn::apply(x, pos, tables.cos, tables.sin);
#endif
  return apply_rope(x, pos, tables);
}

}  // namespace model

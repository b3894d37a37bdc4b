#include "model/fused_rope.h"

#include <atomic>
#include <vector>

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/rope.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {
std::atomic<bool> g_rope_qkv_fused{true};
}  // namespace

void rope_qkv_fused(bool on) { g_rope_qkv_fused = on; }

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

void launch_parts(const std::vector<kernels::RopePart>& parts, const torch::Tensor& like, const torch::Tensor& pos,
                  const torch::Tensor& cos, const torch::Tensor& sin, bool inverse) {
  kernels::DType dt{};
  kernel_dtype(like.scalar_type(), dt);
  kernels::RopeParts p;
  p.B = like.size(0);
  p.T = like.size(1);
  p.D = like.size(3);
  p.pos_sb = pos.stride(0);
  p.pos_st = pos.stride(1);
  p.n = static_cast<int>(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) p.part[i] = parts[i];
  check_kernel_launch(kernels::rope_apply_parts(p, dt, pos.data_ptr<int64_t>(), cos.data_ptr<double>(),
                                                sin.data_ptr<double>(), inverse,
                                                c10::cuda::getCurrentCUDAStream(like.device().index()).stream()),
                      inverse ? "RoPE q|k|v backward" : "RoPE q|k forward");
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
    launch_parts({rope_part(q, q_rot, nh * dh, true), rope_part(k, k_rot, nkv * dh, true)}, q, pos, cos, sin, false);
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
    launch_parts(parts, *any, saved[0], saved[1], saved[2], /*inverse=*/true);
    return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

kernels::RopeShape shape_of(const torch::Tensor& x, const torch::Tensor& pos) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2), pos.stride(0),
          pos.stride(1)};
}

class FusedRopeNormFn : public torch::autograd::Function<FusedRopeNormFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& pos,
                               const torch::Tensor& cos, const torch::Tensor& sin, double eps) {
    kernels::DType dt{};
    kernel_dtype(x.scalar_type(), dt);
    auto y = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    auto rstd = torch::empty({x.size(0) * x.size(1) * x.size(2)}, x.options().dtype(torch::kFloat32));
    check_kernel_launch(kernels::rope_rmsnorm_forward(y.data_ptr(), rstd.data_ptr<float>(), x.data_ptr(), dt,
                                                      pos.data_ptr<int64_t>(), cos.data_ptr<double>(),
                                                      sin.data_ptr<double>(), shape_of(x, pos), static_cast<float>(eps),
                                                      c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                        "RoPE + QK-norm forward");
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

RopedQkv rope_qkv(const torch::Tensor& qkv, int64_t nh, int64_t nkv, int64_t dh, const torch::Tensor& pos,
                  const RopeTables& tables) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) == (nh + 2 * nkv) * dh, "rope_qkv: expected qkv [B, T, ",
              (nh + 2 * nkv) * dh, "], got ", qkv.sizes());
  const int64_t B = qkv.size(0), T = qkv.size(1);
  auto parts = qkv.split_with_sizes({nh * dh, nkv * dh, nkv * dh}, -1);
  auto q = parts[0].view({B, T, nh, dh}), k = parts[1].view({B, T, nkv, dh}), v = parts[2].view({B, T, nkv, dh});
#if defined(DD_HAVE_CUDA)
  if (g_rope_qkv_fused && qkv.is_contiguous() && fused_rope_applies(q, pos, tables) &&
      fused_rope_applies(k, pos, tables)) {
    auto out = FusedRopeQkvFn::apply(qkv, pos, tables.cos, tables.sin, nh, nkv, dh);
    return {out[0], out[1], out[2]};
  }
#endif
  return {rope(q, pos, tables), rope(k, pos, tables), v};
}

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables) {
#if defined(DD_HAVE_CUDA)
  if (fused_rope_applies(x, pos, tables)) return FusedRopeFn::apply(x, pos, tables.cos, tables.sin);
#endif
  return apply_rope(x, pos, tables);
}

}  // namespace model

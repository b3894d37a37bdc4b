#include "model/fused_rope.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/rope.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

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
    auto dy = grads[0].stride(3) == 1 ? grads[0] : grads[0].contiguous();
    return {launch(dy, saved[0], saved[1], saved[2], /*inverse=*/true), torch::Tensor(), torch::Tensor(),
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

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& pos, const RopeTables& tables) {
#if defined(DD_HAVE_CUDA)
  if (fused_rope_applies(x, pos, tables)) return FusedRopeFn::apply(x, pos, tables.cos, tables.sin);
#endif
  return apply_rope(x, pos, tables);
}

}  // namespace model

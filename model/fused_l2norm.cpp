#include "model/fused_l2norm.h"

#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include "kernels/l2_norm.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

void check_shape(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(3) > 0, "l2_norm: expected x [B,T,H,D] with D > 0, got ", x.sizes());
}

// The ATen formula, differentiable: y, and r [rows] in the math dtype.
L2NormRowsOut reference_rows(const torch::Tensor& x, double eps, torch::ScalarType out_dtype) {
  // fp64 math for an fp64 result, else fp32 (a 16-bit result is the fp32 one rounded).
  const auto math = out_dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto xf = x.scalar_type() == math ? x : x.to(math);
  auto r = torch::rsqrt(xf.square().sum(-1, /*keepdim=*/true) + eps);
  auto y = xf * r;
  return {y.scalar_type() == out_dtype ? y : y.to(out_dtype), r.reshape({-1})};
}

}  // namespace

torch::Tensor l2_norm_reference(const torch::Tensor& x, double eps, torch::ScalarType out_dtype) {
  check_shape(x);
  return reference_rows(x, eps, out_dtype).y;
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::DType dtype_of(torch::ScalarType t) { return checked_kernel_dtype(t, "L2Norm kernels"); }

// Whether the kernels read x as it lies: unit column stride, the heads of a token side by side, and
// a token stride that covers the batch (x[b, t] at (b·T + t) · stride(1)).
bool rows_in_place(const torch::Tensor& x) {
  return x.stride(3) == 1 && (x.size(2) == 1 || x.stride(2) == x.size(3)) &&
         (x.size(0) == 1 || x.stride(0) == x.size(1) * x.stride(1));
}

kernels::L2NormRows rows_of(const torch::Tensor& x) {
  kernels::L2NormRows r;
  r.D = x.size(3);
  r.N = x.numel() / r.D;
  r.heads = x.size(2);
  r.ld = x.size(1) == 1 && x.size(0) == 1 ? x.size(2) * x.size(3) : x.stride(1);
  return r;
}

class FusedL2NormFn : public torch::autograd::Function<FusedL2NormFn> {
 public:
  // out_dtype: fp32, or x's own dtype.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, double eps, int64_t out_dtype) {
    auto xr = rows_in_place(x) ? x : x.contiguous();
    auto out = forward_kernel(xr, eps, static_cast<torch::ScalarType>(out_dtype));
    // x is saved as the view it is: its storage (the short conv's output) is kept for the delta
    // rule's v in any case, so no copy of q or k is held.
    ctx->save_for_backward({xr, out.rstd});
    return out.y;
  }

  // y and r from x as the kernel reads it (rows_in_place).
  static L2NormRowsOut forward_kernel(const torch::Tensor& xr, double eps, torch::ScalarType out_dtype) {
    const auto rows = rows_of(xr);
    L2NormRowsOut out;
    out.y = torch::empty(xr.sizes(), xr.options().dtype(out_dtype));
    out.rstd = torch::empty({rows.N}, xr.options().dtype(torch::kFloat32));
    check_kernel_launch(kernels::l2_norm_forward(out.y.data_ptr(), dtype_of(out_dtype), out.rstd.data_ptr<float>(),
                                                 xr.data_ptr(), dtype_of(xr.scalar_type()), rows,
                                                 static_cast<float>(eps), stream_of(xr)),
                        "L2Norm forward");
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {input_grad_kernel(grads[0], saved[0], saved[1]), torch::Tensor(), torch::Tensor()};
  }

  // x as the forward read it (rows_in_place), r fp32 [rows].
  static torch::Tensor input_grad_kernel(const torch::Tensor& grad, const torch::Tensor& x, const torch::Tensor& rstd) {
    // dy in y's dtype as the forward wrote it (fp32 or x's), read as it comes.
    auto dy = grad.contiguous();
    if (dy.scalar_type() != torch::kFloat32 && dy.scalar_type() != x.scalar_type()) dy = dy.to(torch::kFloat32);
    auto dx = torch::empty(x.sizes(), x.options().memory_format(torch::MemoryFormat::Contiguous));
    check_kernel_launch(kernels::l2_norm_backward(dx.data_ptr(), dy.data_ptr(), dtype_of(dy.scalar_type()), x.data_ptr(),
                                                  dtype_of(x.scalar_type()), rstd.data_ptr<float>(), rows_of(x),
                                                  stream_of(x)),
                        "L2Norm backward");
    return dx;
  }
};

bool kernels_apply(const torch::Tensor& x, torch::ScalarType out) {
  kernels::DType d{};
  return x.is_cuda() && (out == torch::kFloat32 || out == x.scalar_type()) && kernel_dtype(x.scalar_type(), d) &&
         x.numel() > 0;
}

}  // namespace
#endif

torch::Tensor fused_l2_norm(const torch::Tensor& x, double eps, torch::ScalarType out_dtype) {
  check_shape(x);
#if defined(DD_HAVE_CUDA)
  if (kernels_apply(x, out_dtype)) return FusedL2NormFn::apply(x, eps, static_cast<int64_t>(out_dtype));
#endif
  return l2_norm_reference(x, eps, out_dtype);
}

L2NormRowsOut l2_norm_rows(const torch::Tensor& x, double eps, torch::ScalarType out_dtype) {
  check_shape(x);
  torch::NoGradGuard no_grad;
#if defined(DD_HAVE_CUDA)
  if (kernels_apply(x, out_dtype)) {
    return FusedL2NormFn::forward_kernel(rows_in_place(x) ? x : x.contiguous(), eps, out_dtype);
  }
#endif
  return reference_rows(x, eps, out_dtype);
}

torch::Tensor l2_norm_input_grad(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& rstd) {
  check_shape(x);
  TORCH_CHECK(dy.sizes() == x.sizes() && rstd.numel() * x.size(3) == x.numel(),
              "l2_norm_input_grad: dy ", dy.sizes(), ", x ", x.sizes(), " and rstd ", rstd.sizes(), " do not match");
  torch::NoGradGuard no_grad;
#if defined(DD_HAVE_CUDA)
  // The kernel reads dy in fp32 or in x's dtype (input_grad_kernel converts any other).
  const auto dy_dt = dy.scalar_type() == x.scalar_type() ? x.scalar_type() : torch::kFloat32;
  if (rstd.scalar_type() == torch::kFloat32 && kernels_apply(x, dy_dt)) {
    return FusedL2NormFn::input_grad_kernel(dy, rows_in_place(x) ? x : x.contiguous(), rstd.contiguous());
  }
#endif
  const auto math = rstd.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto r = rstd.to(math).reshape({x.size(0), x.size(1), x.size(2), 1});
  auto y = x.to(math) * r, dyf = dy.to(math);
  auto dx = r * (dyf - y * (y * dyf).sum(-1, /*keepdim=*/true));
  return dx.to(x.scalar_type()).contiguous();
}

}  // namespace model

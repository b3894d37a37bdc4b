#include "model/bmm_fp32.h"

#include <torch/torch.h>

#include <atomic>

#if defined(DD_HAVE_CUDA)
#include "kernels/gemm_tf32x3.h"
#include "kernels/row_dot.h"
#include "model/kernel_dtype.h"
#endif

namespace model {
namespace {

std::atomic<bool> g_use_kernel{true};
std::atomic<bool> g_wide_tiles{true};

void check_operands(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), what,
              ": expected a [R, M, K] and b [R, K, N], got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.device() == b.device(), what,
              ": a and b differ in dtype or device (", a.scalar_type(), " on ", a.device(), ", ", b.scalar_type(),
              " on ", b.device(), ")");
}

#if defined(DD_HAVE_CUDA)
kernels::GemmOperand operand(const torch::Tensor& x) {
  kernels::GemmOperand o;
  o.ptr = x.data_ptr<float>();
  // A batch of one has an arbitrary batch stride; 0 keeps the alignment check meaningful.
  o.batch = x.size(0) == 1 ? 0 : x.stride(0);
  o.row = x.stride(1);
  o.col = x.stride(2);
  // A dimension of extent 1 has an arbitrary stride: name it contiguous if the other one is not.
  if (x.size(2) == 1 && o.row != 1) o.col = 1;
  if (x.size(1) == 1 && o.col != 1) o.row = 1;
  return o;
}

// The kernel's arguments when it takes this product (fp32 CUDA tensors, supported layouts).
bool kernel_args(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, double alpha, double beta,
                 kernels::GemmTf32x3Args& g) {
  if (!g_use_kernel || !a.is_cuda() || a.scalar_type() != torch::kFloat32 || out.numel() == 0 || a.size(2) == 0)
    return false;
  g.batch = a.size(0);
  g.M = a.size(1);
  g.K = a.size(2);
  g.N = b.size(2);
  g.a = operand(a);
  g.b = operand(b);
  g.out = out.data_ptr<float>();
  g.out_batch = out.stride(0);
  g.out_row = out.stride(1);
  g.alpha = static_cast<float>(alpha);
  g.beta = static_cast<float>(beta);
  g.n_strips = g_wide_tiles ? 0 : 2;
  return out.stride(2) == 1 && kernels::gemm_tf32x3_supports(g);
}

void launch(const kernels::GemmTf32x3Args& g, const torch::Tensor& a) {
  check_kernel_launch(kernels::gemm_tf32x3(g, stream_of(a)), "3xTF32 batched GEMM");
}
#endif

}  // namespace

void bmm_fp32_use_kernel(bool on) { g_use_kernel = on; }
void bmm_fp32_wide_tiles(bool on) { g_wide_tiles = on; }

torch::Tensor bmm_fp32_reference(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  check_operands(a, b, "bmm_fp32_reference");
  if (alpha == 1.0) return torch::bmm(a, b);
  return torch::baddbmm(torch::empty({a.size(0), a.size(1), b.size(2)}, a.options()), a, b, 0.0, alpha);
}

torch::Tensor bmm_fp32(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  check_operands(a, b, "bmm_fp32");
#if defined(DD_HAVE_CUDA)
  auto out = torch::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  kernels::GemmTf32x3Args g;
  if (kernel_args(out, a, b, alpha, 0.0, g)) {
    launch(g, a);
    return out;
  }
#endif
  return bmm_fp32_reference(a, b, alpha);
}

torch::Tensor bmm_fp32_sum(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& a2,
                           const torch::Tensor& b2, double alpha) {
  check_operands(a, b, "bmm_fp32_sum");
  check_operands(a2, b2, "bmm_fp32_sum (second pair)");
  TORCH_CHECK(a2.size(0) == a.size(0) && a2.size(1) == a.size(1) && b2.size(2) == b.size(2) &&
                  a2.scalar_type() == a.scalar_type() && a2.device() == a.device(),
              "bmm_fp32_sum: the pairs' products differ: ", a.sizes(), " · ", b.sizes(), " and ", a2.sizes(), " · ",
              b2.sizes());
#if defined(DD_HAVE_CUDA)
  auto out = torch::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  kernels::GemmTf32x3Args g;
  if (a2.size(2) > 0 && kernel_args(out, a, b, alpha, 0.0, g)) {
    g.K2 = a2.size(2);
    g.a2 = operand(a2);
    g.b2 = operand(b2);
    if (kernels::gemm_tf32x3_supports(g)) {
      launch(g, a);
      return out;
    }
  }
#endif
  auto sum = bmm_fp32(a, b, alpha);
  return bmm_fp32_accumulate(sum, a2, b2, alpha, 1.0);
}

torch::Tensor& bmm_fp32_accumulate(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, double alpha,
                                   double beta) {
  check_operands(a, b, "bmm_fp32_accumulate");
  TORCH_CHECK(out.dim() == 3 && out.size(0) == a.size(0) && out.size(1) == a.size(1) && out.size(2) == b.size(2) &&
                  out.is_contiguous() && out.scalar_type() == a.scalar_type(),
              "bmm_fp32_accumulate: expected a contiguous out [", a.size(0), ", ", a.size(1), ", ", b.size(2),
              "] of a's dtype, got ", out.sizes(), " ", out.scalar_type());
#if defined(DD_HAVE_CUDA)
  kernels::GemmTf32x3Args g;
  if (kernel_args(out, a, b, alpha, beta, g)) {
    launch(g, a);
    return out;
  }
#endif
  return out.baddbmm_(a, b, beta, alpha);
}

torch::Tensor row_dot_fp32_reference(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 1 && a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type(),
              "row_dot_fp32: expected a and b of one shape [R, ...] and dtype, got ", a.sizes(), " ", a.scalar_type(),
              " and ", b.sizes(), " ", b.scalar_type());
  const int64_t R = a.size(0), n = R == 0 ? 0 : a.numel() / R;
  return torch::bmm(a.reshape({R, 1, n}), b.reshape({R, n, 1})).view({R});
}

torch::Tensor row_dot_fp32(const torch::Tensor& a, const torch::Tensor& b) {
#if defined(DD_HAVE_CUDA)
  if (g_use_kernel && a.is_cuda() && a.scalar_type() == torch::kFloat32 && a.dim() >= 1 && a.sizes() == b.sizes() &&
      b.scalar_type() == torch::kFloat32 && a.device() == b.device() && a.is_contiguous() && b.is_contiguous()) {
    const int64_t R = a.size(0), n = R == 0 ? 0 : a.numel() / R;
    auto out = torch::empty({R}, a.options());
    check_kernel_launch(kernels::row_dot_fp32(out.data_ptr<float>(), a.data_ptr<float>(), b.data_ptr<float>(), R, n,
                                              stream_of(a)),
                        "row dot product");
    return out;
  }
#endif
  return row_dot_fp32_reference(a, b);
}

}  // namespace model

#include "model/bmm_fp32.h"

#include <torch/torch.h>

#include <atomic>
#include <string>

#if defined(DD_HAVE_CUDA)
#include "kernels/gemm_tf32x3.h"
#include "kernels/row_dot.h"
#include "model/kernel_dtype.h"
#endif

namespace model {
namespace {

std::atomic<bool> g_use_kernel{true};
std::atomic<bool> g_wide_tiles{true};
std::atomic<bool> g_bf16_mma{true};
std::atomic<int64_t> g_bf16_result_launches{0};

bool is_bf16(const torch::Tensor& x) { return x.scalar_type() == torch::kBFloat16; }

// The operands' dtypes: both as the result's (fp32, or fp64 for the references' tests), or bf16
// ones beside fp32 or bf16 (the result is then fp32).
void check_operands(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), what,
              ": expected a [R, M, K] and b [R, K, N], got ", a.sizes(), " and ", b.sizes());
  auto f32_or_bf16 = [](const torch::Tensor& x) { return is_bf16(x) || x.scalar_type() == torch::kFloat32; };
  const bool with_bf16 = (is_bf16(a) || is_bf16(b)) && f32_or_bf16(a) && f32_or_bf16(b);
  TORCH_CHECK((a.scalar_type() == b.scalar_type() && !is_bf16(a)) || with_bf16, what,
              ": expected a and b of one dtype, or bf16 beside fp32 or bf16, got ", a.scalar_type(), " and ",
              b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), what, ": a and b are on different devices (", a.device(), ", ", b.device(),
              ")");
}

// The dtype of the products' results: fp32 for a bf16 operand, else the operands' own.
torch::ScalarType result_dtype(const torch::Tensor& a) { return is_bf16(a) ? torch::kFloat32 : a.scalar_type(); }

// The two pairs of a sum of products: each pair as check_operands takes it, and products of one
// shape, result dtype and device.
void check_pairs(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& a2, const torch::Tensor& b2,
                 const std::string& what) {
  check_operands(a, b, what.c_str());
  check_operands(a2, b2, (what + " (second pair)").c_str());
  TORCH_CHECK(a2.size(0) == a.size(0) && a2.size(1) == a.size(1) && b2.size(2) == b.size(2) &&
                  result_dtype(a2) == result_dtype(a) && a2.device() == a.device(),
              what, ": the pairs' products differ: ", a.sizes(), " · ", b.sizes(), " and ", a2.sizes(), " · ",
              b2.sizes());
}

// An operand as ATen's fp32 products take it (a bf16 one widened, exactly).
torch::Tensor widened(const torch::Tensor& x) { return is_bf16(x) ? x.to(torch::kFloat32) : x; }

#if defined(DD_HAVE_CUDA)
kernels::GemmOperand operand(const torch::Tensor& x) {
  kernels::GemmOperand o;
  o.ptr = x.data_ptr();
  o.bf16 = is_bf16(x);
  // A batch of one has an arbitrary batch stride; 0 keeps the alignment check meaningful.
  o.batch = x.size(0) == 1 ? 0 : x.stride(0);
  o.row = x.stride(1);
  o.col = x.stride(2);
  // A dimension of extent 1 has an arbitrary stride: name it contiguous if the other one is not.
  if (x.size(2) == 1 && o.row != 1) o.col = 1;
  if (x.size(1) == 1 && o.col != 1) o.row = 1;
  return o;
}

// The kernel's arguments for out = alpha · a b + beta · out when it takes the product: a [R, M, K]
// and b [R, K, N] as the operands ga and gb, their shapes read from a_shape and b_shape (the
// tensors themselves, or storage-less stand-ins for gathered rows).
bool kernel_args_for(const torch::Tensor& out, const torch::Tensor& a_shape, const torch::Tensor& b_shape,
                     const kernels::GemmOperand& ga, const kernels::GemmOperand& gb, double alpha, double beta,
                     kernels::GemmTf32x3Args& g) {
  const bool bf16_out = is_bf16(out);
  if (!g_use_kernel || !out.is_cuda() || (out.scalar_type() != torch::kFloat32 && !bf16_out) || out.numel() == 0 ||
      a_shape.size(2) == 0)
    return false;
  g.batch = a_shape.size(0);
  g.M = a_shape.size(1);
  g.K = a_shape.size(2);
  g.N = b_shape.size(2);
  g.a = ga;
  g.b = gb;
  g.out = out.data_ptr();
  g.out_bf16 = bf16_out;
  g.out_batch = out.stride(0);
  g.out_row = out.stride(1);
  g.alpha = static_cast<float>(alpha);
  g.beta = static_cast<float>(beta);
  g.n_strips = g_wide_tiles ? 0 : 2;
  g.bf16_mma = g_bf16_mma;
  return out.stride(2) == 1 && kernels::gemm_tf32x3_supports(g);
}

// The same for fp32 or bf16 CUDA tensors a and b.
bool kernel_args(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, double alpha, double beta,
                 kernels::GemmTf32x3Args& g) {
  return a.is_cuda() && kernel_args_for(out, a, b, operand(a), operand(b), alpha, beta, g);
}

void launch(const kernels::GemmTf32x3Args& g, const torch::Tensor& a) {
  check_kernel_launch(kernels::gemm_tf32x3(g, stream_of(a)), "3xTF32 batched GEMM");
}
#endif

}  // namespace

void bmm_fp32_use_kernel(bool on) { g_use_kernel = on; }
void bmm_fp32_wide_tiles(bool on) { g_wide_tiles = on; }

void bmm_fp32_bf16_mma(bool on) { g_bf16_mma = on; }

int64_t bmm_fp32_bf16_result_launches() { return g_bf16_result_launches.load(); }

torch::Tensor bmm_fp32_reference(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  check_operands(a, b, "bmm_fp32_reference");
  const auto aw = widened(a), bw = widened(b);
  if (alpha == 1.0) return torch::bmm(aw, bw);
  return torch::baddbmm(torch::empty({a.size(0), a.size(1), b.size(2)}, aw.options()), aw, bw, 0.0, alpha);
}

torch::Tensor bmm_fp32(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  check_operands(a, b, "bmm_fp32");
#if defined(DD_HAVE_CUDA)
  auto out = torch::empty({a.size(0), a.size(1), b.size(2)}, a.options().dtype(result_dtype(a)));
  kernels::GemmTf32x3Args g;
  if (kernel_args(out, a, b, alpha, 0.0, g)) {
    launch(g, a);
    return out;
  }
#endif
  return bmm_fp32_reference(a, b, alpha);
}

torch::Tensor bmm_fp32_sum(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& a2,
                           const torch::Tensor& b2, double alpha, bool bf16_result) {
  check_pairs(a, b, a2, b2, "bmm_fp32_sum");
  TORCH_CHECK(!bf16_result || result_dtype(a) == torch::kFloat32,
              "bmm_fp32_sum: a bf16 result is for fp32 products, got ", result_dtype(a), " ones");
#if defined(DD_HAVE_CUDA)
  auto out = torch::empty({a.size(0), a.size(1), b.size(2)},
                          a.options().dtype(bf16_result ? torch::kBFloat16 : result_dtype(a)));
  kernels::GemmTf32x3Args g;
  if (a2.size(2) > 0 && kernel_args(out, a, b, alpha, 0.0, g)) {
    g.K2 = a2.size(2);
    g.a2 = operand(a2);
    g.b2 = operand(b2);
    if (kernels::gemm_tf32x3_supports(g)) {
      launch(g, a);
      if (bf16_result) ++g_bf16_result_launches;
      return out;
    }
  }
#endif
  auto sum = bmm_fp32(a, b, alpha);
  bmm_fp32_accumulate(sum, a2, b2, alpha, 1.0);
  return bf16_result ? sum.to(torch::kBFloat16) : sum;
}

torch::Tensor bmm_fp32_sum_scattered(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& a2,
                                     const torch::Tensor& b2, double alpha, const torch::Tensor& out_rows,
                                     int64_t n_rows) {
  check_pairs(a, b, a2, b2, "bmm_fp32_sum_scattered");
  const int64_t R = a.size(0), M = a.size(1), N = b.size(2);
  TORCH_CHECK(out_rows.scalar_type() == torch::kInt32 && out_rows.numel() == R * M && out_rows.device() == a.device(),
              "bmm_fp32_sum_scattered: expected out_rows int32 [", R * M, "] on ", a.device(), ", got ",
              out_rows.scalar_type(), " ", out_rows.sizes(), " on ", out_rows.device());
  auto out = torch::empty({n_rows, N}, a.options().dtype(result_dtype(a)));
#if defined(DD_HAVE_CUDA)
  kernels::GemmTf32x3Args g;
  const auto rows = out_rows.contiguous();
  if (a2.size(2) > 0 && kernel_args(out.view({1, n_rows, N}), a, b, alpha, 0.0, g)) {
    g.K2 = a2.size(2);
    g.a2 = operand(a2);
    g.b2 = operand(b2);
    g.out_batch = 0;
    g.out_row = N;
    g.out_rows = rows.data_ptr<int32_t>();
    if (kernels::gemm_tf32x3_supports(g)) {
      launch(g, a);
      return out;
    }
  }
#endif
  // Dropped rows go to one spare row past the end (no data-dependent sizes, so no host sync).
  const auto sum = bmm_fp32_sum(a, b, a2, b2, alpha).view({R * M, N});
  auto rows64 = out_rows.reshape({-1}).to(torch::kInt64);
  rows64 = torch::where(rows64.ge(0), rows64, torch::full_like(rows64, n_rows));
  auto with_spare = torch::empty({n_rows + 1, N}, out.options());
  with_spare.index_copy_(0, rows64, sum);
  return with_spare.narrow(0, 0, n_rows);
}

namespace {

void check_gathered(const GatheredRows& x, const char* what) {
  TORCH_CHECK(x.src.dim() == 2 && (x.src.size(1) <= 1 || x.src.stride(1) == 1), what,
              ": expected gathered rows from a 2-D src with contiguous rows, got ", x.src.sizes());
  TORCH_CHECK(x.map.scalar_type() == torch::kInt32 && x.map.numel() == x.R * x.rows && x.map.device() == x.src.device(),
              what, ": expected a row map int32 [", x.R * x.rows, "] on ", x.src.device(), ", got ", x.map.scalar_type(),
              " ", x.map.sizes(), " on ", x.map.device());
}

#if defined(DD_HAVE_CUDA)
kernels::GemmOperand gathered_operand(const GatheredRows& x, const torch::Tensor& map) {
  kernels::GemmOperand o;
  o.ptr = x.src.data_ptr();
  o.bf16 = is_bf16(x.src);
  o.batch = 0;
  o.row = x.src.stride(0);
  o.col = 1;
  o.rows = map.data_ptr<int32_t>();
  return o;
}
#endif

// The product of a and b where exactly one side is gathered (a_rows or b_rows): the kernel reading
// the gathered side in place, else the gathered copy's product.
torch::Tensor gathered_product(const GatheredRows* a_rows, const torch::Tensor& a_plain, const GatheredRows* b_rows,
                               const torch::Tensor& b_plain, double alpha) {
  const GatheredRows& x = a_rows != nullptr ? *a_rows : *b_rows;
  check_gathered(x, "bmm_fp32 (gathered rows)");
  // Shapes and dtypes checked on storage-less stand-ins of both sides.
  auto meta = [](c10::IntArrayRef sizes, const torch::Tensor& like) {
    return torch::empty(sizes, like.options().device(torch::kMeta));
  };
  const auto x_meta = meta({x.R, x.rows, x.src.size(1)}, x.src);
  const auto a = a_rows != nullptr ? x_meta : meta(a_plain.sizes(), a_plain);
  const auto b = b_rows != nullptr ? x_meta : meta(b_plain.sizes(), b_plain);
  check_operands(a, b, "bmm_fp32 (gathered rows)");
  TORCH_CHECK((a_rows != nullptr ? b_plain : a_plain).device() == x.src.device(),
              "bmm_fp32 (gathered rows): the operands are on different devices");
#if defined(DD_HAVE_CUDA)
  auto out = torch::empty({a.size(0), a.size(1), b.size(2)}, x.src.options().dtype(result_dtype(a)));
  kernels::GemmTf32x3Args g;
  const auto map = x.map.contiguous();
  // The kernel writes fp32 (fp32 or bf16 operands); fp64 and fp16 products take the gathered copy.
  if (kernel_args_for(out, a, b, a_rows != nullptr ? gathered_operand(x, map) : operand(a_plain),
                      b_rows != nullptr ? gathered_operand(x, map) : operand(b_plain), alpha, 0.0, g)) {
    launch(g, x.src);
    return out;
  }
#endif
  return a_rows != nullptr ? bmm_fp32(gathered(*a_rows), b_plain, alpha) : bmm_fp32(a_plain, gathered(*b_rows), alpha);
}

}  // namespace

torch::Tensor gathered(const GatheredRows& x) {
  check_gathered(x, "gathered");
  const int64_t n = x.src.size(0);
  // −1 picks a zero row appended past the end (no data-dependent sizes, so no host sync).
  const auto idx = x.map.reshape({-1}).to(torch::kInt64);
  const auto with_zero = torch::cat({x.src, torch::zeros({1, x.src.size(1)}, x.src.options())}, 0);
  return with_zero.index_select(0, torch::where(idx.ge(0), idx, torch::full_like(idx, n)))
      .view({x.R, x.rows, x.src.size(1)});
}

torch::Tensor bmm_fp32(const GatheredRows& a, const torch::Tensor& b, double alpha) {
  return gathered_product(&a, torch::Tensor(), nullptr, b, alpha);
}

torch::Tensor bmm_fp32(const torch::Tensor& a, const GatheredRows& b, double alpha) {
  return gathered_product(nullptr, a, &b, torch::Tensor(), alpha);
}

torch::Tensor& bmm_fp32_accumulate(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, double alpha,
                                   double beta) {
  check_operands(a, b, "bmm_fp32_accumulate");
  TORCH_CHECK(out.dim() == 3 && out.size(0) == a.size(0) && out.size(1) == a.size(1) && out.size(2) == b.size(2) &&
                  out.is_contiguous() && out.scalar_type() == result_dtype(a),
              "bmm_fp32_accumulate: expected a contiguous out [", a.size(0), ", ", a.size(1), ", ", b.size(2),
              "] of dtype ", result_dtype(a), ", got ", out.sizes(), " ", out.scalar_type());
#if defined(DD_HAVE_CUDA)
  kernels::GemmTf32x3Args g;
  if (kernel_args(out, a, b, alpha, beta, g)) {
    launch(g, a);
    return out;
  }
#endif
  return out.baddbmm_(widened(a), widened(b), beta, alpha);
}

torch::Tensor row_dot_fp32_reference(const torch::Tensor& a, const torch::Tensor& b) {
  if (!is_bf16(a) && is_bf16(b)) return row_dot_fp32_reference(b, a);  // symmetric: the bf16 one first
  TORCH_CHECK(a.dim() >= 1 && a.sizes() == b.sizes() &&
                  ((a.scalar_type() == b.scalar_type() && !is_bf16(a)) ||
                   (is_bf16(a) && (b.scalar_type() == torch::kFloat32 || is_bf16(b)))),
              "row_dot_fp32: expected a and b of one shape [R, ...] and dtype (or a bf16 and b fp32 or bf16), got ",
              a.sizes(), " ", a.scalar_type(), " and ", b.sizes(), " ", b.scalar_type());
  const int64_t R = a.size(0), n = R == 0 ? 0 : a.numel() / R;
  return torch::bmm(widened(a).reshape({R, 1, n}), widened(b).reshape({R, n, 1})).view({R});
}

torch::Tensor row_dot_fp32(const torch::Tensor& a, const torch::Tensor& b) {
  if (!is_bf16(a) && is_bf16(b)) return row_dot_fp32(b, a);  // symmetric: the bf16 one first
#if defined(DD_HAVE_CUDA)
  const auto f32 = torch::kFloat32;
  const bool dtypes_ok = (a.scalar_type() == f32 && b.scalar_type() == f32) || (is_bf16(a) && b.scalar_type() == f32) ||
                         (is_bf16(a) && is_bf16(b));
  if (g_use_kernel && a.is_cuda() && dtypes_ok && a.dim() >= 1 && a.sizes() == b.sizes() && a.device() == b.device() &&
      a.is_contiguous() && b.is_contiguous()) {
    const int64_t R = a.size(0), n = R == 0 ? 0 : a.numel() / R;
    auto out = torch::empty({R}, a.options().dtype(f32));
    const auto bits = [](const torch::Tensor& x) { return reinterpret_cast<const uint16_t*>(x.data_ptr()); };
    const int err = !is_bf16(a)  ? kernels::row_dot_fp32(out.data_ptr<float>(), a.data_ptr<float>(),
                                                         b.data_ptr<float>(), R, n, stream_of(a))
                    : is_bf16(b) ? kernels::row_dot_bf16(out.data_ptr<float>(), bits(a), bits(b), R, n, stream_of(a))
                                 : kernels::row_dot_bf16_fp32(out.data_ptr<float>(), bits(a), b.data_ptr<float>(), R, n,
                                                              stream_of(a));
    check_kernel_launch(err, "row dot product");
    return out;
  }
#endif
  return row_dot_fp32_reference(a, b);
}

}  // namespace model

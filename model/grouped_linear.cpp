#include "model/grouped_linear.h"

#include <torch/torch.h>

#include <numeric>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/grouped_gemm.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

void check_args(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2), "grouped_linear: expected x [M,K], w [E,N,K], got ",
              x.sizes(), " and ", w.sizes());
  TORCH_CHECK(static_cast<int64_t>(rows.size()) == w.size(0), "grouped_linear: ", rows.size(), " row counts for ",
              w.size(0), " groups");
  TORCH_CHECK(std::accumulate(rows.begin(), rows.end(), int64_t{0}) == x.size(0),
              "grouped_linear: row counts do not add up to x's ", x.size(0), " rows");
}

}  // namespace

torch::Tensor grouped_linear_reference(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows) {
  check_args(x, w, rows);
  const auto xs = x.split_with_sizes(rows, 0);
  const auto ws = w.unbind(0);
  std::vector<torch::Tensor> ys;
  for (size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] > 0) ys.push_back(torch::matmul(xs[e], ws[e].t()));
  }
  if (ys.empty()) return torch::zeros({0, w.size(1)}, x.options());
  return ys.size() == 1 ? ys[0] : torch::cat(ys, 0);
}

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Runs one grouped product into c; the pointer table is a scratch device tensor.
void run(kernels::GroupedProduct p, const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c,
         const std::vector<int64_t>& rows, int64_t N, int64_t K) {
  kernels::DType dt{};
  kernel_dtype(a.scalar_type(), dt);
  const int64_t E = static_cast<int64_t>(rows.size());
  std::vector<void*> host(static_cast<size_t>(3 * E));
  auto table = torch::empty({3 * E}, a.options().dtype(torch::kInt64));
  const int status = kernels::grouped_gemm(at::cuda::getCurrentCUDABlasHandle(),
                                           c10::cuda::getCurrentCUDAStream(a.device().index()).stream(), p, dt, rows, N,
                                           K, a.data_ptr(), b.data_ptr(), c.data_ptr(), host.data(),
                                           reinterpret_cast<void**>(table.data_ptr<int64_t>()));
  TORCH_CHECK(status == 0, "grouped_linear: cuBLAS grouped GEMM failed with status ", status);
}

class GroupedLinearFn : public torch::autograd::Function<GroupedLinearFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const std::vector<int64_t>& rows) {
    auto xc = x.contiguous(), wc = w.contiguous();
    const int64_t N = wc.size(1), K = wc.size(2);
    auto y = torch::empty({xc.size(0), N}, xc.options());
    run(kernels::GroupedProduct::Forward, xc, wc, y, rows, N, K);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["rows"] = c10::IValue(rows);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto rows = ctx->saved_data["rows"].toIntVector();
    const int64_t N = w.size(1), K = w.size(2);
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(x);
    run(kernels::GroupedProduct::InputGrad, dy, w, dx, rows, N, K);
    auto dw = torch::zeros_like(w);  // groups without rows keep a zero gradient
    run(kernels::GroupedProduct::WeightGrad, dy, x, dw, rows, N, K);
    return {dx, dw, torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor grouped_linear(const torch::Tensor& x, const torch::Tensor& w, const std::vector<int64_t>& rows) {
  check_args(x, w, rows);
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (x.is_cuda() && x.scalar_type() == w.scalar_type() && kernel_dtype(x.scalar_type(), dt) && x.size(0) > 0 &&
      x.size(0) < (int64_t{1} << 31) && w.size(1) * w.size(2) < (int64_t{1} << 31)) {
    return GroupedLinearFn::apply(x, w, rows);
  }
#endif
  return grouped_linear_reference(x, w, rows);
}

bool grouped_mm_device_ok(int device_index) {
#if defined(DD_HAVE_CUDA)
  const auto* p = at::cuda::getDeviceProperties(device_index);
  return p->major == 9 || p->major == 10;
#else
  (void)device_index;
  return false;
#endif
}

bool grouped_linear_offsets_supported(const c10::Device& device, c10::ScalarType dtype, int64_t N, int64_t K) {
  return device.is_cuda() && dtype == torch::kBFloat16 && N % 8 == 0 && K % 8 == 0 &&
         grouped_mm_device_ok(device.has_index() ? device.index() : 0);
}

bool grouped_linear_offsets_supported(const torch::Tensor& x, const torch::Tensor& w) {
  return w.device() == x.device() && x.scalar_type() == w.scalar_type() && x.dim() == 2 && w.dim() == 3 &&
         x.size(1) == w.size(2) && grouped_linear_offsets_supported(x.device(), x.scalar_type(), w.size(1), w.size(2));
}

torch::Tensor grouped_linear_offsets(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& offsets) {
  TORCH_CHECK(grouped_linear_offsets_supported(x, w), "grouped_linear_offsets: needs bf16 x [M,K] and w [E,N,K] on one ",
              "sm90/sm100 GPU with K, N multiples of 8; got x ", x.sizes(), " ", x.scalar_type(), " on ", x.device(),
              ", w ", w.sizes(), " ", w.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == w.size(0) && offsets.scalar_type() == torch::kInt32 &&
                  offsets.device() == x.device(),
              "grouped_linear_offsets: expected int32 offsets [", w.size(0), "] on ", x.device(), ", got ",
              offsets.sizes(), " ", offsets.scalar_type(), " on ", offsets.device());
  // _grouped_mm multiplies by mat_b [E,K,N]; w's transpose is that, column-major, which it takes.
  return at::_grouped_mm(x.contiguous(), w.contiguous().transpose(1, 2), offsets);
}

}  // namespace model

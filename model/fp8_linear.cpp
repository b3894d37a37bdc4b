#include "model/fp8_linear.h"

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

namespace model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Non-finite amax counts per device, kept on the device so counting never synchronises. Shared by
// threads: gradients are quantised on the autograd engine's threads, not the training thread's.
std::mutex saturation_mutex;
std::map<std::string, torch::Tensor> saturation_counts;

void count_saturation(const torch::Tensor& amax) {
  auto bad = amax.isfinite().logical_not().to(torch::kInt64);
  std::lock_guard<std::mutex> lock(saturation_mutex);
  auto& count = saturation_counts[amax.device().str()];
  if (!count.defined()) {
    count = bad.clone();
  } else {
    count.add_(bad);
  }
}

// _scaled_mm wants its second operand column-major: the transpose of a contiguous matrix.
torch::Tensor column_major(const torch::Tensor& m) { return m.t().contiguous().t(); }

at::ScalarType product_dtype(at::ScalarType wanted) {
  return wanted == at::kFloat || wanted == at::kHalf ? wanted : at::kBFloat16;
}

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight) {
    auto x2 = x.reshape({-1, x.size(-1)});
    auto [xq, sx] = quantize_fp8(x2, at::kFloat8_e4m3fn);
    auto [wq, sw] = quantize_fp8(weight, at::kFloat8_e4m3fn);
    // Forward products accumulate in fast mode as common FP8 recipes do; gradients do not.
    auto y = at::_scaled_mm(xq, wq.t(), sx, sw, {}, {}, at::kBFloat16, /*use_fast_accum=*/true);
    ctx->save_for_backward({xq, sx, wq, sw});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    auto out_shape = x.sizes().vec();
    out_shape.back() = weight.size(0);
    return y.view(out_shape);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& xq = saved[0];
    const auto& sx = saved[1];
    const auto& wq = saved[2];
    const auto& sw = saved[3];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto x_shape = ctx->saved_data["x_shape"].toIntVector();
    auto g2 = grads[0].reshape({-1, grads[0].size(-1)});
    auto [gq, sg] = quantize_fp8(g2, at::kFloat8_e5m2);
    // dX = G W: [N,out] x [out,in].
    auto dx = at::_scaled_mm(gq, column_major(wq), sg, sw, {}, {}, product_dtype(x_dtype), false);
    // dW = Gᵀ X: [out,N] x [N,in], straight into the fp32 master weight's dtype.
    auto dw = at::_scaled_mm(gq.t().contiguous(), column_major(xq), sg, sx, {}, {}, at::kFloat, false);
    return {dx.to(x_dtype).view(x_shape), dw};
  }
};

}  // namespace

bool fp8_supported(const torch::Device& device) {
#if defined(DD_HAVE_CUDA)
  if (!device.is_cuda() || !torch::cuda::is_available()) return false;
  const auto* p = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
  return p->major > 8 || (p->major == 8 && p->minor >= 9);
#else
  (void)device;
  return false;
#endif
}

std::pair<torch::Tensor, torch::Tensor> quantize_fp8(const torch::Tensor& x, at::ScalarType fp8_type) {
  const double fmax = fp8_type == at::kFloat8_e5m2 ? kFp8E5m2Max : kFp8E4m3Max;
  auto amax = x.detach().abs().amax().to(torch::kFloat);
  count_saturation(amax);
  auto scale = torch::where(amax > 0, amax / fmax, torch::ones_like(amax));
  auto q = (x.detach().to(torch::kFloat) / scale).clamp_(-fmax, fmax).to(fp8_type);
  return {q, scale};
}

bool fp8_linear_fits(const torch::Tensor& x, const torch::Tensor& weight) {
  const int64_t in = weight.size(1), out = weight.size(0);
  const int64_t tokens = x.numel() / std::max<int64_t>(1, x.size(-1));
  return x.is_cuda() && in % 16 == 0 && out % 16 == 0 && tokens % 16 == 0 && tokens > 0;
}

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(fp8_linear_fits(x, weight), "fp8_linear: needs a CUDA input and sizes that are multiples of 16 (x ",
              x.sizes(), ", weight ", weight.sizes(), ")");
  return Fp8LinearFunction::apply(x, weight);
}

int64_t take_fp8_saturations(const torch::Device& device) {
  std::lock_guard<std::mutex> lock(saturation_mutex);
  auto it = saturation_counts.find(device.str());
  if (it == saturation_counts.end()) return 0;
  const int64_t n = it->second.item<int64_t>();
  it->second.zero_();
  return n;
}

}  // namespace model

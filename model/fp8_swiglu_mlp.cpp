#include "model/fp8_swiglu_mlp.h"

#include <torch/torch.h>

#include <atomic>
#include <string>
#include <vector>

#include "model/fused_swiglu.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/fp8_quant.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

std::atomic<bool> mlp_enabled{true};

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

void check_gu(const torch::Tensor& gu, const char* who) {
  TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0 && gu.stride(1) == 1, who,
              ": expected gu [N, 2F] with unit column stride, got ", gu.sizes(), " strides ", gu.strides());
}

// The Fp8History of a saved product, rebuilt in backward from the tensors the context holds.
void save_history(AutogradContext* ctx, const char* name, const Fp8History& h) {
  ctx->saved_data[std::string(name) + ".records"] = h.records;
  ctx->saved_data[std::string(name) + ".started"] = h.started;
}
Fp8History saved_history(AutogradContext* ctx, const char* name) {
  return {ctx->saved_data[std::string(name) + ".records"].toTensor(),
          ctx->saved_data[std::string(name) + ".started"].toTensor()};
}

// Forward: x → [gate|up] (fp8 product) → h quantised as SwiGLU computes it → y (fp8 product).
// Backward: dy → dh (fp8 product) → [dg|du] quantised as SwiGLU's backward computes it → dx, and the
// two weight gradients in fp32. Forward products accumulate in fast mode, gradient products do not
// (as in model/fp8_linear.cpp).
struct Fp8SwigluMlpFunction : public torch::autograd::Function<Fp8SwigluMlpFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList w_gate_up,
                               const torch::Tensor& w_down, Fp8History* gate_up, Fp8History* down) {
    auto x2 = x.reshape({-1, x.size(-1)});
    if (x2.stride(1) != 1) x2 = x2.contiguous();
    gate_up->ensure(x.device());
    down->ensure(x.device());
    auto xo = quantize_fp8_operand_delayed(x2, at::kFloat8_e4m3fn, true, *gate_up, Fp8History::kInput);
    auto wguo = quantize_fp8_rows_delayed(w_gate_up, at::kFloat8_e4m3fn, *gate_up, Fp8History::kWeight);
    auto gu = at::_scaled_mm(xo.q, wguo.q.t(), xo.scale, wguo.scale, {}, {}, at::kBFloat16, /*use_fast_accum=*/true);
    auto ho = quantize_swiglu_fp8_delayed(gu, at::kFloat8_e4m3fn, *down, Fp8History::kInput);
    auto wdo = quantize_fp8_operand_delayed(w_down, at::kFloat8_e4m3fn, true, *down, Fp8History::kWeight);
    auto y = at::_scaled_mm(ho.q, wdo.q.t(), ho.scale, wdo.scale, {}, {}, at::kBFloat16, /*use_fast_accum=*/true);
    ctx->save_for_backward({xo.qt, xo.scale, wguo.qt, wguo.scale, gu, ho.qt, ho.scale, wdo.qt, wdo.scale});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> part_rows;
    for (const auto& w : w_gate_up) part_rows.push_back(w.size(0));
    ctx->saved_data["part_rows"] = part_rows;
    save_history(ctx, "gate_up", *gate_up);
    save_history(ctx, "down", *down);
    auto out_shape = x.sizes().vec();
    out_shape.back() = w_down.size(0);
    return y.view(out_shape);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &xqt = s[0], &sx = s[1], &wguqt = s[2], &swgu = s[3], &gu = s[4], &hqt = s[5], &sh = s[6],
               &wdqt = s[7], &swd = s[8];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto x_shape = ctx->saved_data["x_shape"].toIntVector();
    auto gate_up = saved_history(ctx, "gate_up");
    auto down = saved_history(ctx, "down");
    auto g2 = grads[0].reshape({-1, grads[0].size(-1)});
    if (g2.stride(1) != 1) g2 = g2.contiguous();
    auto go = quantize_fp8_operand_delayed(g2, at::kFloat8_e5m2, true, down, Fp8History::kGradient);
    // dh = dy W_down: [N, d] x [d, F]; dW_down = dyᵀ h: [d, N] x [N, F].
    auto dh = at::_scaled_mm(go.q, wdqt.t(), go.scale, swd, {}, {}, at::kBFloat16, false);
    auto dw_down = at::_scaled_mm(go.qt, hqt.t(), go.scale, sh, {}, {}, at::kFloat, false);
    auto dgo = quantize_swiglu_grad_fp8_delayed(gu, dh, at::kFloat8_e5m2, gate_up, Fp8History::kGradient);
    // dx = [dg|du] W_gate_up: [N, 2F] x [2F, d]; dW_gate_up = [dg|du]ᵀ x: [2F, N] x [N, d].
    auto dx = at::_scaled_mm(dgo.q, wguqt.t(), dgo.scale, swgu, {}, {}, fp8_product_dtype(x_dtype), false);
    auto dw_gate_up = at::_scaled_mm(dgo.qt, xqt.t(), dgo.scale, sx, {}, {}, at::kFloat, false);
    if (dx.scalar_type() != x_dtype) dx = dx.to(x_dtype);
    tensor_list out = {dx.view(x_shape)};
    for (auto& part : split_rows(dw_gate_up, ctx->saved_data["part_rows"].toIntVector())) out.push_back(part);
    out.push_back(dw_down);
    out.push_back(torch::Tensor());
    out.push_back(torch::Tensor());
    return out;
  }
};

}  // namespace

Fp8Operand quantize_swiglu_fp8_delayed(const torch::Tensor& gu, at::ScalarType fp8_type, Fp8History& h,
                                       Fp8History::Role role) {
  check_gu(gu, "quantize_swiglu_fp8_delayed");
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (gu.is_cuda() && kernel_dtype(gu.scalar_type(), dt)) {
    const int64_t N = gu.size(0), F = gu.size(1) / 2;
    auto l = prepare_fp8_delayed(gu, N, F, fp8_type, h, role);
    check_kernel_launch(kernels::fp8_quantize_swiglu_delayed(l.operand.q.data_ptr(), l.operand.qt.data_ptr(),
                                                             l.operand.scale.data_ptr<float>(), l.record,
                                                             l.saturations, gu.data_ptr(), dt, N, F, gu.stride(0),
                                                             l.e5m2, l.scale_per_amax, l.from_current, l.stream),
                        "fp8 quantisation of SwiGLU");
    return l.operand;
  }
#endif
  return quantize_fp8_operand_delayed(swiglu_reference(gu), fp8_type, true, h, role);
}

Fp8Operand quantize_swiglu_grad_fp8_delayed(const torch::Tensor& gu, const torch::Tensor& dh, at::ScalarType fp8_type,
                                            Fp8History& h, Fp8History::Role role) {
  check_gu(gu, "quantize_swiglu_grad_fp8_delayed");
  TORCH_CHECK(dh.dim() == 2 && dh.size(0) == gu.size(0) && dh.size(1) * 2 == gu.size(1) && dh.is_contiguous() &&
                  dh.scalar_type() == gu.scalar_type(),
              "quantize_swiglu_grad_fp8_delayed: dh ", dh.sizes(), " (", dh.scalar_type(),
              ") must be contiguous [N, F] of gu's dtype for gu ", gu.sizes(), " (", gu.scalar_type(), ")");
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (gu.is_cuda() && kernel_dtype(gu.scalar_type(), dt)) {
    const int64_t N = gu.size(0), F = gu.size(1) / 2;
    auto l = prepare_fp8_delayed(gu, N, 2 * F, fp8_type, h, role);
    check_kernel_launch(kernels::fp8_quantize_swiglu_grad_delayed(
                            l.operand.q.data_ptr(), l.operand.qt.data_ptr(), l.operand.scale.data_ptr<float>(),
                            l.record, l.saturations, gu.data_ptr(), dh.data_ptr(), dt, N, F, gu.stride(0), l.e5m2,
                            l.scale_per_amax, l.from_current, l.stream),
                        "fp8 quantisation of SwiGLU's gradient");
    return l.operand;
  }
#endif
  return quantize_fp8_operand_delayed(swiglu_backward_reference(gu, dh), fp8_type, true, h, role);
}

void fp8_swiglu_mlp_enabled(bool on) { mlp_enabled = on; }
bool fp8_swiglu_mlp_enabled() { return mlp_enabled; }

bool fp8_swiglu_mlp_fits(const torch::Tensor& x, const std::vector<torch::Tensor>& w_gate_up,
                         const torch::Tensor& w_down) {
  if (w_down.dim() != 2 || !fp8_linear_fits(x, w_gate_up)) return false;
  const int64_t d = x.size(-1), F = w_down.size(1);
  int64_t rows = 0;
  for (const auto& w : w_gate_up) rows += w.size(0);
  return rows == 2 * F && w_down.size(0) == d && F % 16 == 0;
}

torch::Tensor fp8_swiglu_mlp(const torch::Tensor& x, const std::vector<torch::Tensor>& w_gate_up,
                             const torch::Tensor& w_down, Fp8History& gate_up, Fp8History& down) {
  TORCH_CHECK(fp8_swiglu_mlp_fits(x, w_gate_up, w_down),
              "fp8_swiglu_mlp: needs a CUDA input x [..., d], gate|up weights of 2F rows in all and d columns, "
              "w_down [d, F], and d, F and the token count multiples of 16 (x ",
              x.sizes(), ", ", w_gate_up.size(), " gate|up weights, w_down ", w_down.sizes(), ")");
  return Fp8SwigluMlpFunction::apply(x, at::TensorList(w_gate_up), w_down, &gate_up, &down);
}

}  // namespace model

#include "model/fused_short_conv.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "model/gated_deltanet.h"
#include "model/sole_storage.h"

#if defined(DD_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/short_conv.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

#if defined(DD_HAVE_CUDA)
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x as the kernel reads it: rows of T tokens at a common token stride (stride(1), at least a row's
// channels) with unit channel stride. A dim of size 1 may carry any stride (PyTorch ignores it for
// contiguity, so .contiguous() hands such a view back as it is): with one token a row the token
// stride the kernels read is the batch stride, and with one row as well any stride of C will do.
torch::Tensor kernel_layout(const torch::Tensor& x) {
  auto v = x;
  if (x.size(1) == 1) {
    const int64_t s = x.size(0) == 1 ? x.size(2) : x.stride(0);
    v = x.as_strided(x.sizes(), {s, s, x.stride(2)});
  }
  const bool ok = v.stride(2) == 1 && v.stride(1) >= v.size(2) && v.stride(0) == v.size(1) * v.stride(1);
  return ok ? v : v.contiguous();
}

// silu(conv(x)) over x's first wf.size(0) channels, x in kernel_layout (rows may be wider), wf fp32
// [C, W]: a new contiguous [B, T, C].
torch::Tensor conv_forward(const torch::Tensor& x, const torch::Tensor& wf, const torch::Tensor& pos) {
  const int64_t B = x.size(0), T = x.size(1), C = wf.size(0);
  kernels::DType dt{};
  kernel_dtype(x.scalar_type(), dt);
  auto y = torch::empty({B, T, C}, x.options().memory_format(torch::MemoryFormat::Contiguous));
  check_kernel_launch(kernels::short_conv_forward(y.data_ptr(), x.data_ptr(), dt, wf.data_ptr<float>(),
                                                  pos.defined() ? pos.data_ptr<int64_t>() : nullptr, B, T, C,
                                                  x.stride(1), static_cast<int>(wf.size(1)),
                                                  c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                      "short conv forward");
  return y;
}

class FusedShortConvFn : public torch::autograd::Function<FusedShortConvFn> {
 public:
  // pos: [B·T] int64 positions in the document (packed rows), or None (dense rows); an IValue, since
  // autograd refuses an undefined tensor among a function's inputs.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& w,
                               const c10::IValue& pos_or_none) {
    const torch::Tensor pos = pos_or_none.isTensor() ? pos_or_none.toTensor() : torch::Tensor();
    auto x = kernel_layout(x_in);
    auto wf = w.to(torch::kFloat32).contiguous();
    auto y = conv_forward(x, wf, pos);
    ctx->save_for_backward({x, wf});
    ctx->saved_data["pos"] = pos_or_none;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& wf = saved[1];
    const auto pos_or_none = ctx->saved_data["pos"];
    const torch::Tensor pos = pos_or_none.isTensor() ? pos_or_none.toTensor() : torch::Tensor();
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    kernels::DType dt{};
    kernel_dtype(x.scalar_type(), dt);
    auto dy = grads[0].to(x.scalar_type()).contiguous();
    auto dx = torch::empty({B, T, C}, x.options().memory_format(torch::MemoryFormat::Contiguous));
    auto dw = torch::zeros_like(wf);
    check_kernel_launch(kernels::short_conv_backward(dx.data_ptr(), dw.data_ptr<float>(), dy.data_ptr(), x.data_ptr(),
                                                     dt, wf.data_ptr<float>(),
                                                     pos.defined() ? pos.data_ptr<int64_t>() : nullptr, B, T, C,
                                                     x.stride(1), static_cast<int>(wf.size(1)),
                                                     c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                        "short conv backward");
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    return {dx, dw.to(w_dtype), torch::Tensor()};
  }
};

bool kernel_taps(int64_t W) { return W == 2 || W == 3 || W == 4 || W == 6 || W == 8; }

// Whether the rest's gradient already sits at columns [C, Wd) of a buffer laid out as y [B, T, Wd]
// is, rows of ld = y.stride(1) ≥ Wd columns (the gated output norm writes dz so,
// model/fused_gated_norm.cpp), that nothing else holds: then the conv's gradients fill the buffer's
// other columns and no [B, T, Wd] gradient is allocated and copied into. Anything else (another
// consumer, autograd's sum of two gradients) fails a test and takes the copy.
bool rest_gradient_has_room(const torch::Tensor& g, const torch::Tensor& y, int64_t C) {
  const int64_t B = y.size(0), T = y.size(1), Wd = y.size(2), ld = y.stride(1);
  if (!g.defined() || g.scalar_type() != y.scalar_type() || g.device() != y.device() || g.dim() != 3 ||
      g.size(0) != B || g.size(1) != T || g.size(2) != Wd - C || g.stride(2) != 1 || g.stride(1) != ld ||
      (B > 1 && g.stride(0) != T * ld))
    return false;
  // Only this gradient refers to the buffer, and the buffer holds all B·T rows from their column 0.
  return sole_storage_with_room(g, C, B * T * ld);
}

std::atomic<int64_t> gate_gradients_in_place{0};

// See fused_short_conv_parts. Outputs: the conv parts (views of one conv output), then the rest
// (a view of y).
class ShortConvPartsFn : public torch::autograd::Function<ShortConvPartsFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& y_in, const torch::Tensor& w,
                               const c10::IValue& pos_or_none, const std::vector<int64_t>& widths) {
    const torch::Tensor pos = pos_or_none.isTensor() ? pos_or_none.toTensor() : torch::Tensor();
    auto y = kernel_layout(y_in);
    auto wf = w.to(torch::kFloat32).contiguous();
    const int64_t C = w.size(0), R = y.size(2) - C;
    auto conv = conv_forward(y, wf, pos);
    ctx->save_for_backward({y, wf});
    ctx->saved_data["pos"] = pos_or_none;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    ctx->saved_data["widths"] = widths;
    auto outs = conv.split_with_sizes(widths, -1);
    outs.push_back(y_in.narrow(2, C, R));
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &y = saved[0], &wf = saved[1];
    const auto pos_or_none = ctx->saved_data["pos"];
    const torch::Tensor pos = pos_or_none.isTensor() ? pos_or_none.toTensor() : torch::Tensor();
    const auto widths = ctx->saved_data["widths"].toIntVector();
    // y's rows are ld ≥ Wd columns apart (wider where y is a column slice of a product's rows,
    // model/mixed_linear.h mixed_linear_split); its gradient takes the same layout, so that the
    // product's backward finds the other columns' room beside it.
    const int64_t B = y.size(0), T = y.size(1), Wd = y.size(2), C = wf.size(0), taps = wf.size(1), ld = y.stride(1);
    kernels::DType dt{};
    kernel_dtype(y.scalar_type(), dt);
    const auto& g_rest = grads[widths.size()];
    const bool in_place = rest_gradient_has_room(g_rest, y, C);
    if (in_place) gate_gradients_in_place.fetch_add(1, std::memory_order_relaxed);
    // Set on the buffer's storage rather than as a view of a tensor: a view keeps its base alive, and
    // the product's backward takes the rows in place only when this gradient is their one holder.
    const auto storage = in_place ? g_rest.storage() : torch::empty({B * T * ld}, y.options()).storage();
    auto dy_full = torch::empty({0}, y.options())
                       .set_(storage, in_place ? g_rest.storage_offset() - C : 0, {B, T, Wd}, {T * ld, ld, 1});
    auto dw = torch::zeros_like(wf);
    const auto stream = c10::cuda::getCurrentCUDAStream(y.device().index()).stream();
    // Each part's channels with its gradient as it comes (its columns of y, w and dw), its input
    // gradient written into its columns of y's gradient; up to kShortConvMaxParts parts a launch.
    std::vector<torch::Tensor> d_outs;
    std::vector<kernels::ShortConvGradPart> parts;
    int64_t col = 0;
    for (size_t i = 0; i < widths.size(); ++i) {
      d_outs.push_back(grads[i].to(y.scalar_type()).contiguous());
      parts.push_back({d_outs.back().data_ptr(), col, widths[i]});
      col += widths[i];
    }
    for (size_t first = 0; first < parts.size(); first += kernels::kShortConvMaxParts) {
      const int n = static_cast<int>(std::min<size_t>(kernels::kShortConvMaxParts, parts.size() - first));
      check_kernel_launch(kernels::short_conv_backward_parts(dy_full.data_ptr(), dw.data_ptr<float>(),
                                                             parts.data() + first, n, y.data_ptr(), dt,
                                                             wf.data_ptr<float>(),
                                                             pos.defined() ? pos.data_ptr<int64_t>() : nullptr, B, T,
                                                             y.stride(1), static_cast<int>(taps), stream, ld),
                          "short conv backward");
    }
    // The rest's gradient into its columns, unless it is already there: the one copy left (a
    // cudaMemcpy2DAsync measured the same).
    if (!in_place) dy_full.narrow(2, C, Wd - C).copy_(g_rest);
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    return {dy_full, dw.to(w_dtype), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor fused_short_conv(const torch::Tensor& x, const torch::Tensor& w, const Positions& p) {
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (x.is_cuda() && x.dim() == 3 && x.numel() > 0 && kernel_dtype(x.scalar_type(), dt) && w.dim() == 2 &&
      w.size(0) == x.size(2) && kernel_taps(w.size(1))) {
    c10::IValue pos;
    if (p.varlen()) {
      TORCH_CHECK(p.pos.numel() == x.size(0) * x.size(1), "short_conv: positions ", p.pos.sizes(),
                  " do not match x ", x.sizes());
      pos = p.pos.reshape({-1}).to(torch::kInt64).contiguous();
    }
    return FusedShortConvFn::apply(x, w, pos);
  }
#endif
  return short_conv(x, w, p);
}

int64_t short_conv_parts_gradients_in_place() {
#if defined(DD_HAVE_CUDA)
  return gate_gradients_in_place.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

ShortConvParts fused_short_conv_parts(const torch::Tensor& y, const torch::Tensor& w, const Positions& p,
                                      const std::vector<int64_t>& widths) {
  int64_t C = 0;
  for (const int64_t c : widths) C += c;
  TORCH_CHECK(y.dim() == 3 && w.dim() == 2 && w.size(0) == C && C <= y.size(2), "short_conv_parts: expected y [B,T,",
              C, "+R] and w [", C, ",W], got ", y.sizes(), " and ", w.sizes());
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (y.is_cuda() && y.numel() > 0 && kernel_dtype(y.scalar_type(), dt) && kernel_taps(w.size(1))) {
    c10::IValue pos;
    if (p.varlen()) {
      TORCH_CHECK(p.pos.numel() == y.size(0) * y.size(1), "short_conv: positions ", p.pos.sizes(),
                  " do not match y ", y.sizes());
      pos = p.pos.reshape({-1}).to(torch::kInt64).contiguous();
    }
    auto outs = ShortConvPartsFn::apply(y, w, pos, widths);
    ShortConvParts r;
    r.rest = outs.back();
    outs.pop_back();
    r.parts = std::move(outs);
    return r;
  }
#endif
  auto halves = y.split_with_sizes({C, y.size(2) - C}, -1);
  return {fused_short_conv(halves[0], w, p).split_with_sizes(widths, -1), halves[1]};
}

}  // namespace model

#include "model/fp8_linear.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/fp8_quant.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Non-finite amax counts per device, kept on the device so counting never synchronises. Shared by
// threads: gradients are quantised on the autograd engine's threads, not the training thread's.
std::mutex saturation_mutex;
std::map<std::string, torch::Tensor> saturation_counts;

// The device's counter (int64, one element), created on first use.
torch::Tensor saturation_counter(const torch::Device& device) {
  std::lock_guard<std::mutex> lock(saturation_mutex);
  auto& count = saturation_counts[device.str()];
  if (!count.defined()) count = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  return count;
}

void count_saturation(const torch::Tensor& amax) {
  auto count = saturation_counter(amax.device());
  count.add_(amax.isfinite().logical_not().to(torch::kInt64));
}

// The quantisers take x [rows, cols] with unit column stride.
void check_operand(const torch::Tensor& x, const char* who) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, who, ": expected a 2-D tensor with unit column stride, got ", x.sizes(),
              " strides ", x.strides());
}

#if defined(DD_HAVE_CUDA)
// An operand for the quantising kernels to fill: q [rows, cols], qt [cols, rows] when `transposed`,
// and a 0-dim fp32 scale, all on `like`'s device.
Fp8Operand empty_operand(const torch::Tensor& like, int64_t rows, int64_t cols, at::ScalarType fp8_type,
                         bool transposed) {
  auto opts = like.options().dtype(fp8_type);
  Fp8Operand o;
  o.q = torch::empty({rows, cols}, opts);
  if (transposed) o.qt = torch::empty({cols, rows}, opts);
  o.scale = torch::empty({}, like.options().dtype(torch::kFloat));
  return o;
}
#endif

// The CPU (or unsupported dtype) path's operand from a reference q.
Fp8Operand reference_operand(const torch::Tensor& q, const torch::Tensor& scale, bool transposed) {
  return {q, transposed ? q.t().contiguous() : torch::Tensor(), scale};
}

// One operand, with delayed scaling when the layer has a history (its tensors ride along in the
// autograd context, so the backward finds the gradient's record).
Fp8Operand quantize_for(const torch::Tensor& x, at::ScalarType fp8_type, Fp8History* h, Fp8History::Role role) {
  return h ? quantize_fp8_operand_delayed(x, fp8_type, /*transposed=*/true, *h, role)
           : quantize_fp8_operand(x, fp8_type, /*transposed=*/true);
}

std::vector<int64_t> row_counts(at::TensorList parts) {
  std::vector<int64_t> rows;
  for (const auto& p : parts) rows.push_back(p.size(0));
  return rows;
}

// _scaled_mm takes its first operand row-major and its second column-major; each operand's
// transpose is written by the quantisation itself, so no product needs a transposing copy.
// Column blocks of y [N, total] with x's leading shape: tensors that share y's storage without being
// autograd views of it, so that each is an output of its own (with its own gradient, which the
// backward reads where it is) and none is an in-place alias anyone writes through.
std::vector<torch::Tensor> column_blocks(const torch::Tensor& y, std::vector<int64_t> lead,
                                         const std::vector<int64_t>& cols) {
  std::vector<torch::Tensor> out;
  const int64_t total = y.size(1);
  std::vector<int64_t> strides(lead.size() + 1, 1);
  for (int64_t i = static_cast<int64_t>(lead.size()) - 1, s = total; i >= 0; --i) {
    strides[i] = s;
    s *= lead[i];
  }
  int64_t offset = 0;
  for (int64_t c : cols) {
    auto sizes = lead;
    sizes.push_back(c);
    auto block = torch::empty({0}, y.options());
    block.set_(y.storage(), y.storage_offset() + offset, sizes, strides);
    out.push_back(block);
    offset += c;
  }
  return out;
}

// y = x Wᵀ, returned whole or as column blocks (`out_cols`, one per weight block for q|k|v), whose
// gradients the backward then quantises where they are, as one.
struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  // `weights`: the row blocks of one weight [Σ out_i, in] (one block for a plain Linear); `history`
  // may be nullptr (current scaling); it is not a differentiable input. `split`: return one output
  // per weight block instead of one for all.
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                             Fp8History* history, bool split) {
    auto x2 = x.reshape({-1, x.size(-1)});
    if (x2.stride(1) != 1) x2 = x2.contiguous();
    if (history) history->ensure(x.device());
    auto xo = quantize_for(x2, at::kFloat8_e4m3fn, history, Fp8History::kInput);
    auto wo = history ? quantize_fp8_rows_delayed(weights, at::kFloat8_e4m3fn, *history, Fp8History::kWeight)
                      : quantize_fp8_operand(weights.size() == 1 ? weights[0] : torch::cat(weights, 0),
                                             at::kFloat8_e4m3fn, /*transposed=*/true);
    // Forward products accumulate in fast mode as common FP8 recipes do; gradients do not.
    auto y = at::_scaled_mm(xo.q, wo.q.t(), xo.scale, wo.scale, {}, {}, at::kBFloat16, /*use_fast_accum=*/true);
    ctx->save_for_backward({xo.qt, xo.scale, wo.qt, wo.scale});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["part_rows"] = row_counts(weights);
    if (history) {
      ctx->saved_data["records"] = history->records;
      ctx->saved_data["started"] = history->started;
    }
    auto lead = x.sizes().vec();
    lead.pop_back();
    if (split && weights.size() > 1) return column_blocks(y, lead, row_counts(weights));
    lead.push_back(wo.q.size(0));
    return {y.view(lead)};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& xqt = saved[0];  // [in, N]
    const auto& sx = saved[1];
    const auto& wqt = saved[2];  // [in, out]
    const auto& sw = saved[3];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto x_shape = ctx->saved_data["x_shape"].toIntVector();
    const auto part_rows = ctx->saved_data["part_rows"].toIntVector();
    const int64_t N = xqt.size(1);
    // The incoming gradient as [N, cols] blocks with unit column stride (an unused block: zeros).
    std::vector<torch::Tensor> g;
    for (size_t i = 0; i < grads.size(); ++i) {
      const int64_t cols = grads.size() == 1 ? wqt.size(1) : part_rows[i];
      auto gi = grads[i].defined() ? grads[i].reshape({N, cols})
                                   : torch::zeros({N, cols}, xqt.options().dtype(at::kBFloat16));
      g.push_back(gi.stride(1) == 1 ? gi : gi.contiguous());
    }
    Fp8Operand go;
    if (ctx->saved_data.count("records")) {
      Fp8History h{ctx->saved_data["records"].toTensor(), ctx->saved_data["started"].toTensor()};
      go = g.size() == 1 ? quantize_fp8_operand_delayed(g[0], at::kFloat8_e5m2, /*transposed=*/true, h,
                                                        Fp8History::kGradient)
                         : quantize_fp8_cols_delayed(g, at::kFloat8_e5m2, h, Fp8History::kGradient);
    } else {
      go = quantize_fp8_operand(g.size() == 1 ? g[0] : torch::cat(g, 1), at::kFloat8_e5m2, /*transposed=*/true);
    }
    // dX = G W: [N,out] x [out,in], W column-major as (Wᵀ)ᵀ.
    auto dx = at::_scaled_mm(go.q, wqt.t(), go.scale, sw, {}, {}, fp8_product_dtype(x_dtype), false);
    // dW = Gᵀ X: [out,N] x [N,in], straight into the fp32 master weight's dtype.
    auto dw = at::_scaled_mm(go.qt, xqt.t(), go.scale, sx, {}, {}, at::kFloat, false);
    tensor_list out = {dx.scalar_type() == x_dtype ? dx.view(x_shape) : dx.to(x_dtype).view(x_shape)};
    for (auto& part : split_rows(dw, part_rows)) out.push_back(part);
    out.push_back(torch::Tensor());  // history
    out.push_back(torch::Tensor());  // split
    return out;
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

Fp8Operand quantize_fp8_operand(const torch::Tensor& x, at::ScalarType fp8_type, bool transposed) {
  check_operand(x, "quantize_fp8_operand");
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (x.is_cuda() && kernel_dtype(x.scalar_type(), dt)) {
    const int64_t rows = x.size(0), cols = x.size(1);
    Fp8Operand o = empty_operand(x, rows, cols, fp8_type, transposed);
    auto amax = torch::empty({}, x.options().dtype(torch::kFloat));
    auto counter = saturation_counter(x.device());
    check_kernel_launch(
        kernels::fp8_quantize(o.q.data_ptr(), transposed ? o.qt.data_ptr() : nullptr, o.scale.data_ptr<float>(),
                              amax.data_ptr<float>(), reinterpret_cast<unsigned long long*>(counter.data_ptr<int64_t>()),
                              x.data_ptr(), dt, rows, cols, x.stride(0), fp8_type == at::kFloat8_e5m2,
                              c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
        "fp8 quantisation");
    return o;
  }
#endif
  auto [q, scale] = quantize_fp8(x, fp8_type);
  return reference_operand(q, scale, transposed);
}

bool fp8_linear_fits(const torch::Tensor& x, const std::vector<torch::Tensor>& weights) {
  if (weights.empty() || !x.is_cuda()) return false;
  const int64_t in = weights[0].size(1);
  int64_t out = 0;
  for (const auto& w : weights) {
    if (w.dim() != 2 || w.size(1) != in) return false;
    out += w.size(0);
  }
  const int64_t tokens = x.numel() / std::max<int64_t>(1, x.size(-1));
  return x.size(-1) == in && in % 16 == 0 && out % 16 == 0 && tokens % 16 == 0 && tokens > 0;
}

bool fp8_linear_fits(const torch::Tensor& x, const torch::Tensor& weight) {
  return fp8_linear_fits(x, std::vector<torch::Tensor>{weight});
}

torch::Tensor fp8_linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights, Fp8History* history) {
  TORCH_CHECK(fp8_linear_fits(x, weights), "fp8_linear: needs a CUDA input, weights [out_i, in] with in = x's last size, "
              "and in, Σ out_i and the token count multiples of 16 (x ", x.sizes(), ", first weight ",
              weights.empty() ? c10::IntArrayRef{} : weights[0].sizes(), ", ", weights.size(), " weights)");
  // An explicit TensorList, so the autograd function sees each weight as a differentiable input.
  return Fp8LinearFunction::apply(x, at::TensorList(weights), history, false)[0];
}

std::vector<torch::Tensor> fp8_linear_split(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                                            Fp8History* history) {
  TORCH_CHECK(fp8_linear_fits(x, weights), "fp8_linear_split: needs a CUDA input, weights [out_i, in] with in = x's "
              "last size, and in, Σ out_i and the token count multiples of 16 (x ", x.sizes(), ", ", weights.size(),
              " weights)");
  return Fp8LinearFunction::apply(x, at::TensorList(weights), history, true);
}

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, Fp8History* history) {
  return fp8_linear(x, std::vector<torch::Tensor>{weight}, history);
}

std::vector<torch::Tensor> split_rows(const torch::Tensor& whole, const std::vector<int64_t>& part_rows) {
  if (part_rows.size() == 1) return {whole};
  return whole.split_with_sizes(part_rows, 0);
}

#if defined(DD_HAVE_CUDA)
namespace {

// Blocks of one operand, as the block quantisers (kernels::fp8_quantize_rows_delayed and
// fp8_quantize_cols_delayed) take them: their pointers, their sizes along the concatenation's axis
// and row strides, and the operand's size along it.
struct Blocks {
  std::vector<const void*> ptrs;
  std::vector<int64_t> sizes, ld;
  int64_t total = 0;
  kernels::DType dt{};
};

// Whether `parts` concatenated along `axis` (0: rows, 1: columns) fit the block quantisers: CUDA,
// one kernel dtype and device, at most kFp8MaxParts 2-D parts of the same size across the axis,
// contiguous (rows) or of unit column stride (columns). Fills `out` when they do.
bool as_blocks(at::TensorList parts, int axis, Blocks& out) {
  const auto& first = parts[0];
  if (static_cast<int>(parts.size()) > kernels::kFp8MaxParts || !first.is_cuda() ||
      !kernel_dtype(first.scalar_type(), out.dt))
    return false;
  for (const auto& p : parts) {
    const bool layout = axis == 0 ? p.is_contiguous() : p.stride(1) == 1;
    if (p.dim() != 2 || p.size(1 - axis) != first.size(1 - axis) || !layout ||
        p.scalar_type() != first.scalar_type() || p.device() != first.device())
      return false;
    out.ptrs.push_back(p.data_ptr());
    out.sizes.push_back(p.size(axis));
    out.ld.push_back(p.stride(0));
    out.total += p.size(axis);
  }
  return true;
}

}  // namespace
#endif

Fp8Operand quantize_fp8_cols_delayed(at::TensorList parts, at::ScalarType fp8_type, Fp8History& h,
                                     Fp8History::Role role) {
  TORCH_CHECK(!parts.empty(), "quantize_fp8_cols_delayed: no parts");
  if (parts.size() == 1) return quantize_fp8_operand_delayed(parts[0], fp8_type, /*transposed=*/true, h, role);
#if defined(DD_HAVE_CUDA)
  Blocks b;
  if (as_blocks(parts, 1, b)) {
    const int64_t rows = parts[0].size(0);
    auto l = prepare_fp8_delayed(parts[0], rows, b.total, fp8_type, h, role);
    check_kernel_launch(kernels::fp8_quantize_cols_delayed(l.operand.q.data_ptr(), l.operand.qt.data_ptr(),
                                                           l.operand.scale.data_ptr<float>(), l.record, l.saturations,
                                                           b.ptrs.data(), b.sizes.data(), b.ld.data(),
                                                           static_cast<int>(b.ptrs.size()), b.dt, rows, l.e5m2,
                                                           l.scale_per_amax, l.from_current, l.stream),
                        "fp8 quantisation of column blocks (delayed scaling)");
    return l.operand;
  }
#endif
  return quantize_fp8_operand_delayed(torch::cat(parts, 1), fp8_type, /*transposed=*/true, h, role);
}

Fp8Operand quantize_fp8_rows_delayed(at::TensorList parts, at::ScalarType fp8_type, Fp8History& h,
                                     Fp8History::Role role) {
  TORCH_CHECK(!parts.empty(), "quantize_fp8_rows_delayed: no parts");
  if (parts.size() == 1) return quantize_fp8_operand_delayed(parts[0], fp8_type, /*transposed=*/true, h, role);
#if defined(DD_HAVE_CUDA)
  Blocks b;
  if (as_blocks(parts, 0, b)) {
    const int64_t cols = parts[0].size(1);
    auto l = prepare_fp8_delayed(parts[0], b.total, cols, fp8_type, h, role);
    check_kernel_launch(kernels::fp8_quantize_rows_delayed(l.operand.q.data_ptr(), l.operand.qt.data_ptr(),
                                                           l.operand.scale.data_ptr<float>(), l.record, l.saturations,
                                                           b.ptrs.data(), b.sizes.data(), static_cast<int>(b.ptrs.size()),
                                                           b.dt, cols, l.e5m2, l.scale_per_amax, l.from_current,
                                                           l.stream),
                        "fp8 quantisation of row blocks (delayed scaling)");
    return l.operand;
  }
#endif
  return quantize_fp8_operand_delayed(torch::cat(parts, 0), fp8_type, /*transposed=*/true, h, role);
}

void Fp8History::ensure(const torch::Device& device) {
  if (records.defined() && records.device() == device) return;
  records = torch::zeros({3, kernels::kFp8RecordWords}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  started = torch::zeros({3}, torch::kBool);
}

void Fp8History::load(const torch::Tensor& saved, const torch::Device& device, const std::string& what) {
  if (saved.dim() != 2 || saved.size(0) != 3 || saved.size(1) != kernels::kFp8RecordWords)
    throw std::runtime_error(what + ": fp8 amax records have shape " + c10::str(saved.sizes()) + ", expected [3, " +
                             std::to_string(kernels::kFp8RecordWords) + "]");
  records = saved.to(device, torch::kFloat).clone();
  // Between quantisations the pending words are zero; a saved record must say so too.
  records.narrow(1, kernels::kFp8History, 2).zero_();
  started = records.narrow(1, 0, kernels::kFp8History).amax(1).gt(0).to(torch::kCPU);
}

std::pair<torch::Tensor, torch::Tensor> quantize_fp8_delayed_reference(const torch::Tensor& x, at::ScalarType fp8_type,
                                                                       torch::Tensor record, bool from_current) {
  const double fmax = fp8_type == at::kFloat8_e5m2 ? kFp8E5m2Max : kFp8E4m3Max;
  const int64_t H = kernels::kFp8History;
  auto xf = x.detach().to(torch::kFloat);
  auto amax = xf.abs().amax().to(record.device());
  torch::Tensor scale;
  if (from_current) {
    scale = torch::where(amax > 0, amax / fmax, torch::ones_like(amax));
  } else {
    auto h = record.narrow(0, 0, H).amax();
    // The kernel multiplies by margin / fmax rounded to fp32 once; so does this (an fp32 tensor times
    // a scalar computes in fp32).
    scale = torch::where(h > 0, h * static_cast<double>(static_cast<float>(kFp8DelayedMargin / fmax)),
                         torch::ones_like(h));
  }
  auto q = (xf / scale.to(xf.device())).clamp_(-fmax, fmax).to(fp8_type);
  const bool finite = std::isfinite(amax.item<float>());
  bool saturated = !finite;
  if (!from_current && finite) saturated = (amax / scale).item<float>() > static_cast<float>(fmax);
  if (saturated) saturation_counter(x.device()).add_(1);
  if (finite) {
    auto older = record.narrow(0, 0, H - 1).clone();
    record.narrow(0, 1, H - 1).copy_(older);
    record[0] = amax;
  }
  return {q, scale};
}

#if defined(DD_HAVE_CUDA)
Fp8DelayedLaunch prepare_fp8_delayed(const torch::Tensor& like, int64_t rows, int64_t cols, at::ScalarType fp8_type,
                                     Fp8History& h, Fp8History::Role role, bool transposed) {
  h.ensure(like.device());
  bool& started = h.started.data_ptr<bool>()[role];
  Fp8DelayedLaunch l;
  l.from_current = !started;
  started = true;
  l.e5m2 = fp8_type == at::kFloat8_e5m2;
  const double fmax = l.e5m2 ? kFp8E5m2Max : kFp8E4m3Max;
  l.scale_per_amax = static_cast<float>(kFp8DelayedMargin / fmax);
  l.operand = empty_operand(like, rows, cols, fp8_type, transposed);
  l.record = h.records[role].data_ptr<float>();
  l.saturations = reinterpret_cast<unsigned long long*>(saturation_counter(like.device()).data_ptr<int64_t>());
  l.stream = c10::cuda::getCurrentCUDAStream(like.device().index()).stream();
  return l;
}
#endif

Fp8Operand quantize_fp8_operand_delayed(const torch::Tensor& x, at::ScalarType fp8_type, bool transposed,
                                        Fp8History& h, Fp8History::Role role) {
  check_operand(x, "quantize_fp8_operand_delayed");
#if defined(DD_HAVE_CUDA)
  kernels::DType dt{};
  if (x.is_cuda() && kernel_dtype(x.scalar_type(), dt)) {
    const int64_t rows = x.size(0), cols = x.size(1);
    auto l = prepare_fp8_delayed(x, rows, cols, fp8_type, h, role, transposed);
    check_kernel_launch(kernels::fp8_quantize_delayed(l.operand.q.data_ptr(), transposed ? l.operand.qt.data_ptr() : nullptr,
                                                      l.operand.scale.data_ptr<float>(), l.record, l.saturations,
                                                      x.data_ptr(), dt, rows, cols, x.stride(0), l.e5m2,
                                                      l.scale_per_amax, l.from_current, l.stream),
                        "fp8 quantisation (delayed scaling)");
    return l.operand;
  }
#endif
  h.ensure(x.device());
  bool& started = h.started.data_ptr<bool>()[role];
  const bool from_current = !started;
  started = true;
  auto [q, scale] = quantize_fp8_delayed_reference(x, fp8_type, h.records[role], from_current);
  return reference_operand(q, scale, transposed);
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

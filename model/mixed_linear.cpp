#include "model/mixed_linear.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "model/linear.h"
#include "model/sole_storage.h"
#include "model/weight_shadow.h"

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <cublas_v2.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/column_blocks.h"
#include "kernels/weight_cast.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

thread_local bool in_place_active = false;
thread_local bool grad_stream_active = false;
thread_local bool defer_active = false;
std::atomic<int64_t> aside_weight_grad_products{0};
thread_local bool no_workspace_active = false;
std::atomic<bool> in_place_allowed{true};
std::atomic<bool> grad_stream_allowed{true};
std::atomic<bool> no_workspace_allowed{true};
std::atomic<int64_t> split_gradients_in_place{0};
std::atomic<int64_t> split_products{0};
std::atomic<bool> column_blocks_kernel_allowed{true};
std::atomic<int64_t> column_blocks_launches{0};

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// A group's output columns rounded up to 16 bytes' worth (8 16-bit values) on a GPU. cuBLAS takes
// its Hopper kernels only for sizes and leading dimensions in multiples of 16 bytes; the Gated
// DeltaNet's a|b projection (2H = 12 columns) fell back to SM80 kernels of 2-byte alignment, 0.56
// ms a step over its three GEMMs in hybrid base (docs/perf.md, issue 7, stop 53). Its products
// therefore run at the padded width, the weight and the output's gradient padded with zero rows
// and columns (zero products: the same sums), and the results' real columns taken out.
int64_t aligned_columns(int64_t cols, const at::Tensor& x) {
  return x.is_cuda() && cols % 8 != 0 ? (cols + 7) / 8 * 8 : cols;
}

int64_t total_rows(const std::vector<at::Tensor>& weights) {
  int64_t rows = 0;
  for (const auto& w : weights) rows += w.size(0);
  return rows;
}

// Whether every weight's .grad is the next row block of one fp32 buffer, in order (what
// plan_weight_grads leaves after a first backward): the product's gradient then adds in one GEMM.
bool grads_are_one_buffer(const std::vector<at::Tensor>& weights) {
  const at::Tensor& first = weights.front().grad();
  int64_t offset = first.defined() ? first.storage_offset() : 0;
  for (const auto& w : weights) {
    const at::Tensor& g = w.grad();
    if (!w.requires_grad() || !g.defined() || g.scalar_type() != at::kFloat || !g.is_contiguous() ||
        g.sizes() != w.sizes() || !g.storage().is_alias_of(first.storage()) || g.storage_offset() != offset)
      return false;
    offset += g.numel();
  }
  return true;
}

// One product of the weight gradient: c (+)= g2[:, col : col + rows]ᵀ · x2, c fp32 (or, for a
// gradient of another dtype or layout, c.add_ of the product cast to it: the product rounded to
// x2's dtype first, or at a padded width (run_grad_products) from its fp32 rows).
struct GradProduct {
  at::Tensor c;
  int64_t col = 0, rows = 0;
  bool accumulate = false;
  bool cast_add = false;
};

// The products that put each weight's block of g2ᵀ · x2 (g2 [N, width], width Σ out_i or more
// with zero columns past them, x2 [N, in]) into its .grad: written where that is undefined, added
// otherwise. When no weight has a gradient yet, one fp32 buffer of `width` rows takes the whole
// product (the padding's rows zero) and each .grad becomes a view of its rows. Every gradient
// buffer is allocated here, on the caller's stream, so the products may run on another one.
std::vector<GradProduct> plan_weight_grads(std::vector<at::Tensor>& weights, const at::Tensor& x2, int64_t width) {
  const int64_t in = x2.size(1);
  bool none_defined = true, all_need = true;
  for (const auto& w : weights) {
    none_defined = none_defined && !w.grad().defined();
    all_need = all_need && w.requires_grad();
  }
  if (x2.size(0) == 0) {
    // No tokens: an empty sum. Undefined gradients become zeros, as autograd would make them.
    for (auto& w : weights)
      if (w.requires_grad() && !w.grad().defined()) w.mutable_grad() = torch::zeros_like(w);
    return {};
  }
  if (none_defined && all_need) {
    auto whole = torch::empty({std::max(width, total_rows(weights)), in}, x2.options().dtype(at::kFloat));
    int64_t row = 0;
    for (auto& w : weights) {
      w.mutable_grad() = whole.narrow(0, row, w.size(0));
      row += w.size(0);
    }
    return {GradProduct{whole, 0, whole.size(0), false, false}};
  }
  if (grads_are_one_buffer(weights)) {
    auto whole = weights.front().grad().as_strided({total_rows(weights), in}, {in, 1});
    return {GradProduct{whole, 0, whole.size(0), true, false}};
  }
  std::vector<GradProduct> out;
  int64_t col = 0;
  for (auto& w : weights) {
    const int64_t rows = w.size(0);
    col += rows;
    if (!w.requires_grad()) continue;
    at::Tensor& grad = w.mutable_grad();
    if (!grad.defined()) {
      grad = torch::empty_like(w, at::MemoryFormat::Contiguous);
      out.push_back({grad, col - rows, rows, false, false});
    } else {
      const bool plain = grad.scalar_type() == at::kFloat && grad.is_contiguous();
      out.push_back({grad, col - rows, rows, true, !plain});
    }
  }
  return out;
}

// g2 [N, cols], or padded with zero columns past cols (aligned_columns): then the whole product at
// its width once, into fp32 rows, and each weight's block out of those; or straight into one
// product's buffer where that spans the whole width (plan_weight_grads' padded buffer).
void run_grad_products(std::vector<GradProduct>& products, const at::Tensor& g2, int64_t cols, const at::Tensor& x2,
                       bool no_workspace) {
  const bool one_whole_width = products.size() == 1 && products[0].col == 0 && products[0].rows == g2.size(1);
  if (g2.size(1) != cols && !products.empty() && !one_whole_width) {
    auto whole = torch::empty({g2.size(1), x2.size(1)}, x2.options().dtype(at::kFloat));
    at_b_into_(whole, g2, x2, /*accumulate=*/false, no_workspace);
    for (auto& p : products) {
      const auto part = whole.narrow(0, p.col, p.rows);
      if (p.accumulate) p.c.add_(p.cast_add ? part.to(p.c.scalar_type()) : part);
      else p.c.copy_(part);
    }
    return;
  }
  for (auto& p : products) {
    auto gi = p.col == 0 && p.rows == g2.size(1) ? g2 : g2.narrow(1, p.col, p.rows);  // [N, rows]
    if (p.cast_add) p.c.add_(torch::mm(gi.t(), x2).to(p.c.scalar_type()));
    else at_b_into_(p.c, gi, x2, p.accumulate, no_workspace);
  }
}

#if defined(DD_HAVE_CUDA)
// The weight-gradient stream of each device: created on first use (never one of the pool's
// streams, which other code may also hold), flagged while it has work the caller has not joined.
struct GradStreams {
  std::mutex mu;
  std::map<int, c10::cuda::CUDAStream> stream;
  std::map<int, bool> pending;
};
GradStreams& grad_streams() {
  static GradStreams s;
  return s;
}

c10::cuda::CUDAStream grad_stream_with_work(int device) {
  auto& s = grad_streams();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.stream.find(device);
  if (it == s.stream.end()) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaStream_t raw = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    it = s.stream.emplace(device, c10::cuda::getStreamFromExternal(raw, static_cast<c10::DeviceIndex>(device))).first;
  }
  s.pending[device] = true;
  return it->second;
}

// The products on the device's weight-gradient stream, after everything queued so far on the
// caller's stream; g2 and x2 stay allocated until that stream is done with them.
// `ready`: an event recorded on the caller's stream at the point they may start from, where not
// now. `sms`: the SM count cuBLAS targets (0: all of them).
void run_grad_products_aside(std::vector<GradProduct>& products, const at::Tensor& g2, int64_t cols,
                             const at::Tensor& x2, bool no_workspace, at::cuda::CUDAEvent* ready = nullptr,
                             int sms = 0) {
  ++aside_weight_grad_products;
  const int device = g2.device().index();
  auto main = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  auto side = grad_stream_with_work(device);
  at::cuda::CUDAEvent inputs_ready;
  if (ready == nullptr) {
    inputs_ready.record(main);
    ready = &inputs_ready;
  }
  ready->block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    auto handle = at::cuda::getCurrentCUDABlasHandle();
    if (sms > 0) TORCH_CUDABLAS_CHECK(cublasSetSmCountTarget(handle, sms));
    run_grad_products(products, g2, cols, x2, no_workspace);
    if (sms > 0) TORCH_CUDABLAS_CHECK(cublasSetSmCountTarget(handle, 0));
  }
  g2.record_stream(side);
  x2.record_stream(side);
}

// Products whose backward put off their weight-gradient GEMMs (WeightGradsDeferredScope), per
// device, with the point on the caller's stream they may start from. Not thread-local: autograd
// runs the backward on a thread of its own, and join_weight_grad_stream may be called from another.
struct DeferredProduct {
  std::vector<GradProduct> products;
  at::Tensor g2, x2;
  int64_t cols = 0;
  bool no_workspace = false;
};
struct DeferredGrads {
  std::mutex mu;
  std::map<int, std::vector<DeferredProduct>> queued;
  std::map<int, std::shared_ptr<at::cuda::CUDAEvent>> ready;
};
DeferredGrads& deferred_grads() {
  static DeferredGrads d;
  return d;
}
std::atomic<int64_t> deferred_weight_grad_products{0};
#endif

// x as the products read it: [N, in] in the product's dtype, contiguous.
at::Tensor product_rows(const at::Tensor& x, at::ScalarType dtype) {
  auto x2 = (x.scalar_type() == dtype ? x : x.to(dtype)).reshape({-1, x.size(-1)});
  return x2.is_contiguous() ? x2 : x2.contiguous();
}

// The scope's choices a product's backward keeps: the weight-gradient stream and the GEMMs without
// workspace.
void save_scope_flags(AutogradContext* ctx, const at::Tensor& x, bool no_workspace) {
  if (grad_stream_active && x.is_cuda()) ctx->saved_data["grad_stream"] = true;
  // Put off only where the scope runs weight gradients aside: its caller joins the second stream,
  // which starts whatever is still queued.
  if (defer_active && grad_stream_active && x.is_cuda()) ctx->saved_data["defer"] = true;
  if (no_workspace) ctx->saved_data["no_workspace"] = true;
}

// Each weight's block of g2ᵀ · x2 into its .grad (plan_weight_grads), on the weight-gradient
// stream where the scope asked for it.
void weight_grads(AutogradContext* ctx, std::vector<at::Tensor>& weights, const at::Tensor& g2, int64_t cols,
                  const at::Tensor& x2, bool no_workspace) {
  auto products = plan_weight_grads(weights, x2, g2.size(1));
#if defined(DD_HAVE_CUDA)
  if (!products.empty() && ctx->saved_data.count("defer") > 0) {
    auto& d = deferred_grads();
    std::lock_guard<std::mutex> lock(d.mu);
    d.queued[g2.device().index()].push_back({std::move(products), g2, x2, cols, no_workspace});
    ++deferred_weight_grad_products;
    return;
  }
  if (!products.empty() && ctx->saved_data.count("grad_stream") > 0) {
    run_grad_products_aside(products, g2, cols, x2, no_workspace);
    return;
  }
#endif
  run_grad_products(products, g2, cols, x2, no_workspace);
}

// The products of x with one or more groups of weights, y_g = x · [W_g1; W_g2; ...]ᵀ, one output
// per group (group_sizes: how many of `weights` each takes, in order). x's gradient is the sum of
// the groups' products, each GEMM after the first adding into it (fp32 accumulation, one rounding)
// rather than autograd adding the groups' separate gradients afterwards (one more pass over x's
// gradient per extra group).
struct MixedLinearFn : public torch::autograd::Function<MixedLinearFn> {
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, int64_t dtype_code,
                             std::vector<int64_t> group_sizes) {
    const auto dtype = static_cast<at::ScalarType>(dtype_code);
    const int64_t in = x.size(-1);
    for (const auto& w : weights)
      TORCH_CHECK(w.dim() == 2 && w.size(1) == in, "mixed_linear: weight ", w.sizes(), " for input ", x.sizes());
    ctx->set_materialize_grads(false);  // an output nobody used hands back no gradient, not zeros
    const auto x2 = product_rows(x, dtype);
    const bool no_workspace = no_workspace_active && x.is_cuda();
    tensor_list ys, saved = {x2};
    size_t first = 0;
    for (const int64_t n : group_sizes) {
      const auto group = weights.slice(first, n);
      first += n;
      auto shape = x.sizes().vec();
      const int64_t cols = total_rows(group.vec()), padded = aligned_columns(cols, x2);
      // [Σ out_i, in] kept current by AdamW, with its zero rows to `padded` where the shadow has them.
      auto wh = shadowed_weight_blocks(group, dtype, padded);
      shape.back() = cols;
      if (padded == cols) {
        ys.push_back(product(x2, wh, /*b_trans=*/true, no_workspace).view(shape));
      } else {
        if (wh.size(0) != padded) wh = at::constant_pad_nd(wh, {0, 0, 0, padded - cols}, 0);  // zero rows past cols
        ys.push_back(product(x2, wh, /*b_trans=*/true, no_workspace).narrow(1, 0, cols).contiguous().view(shape));
      }
      saved.push_back(wh);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["weights"] = weights.vec();
    ctx->saved_data["group_sizes"] = group_sizes;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    save_scope_flags(ctx, x, no_workspace);
    return ys;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x2 = saved[0];  // [N, in], the product's dtype
    auto weights = ctx->saved_data["weights"].toTensorVector();
    const auto group_sizes = ctx->saved_data["group_sizes"].toIntVector();
    tensor_list out(weights.size() + 3);  // x, each weight (their gradients went to .grad), dtype, groups
    const bool no_workspace = ctx->saved_data.count("no_workspace") > 0;
    at::Tensor dx;  // [N, in], the product's dtype
    size_t first = 0;
    for (size_t gi = 0; gi < group_sizes.size(); ++gi) {
      const size_t n = static_cast<size_t>(group_sizes[gi]);
      std::vector<at::Tensor> group(weights.begin() + first, weights.begin() + first + n);
      first += n;
      if (!grads[gi].defined()) continue;
      const at::Tensor& wh = saved[gi + 1];  // [Σ out_i, in], with zero rows past them (aligned_columns)
      const int64_t cols = total_rows(group);
      auto g2 = grads[gi].reshape({-1, cols});
      if (g2.scalar_type() != wh.scalar_type()) g2 = g2.to(wh.scalar_type());
      if (!g2.is_contiguous()) g2 = g2.contiguous();
      // At a padded width, g2 with zero columns to match: the padding adds zero products.
      if (wh.size(0) != cols) g2 = at::constant_pad_nd(g2, {0, wh.size(0) - cols}, 0);
      if (ctx->needs_input_grad(0)) {
        if (!dx.defined()) dx = product(g2, wh, /*b_trans=*/false, no_workspace);
        else product_into(dx, g2, wh, /*b_trans=*/false, no_workspace, /*accumulate=*/true);
      }
      weight_grads(ctx, group, g2, cols, x2, no_workspace);
    }
    if (dx.defined()) {
      const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      dx = dx.view(ctx->saved_data["x_shape"].toIntVector());
      out[0] = dx.scalar_type() == x_dtype ? dx : dx.to(x_dtype);
    }
    return out;
  }
};

// A column range of a fused product's gradient rows: a part's gradient [N, width] to copy in, or
// zeros where `src` is undefined.
struct ColumnPart {
  at::Tensor src;
  int64_t col, width;
};

#if defined(DD_HAVE_CUDA)
// The parts of `parts` that fill_column_blocks_16bit takes (every part in g's 16-bit dtype with unit
// column stride, and the zero ranges), written into g by one launch; returns the others.
std::vector<const ColumnPart*> fill_columns_by_kernel(at::Tensor& g, const std::vector<ColumnPart>& parts) {
  std::vector<const ColumnPart*> rest;
  std::vector<kernels::ColumnBlock> blocks;
  for (const auto& p : parts) {
    const bool fits = !p.src.defined() || (p.src.scalar_type() == g.scalar_type() && p.src.device() == g.device() &&
                                           (p.src.stride(1) == 1 || p.width == 1));
    if (!fits || static_cast<int>(blocks.size()) == kernels::kMaxColumnBlocks) {
      rest.push_back(&p);
      continue;
    }
    blocks.push_back({p.src.defined() ? p.src.data_ptr() : nullptr, p.src.defined() ? p.src.stride(0) : 0, p.col,
                      p.width});
  }
  if (!blocks.empty()) {
    const c10::cuda::CUDAGuard guard(g.device());
    check_kernel_launch(kernels::fill_column_blocks_16bit(g.data_ptr(), g.size(0), g.stride(0), blocks.data(),
                                                          static_cast<int>(blocks.size()),
                                                          c10::cuda::getCurrentCUDAStream(g.device().index()).stream()),
                        "mixed_linear_split's gradient columns");
    column_blocks_launches.fetch_add(1, std::memory_order_relaxed);
  }
  return rest;
}
#endif

// g [N, ld]'s columns from `parts`: on a GPU with 16-bit g through fill_columns_by_kernel where it
// takes them; the others (and the CPU's) by copy_ / zero_ into the column slice, the reference.
void fill_columns(at::Tensor& g, const std::vector<ColumnPart>& parts) {
  std::vector<const ColumnPart*> rest;
  for (const auto& p : parts) rest.push_back(&p);
#if defined(DD_HAVE_CUDA)
  if (g.is_cuda() && g.element_size() == 2 && column_blocks_kernel_allowed.load(std::memory_order_relaxed))
    rest = fill_columns_by_kernel(g, parts);
#endif
  for (const ColumnPart* p : rest) {
    auto slice = g.narrow(1, p->col, p->width);
    if (p->src.defined()) slice.copy_(p->src);
    else slice.zero_();
  }
}

// x · [W1; W2; ...]ᵀ as one product whose columns go out in consecutive splits (split_sizes): see
// mixed_linear_split. The product's rows are its padded width (aligned_columns), and each output
// is a view of its columns there, so nothing is copied out.
struct MixedLinearSplitFn : public torch::autograd::Function<MixedLinearSplitFn> {
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, int64_t dtype_code,
                             std::vector<int64_t> split_sizes) {
    const auto dtype = static_cast<at::ScalarType>(dtype_code);
    const int64_t in = x.size(-1);
    for (const auto& w : weights)
      TORCH_CHECK(w.dim() == 2 && w.size(1) == in, "mixed_linear_split: weight ", w.sizes(), " for input ", x.sizes());
    ctx->set_materialize_grads(false);
    split_products.fetch_add(1, std::memory_order_relaxed);
    const auto x2 = product_rows(x, dtype);
    const bool no_workspace = no_workspace_active && x.is_cuda();
    const int64_t cols = total_rows(weights.vec()), padded = aligned_columns(cols, x2);
    auto wh = shadowed_weight_blocks(weights, dtype, padded);  // [Σ out_i, in], or the shadow's padded rows
    if (wh.size(0) != padded) wh = at::constant_pad_nd(wh, {0, 0, 0, padded - cols}, 0);  // zero rows past cols
    const auto y = product(x2, wh, /*b_trans=*/true, no_workspace);  // [N, padded]
    tensor_list ys;
    int64_t col = 0;
    for (const int64_t n : split_sizes) {
      auto shape = x.sizes().vec();
      shape.back() = n;
      ys.push_back(y.narrow(1, col, n).view(shape));
      col += n;
    }
    ctx->save_for_backward({x2, wh});
    ctx->saved_data["weights"] = weights.vec();
    ctx->saved_data["split_sizes"] = split_sizes;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    save_scope_flags(ctx, x, no_workspace);
    return ys;
  }

  // The outputs' gradients as one [N, padded] matrix g (zeros where an output had none and past the
  // columns): the first output's gradient itself where it already sits at the start of such rows
  // in a buffer nothing else holds, with room for the rest (the Gated DeltaNet's conv backward
  // leaves it so, model/fused_short_conv.cpp), the others copied into their columns; else a new one.
  static at::Tensor gradient_rows(const tensor_list& grads, const std::vector<int64_t>& split_sizes, int64_t N,
                                  int64_t padded, at::ScalarType dtype) {
    const at::Tensor& g0 = grads[0];
    bool in_place = g0.defined() && g0.scalar_type() == dtype && g0.dim() >= 2 && g0.stride(-1) == 1 &&
                    g0.stride(-2) == padded && g0.numel() == N * split_sizes[0] &&
                    sole_storage_with_room(g0, 0, N * padded);
    // Leading dims stacked over the rows (one row stride for all N rows).
    for (int64_t d = g0.dim() - 3; in_place && d >= 0; --d)
      in_place = g0.stride(d) == g0.size(d + 1) * g0.stride(d + 1);
    at::Tensor g;
    if (in_place) {
      g = g0.as_strided({N, padded}, {padded, 1}, g0.storage_offset());
    } else {
      for (const auto& gi : grads)
        if (gi.defined() && !g.defined()) g = torch::empty({N, padded}, gi.options().dtype(dtype));
    }
    // The parts to copy in and the column ranges to zero; on a GPU, one kernel for all of them
    // where the parts come in g's 16-bit dtype with unit column stride (kernels/column_blocks.h).
    std::vector<ColumnPart> parts;
    int64_t col = 0;
    for (size_t i = 0; i < split_sizes.size(); ++i) {
      const int64_t n = split_sizes[i];
      if (!(i == 0 && in_place)) parts.push_back({grads[i].defined() ? grads[i].reshape({N, n}) : at::Tensor(), col, n});
      col += n;
    }
    if (col < padded) parts.push_back({at::Tensor(), col, padded - col});
    fill_columns(g, parts);
    if (in_place) split_gradients_in_place.fetch_add(1, std::memory_order_relaxed);
    return g;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &wh = saved[1];  // [N, in]; [padded, in], the product's dtype
    auto weights = ctx->saved_data["weights"].toTensorVector();
    const auto split_sizes = ctx->saved_data["split_sizes"].toIntVector();
    tensor_list out(weights.size() + 3);  // x, each weight (their gradients went to .grad), dtype, splits
    bool any = false;
    for (const auto& g : grads) any = any || g.defined();
    if (!any) return out;
    const bool no_workspace = ctx->saved_data.count("no_workspace") > 0;
    const int64_t N = x2.size(0), cols = total_rows(weights);
    const auto g2 = gradient_rows(grads, split_sizes, N, wh.size(0), wh.scalar_type());
    if (ctx->needs_input_grad(0)) {
      const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      auto dx = product(g2, wh, /*b_trans=*/false, no_workspace).view(ctx->saved_data["x_shape"].toIntVector());
      out[0] = dx.scalar_type() == x_dtype ? dx : dx.to(x_dtype);
    }
    weight_grads(ctx, weights, g2, cols, x2, no_workspace);
    return out;
  }
};

}  // namespace

WeightGradInPlaceScope::WeightGradInPlaceScope(bool on, bool grad_stream, bool no_workspace)
    : was_active_(in_place_active), was_stream_(grad_stream_active), was_no_workspace_(no_workspace_active) {
  in_place_active = on && in_place_allowed.load();
  grad_stream_active = in_place_active && grad_stream && grad_stream_allowed.load();
  no_workspace_active = in_place_active && no_workspace && no_workspace_allowed.load();
}
WeightGradInPlaceScope::~WeightGradInPlaceScope() {
  in_place_active = was_active_;
  grad_stream_active = was_stream_;
  no_workspace_active = was_no_workspace_;
}
bool WeightGradInPlaceScope::active() { return in_place_active; }

WeightGradsOnCallerStreamScope::WeightGradsOnCallerStreamScope() : was_stream_(grad_stream_active) {
  grad_stream_active = false;
}
WeightGradsOnCallerStreamScope::~WeightGradsOnCallerStreamScope() { grad_stream_active = was_stream_; }

WeightGradsDeferredScope::WeightGradsDeferredScope() : was_defer_(defer_active) { defer_active = true; }
WeightGradsDeferredScope::~WeightGradsDeferredScope() { defer_active = was_defer_; }

int64_t weight_grads_deferred() {
#if defined(DD_HAVE_CUDA)
  return deferred_weight_grad_products.load();
#else
  return 0;
#endif
}

void deferred_weight_grads_ready_here(const at::Device& device) {
#if defined(DD_HAVE_CUDA)
  if (!device.is_cuda()) return;
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto& d = deferred_grads();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.queued[index].empty()) return;
  auto ready = std::make_shared<at::cuda::CUDAEvent>();
  ready->record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)));
  d.ready[index] = ready;
#else
  (void)device;
#endif
}

void run_deferred_weight_grads(const at::Device& device, int sms) {
#if defined(DD_HAVE_CUDA)
  if (!device.is_cuda()) return;
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto& d = deferred_grads();
  std::vector<DeferredProduct> queued;
  std::shared_ptr<at::cuda::CUDAEvent> ready;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    queued.swap(d.queued[index]);
    ready.swap(d.ready[index]);
  }
  for (auto& q : queued) run_grad_products_aside(q.products, q.g2, q.cols, q.x2, q.no_workspace, ready.get(), sms);
#else
  (void)device;
  (void)sms;
#endif
}
bool WeightGradInPlaceScope::without_workspace() { return no_workspace_active; }
int64_t weight_grads_run_aside() { return aside_weight_grad_products.load(); }

void weight_grads_in_place(bool on) { in_place_allowed = on; }
void weight_grad_stream(bool on) { grad_stream_allowed = on; }
void gemms_without_workspace(bool on) { no_workspace_allowed = on; }

void join_weight_grad_stream(const at::Device& device) {
#if defined(DD_HAVE_CUDA)
  if (!device.is_cuda()) return;
  run_deferred_weight_grads(device);  // any left queued
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto& s = grad_streams();
  std::optional<c10::cuda::CUDAStream> side;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.pending[index]) return;
    s.pending[index] = false;
    side = s.stream.at(index);
  }
  at::cuda::CUDAEvent done;
  done.record(*side);
  done.block(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)));
#else
  (void)device;
#endif
}

bool mixed_linear_applies(const at::Tensor& x, at::TensorList weights) {
  if (!in_place_active || !torch::GradMode::is_enabled() || weights.empty() || !x.defined() || !x.is_cuda()) return false;
  if (!at::autocast::is_autocast_enabled(at::kCUDA)) return false;
  const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const auto xt = x.scalar_type();
  if ((xt != at::kFloat && xt != at::kBFloat16 && xt != at::kHalf) || x.dim() < 1) return false;
  for (const auto& w : weights) {
    if (!w.defined() || w.scalar_type() != at::kFloat || w.dim() != 2 || w.device() != x.device() ||
        !w.requires_grad() || !w.is_leaf() || w.size(1) != x.size(-1))
      return false;
  }
  return true;
}

at::Tensor mixed_linear(const at::Tensor& x, at::TensorList weights, at::ScalarType dtype) {
  TORCH_CHECK(!weights.empty(), "mixed_linear: no weights");
  return mixed_linear_groups(x, weights, {static_cast<int64_t>(weights.size())}, dtype)[0];
}

std::vector<at::Tensor> mixed_linear_groups(const at::Tensor& x, at::TensorList weights,
                                            const std::vector<int64_t>& group_sizes, at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "mixed_linear: product dtype must be bf16 or fp16, got ",
              dtype);
  int64_t total = 0;
  for (const int64_t n : group_sizes) {
    TORCH_CHECK(n > 0, "mixed_linear_groups: every group needs a weight, got group sizes ", group_sizes);
    total += n;
  }
  TORCH_CHECK(!group_sizes.empty() && total == static_cast<int64_t>(weights.size()), "mixed_linear_groups: group sizes ",
              group_sizes, " do not add up to the ", weights.size(), " weights");
  return MixedLinearFn::apply(x, weights, static_cast<int64_t>(dtype), group_sizes);
}

std::vector<at::Tensor> mixed_linear_split(const at::Tensor& x, at::TensorList weights,
                                           const std::vector<int64_t>& split_sizes, at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf, "mixed_linear: product dtype must be bf16 or fp16, got ",
              dtype);
  TORCH_CHECK(!weights.empty(), "mixed_linear_split: no weights");
  int64_t cols = 0, total = 0;
  for (const auto& w : weights) cols += w.size(0);
  for (const int64_t n : split_sizes) {
    TORCH_CHECK(n > 0, "mixed_linear_split: every split needs a column, got split sizes ", split_sizes);
    total += n;
  }
  TORCH_CHECK(!split_sizes.empty() && total == cols, "mixed_linear_split: split sizes ", split_sizes,
              " do not add up to the weights' ", cols, " rows");
  return MixedLinearSplitFn::apply(x, weights, static_cast<int64_t>(dtype), split_sizes);
}

int64_t mixed_linear_split_gradients_in_place() { return split_gradients_in_place.load(std::memory_order_relaxed); }
int64_t mixed_linear_split_products() { return split_products.load(std::memory_order_relaxed); }
void split_gradient_columns_kernel(bool on) { column_blocks_kernel_allowed = on; }
int64_t split_gradient_columns_kernel_launches() { return column_blocks_launches.load(std::memory_order_relaxed); }

namespace {

// The stacked shape of weights [rows_i, C] or [E, rows_i, C]: [Σ rows_i, C] or [E, Σ rows_i, C].
std::vector<int64_t> stacked_shape(at::TensorList weights) {
  TORCH_CHECK(!weights.empty(), "cast_weight_blocks: no weights");
  const auto& w0 = weights[0];
  int64_t rows = 0;
  for (const auto& w : weights) {
    const bool stacks = (w.dim() == 2 || w.dim() == 3) && w.dim() == w0.dim() && w.size(-1) == w0.size(-1) &&
                        (w.dim() == 2 || w.size(0) == w0.size(0));
    TORCH_CHECK(stacks, "cast_weight_blocks: weight ", w.sizes(), " does not stack with ", w0.sizes());
    rows += w.size(-2);
  }
  if (w0.dim() == 2) return {rows, w0.size(1)};
  return {w0.size(0), rows, w0.size(2)};
}

}  // namespace

at::Tensor cast_weight_blocks(at::TensorList weights, at::ScalarType dtype) {
  auto out = torch::empty(stacked_shape(weights), weights[0].options().dtype(dtype));
  cast_weight_blocks_into(out, weights);
  return out;
}

void cast_weight_blocks_into(at::Tensor& out, at::TensorList weights) {
  const auto shape = stacked_shape(weights);
  TORCH_CHECK(out.sizes() == at::IntArrayRef(shape) && out.is_contiguous(), "cast_weight_blocks: out ", out.sizes(),
              " for ", at::IntArrayRef(shape), " weights");
#if defined(DD_HAVE_CUDA)
  kernels::DType out_dt{};
  bool fits = weights.size() <= static_cast<size_t>(kernels::WeightBlocks::kMax) && weights[0].is_cuda() &&
              out.device() == weights[0].device() && out.scalar_type() != at::kFloat &&
              kernel_dtype(out.scalar_type(), out_dt);
  for (const auto& w : weights)
    fits = fits && w.scalar_type() == at::kFloat && w.is_contiguous() && w.device() == weights[0].device();
  if (fits) {
    kernels::WeightBlocks b;
    b.n = static_cast<int>(weights.size());
    b.cols = weights[0].size(-1);
    b.experts = weights[0].dim() == 3 ? weights[0].size(0) : 1;
    for (int i = 0; i < b.n; ++i) {
      b.src[i] = weights[i].data_ptr<float>();
      b.rows[i] = weights[i].size(-2);
    }
    check_kernel_launch(kernels::cast_weight_blocks(out.data_ptr(), out_dt, b, stream_of(out)), "cast_weight_blocks");
    return;
  }
#endif
  out.copy_(weights.size() == 1 ? weights[0] : torch::cat(weights, -2));
}

}  // namespace model

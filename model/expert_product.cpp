#include "model/expert_product.h"

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "model/expert_grads_in_pieces.h"
#include "model/grad_square_sums.h"
#include "model/grouped_linear.h"
#include "model/mixed_linear.h"
#include "model/weight_shadow.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/block_grads.h"
#include "kernels/expert_grad_pieces.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

std::atomic<bool> allowed{true};
std::atomic<int64_t> piece_rows_setting{-1};  // expert_grad_piece_rows: −1 the default rule, 0 off

// f(e, start, rows) for each expert e with rows > 0, its rows [start, start + rows) read to the
// host from the offsets: the looped products' walk.
template <typename F>
void for_each_group(const at::Tensor& offsets, F&& f) {
  auto ends = offsets.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* end = ends.data_ptr<int64_t>();
  int64_t start = 0;
  for (int64_t e = 0; e < ends.numel(); ++e) {
    if (end[e] > start) f(e, start, end[e] - start);
    start = end[e];
  }
}

bool grouped_gemm_takes(const at::Tensor& x, const at::Tensor& w) { return grouped_linear_offsets_supported(x, w); }

// y = x_e · W_eᵀ per group (w [E, N, K]).
at::Tensor forward_product(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) {
  if (grouped_gemm_takes(x, w)) return at::_grouped_mm(x, w.transpose(1, 2), offsets);
  auto y = torch::empty({x.size(0), w.size(1)}, x.options());
  for_each_group(offsets, [&](int64_t e, int64_t start, int64_t n) {
    y.narrow(0, start, n).copy_(torch::mm(x.narrow(0, start, n), w[e].t()));
  });
  return y;
}

// dx = dy_e · W_e per group.
at::Tensor input_grad(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& offsets) {
  if (grouped_gemm_takes(dy, w.transpose(1, 2))) return at::_grouped_mm(dy, w, offsets);
  auto dx = torch::empty({dy.size(0), w.size(2)}, dy.options());
  for_each_group(offsets, [&](int64_t e, int64_t start, int64_t n) {
    dx.narrow(0, start, n).copy_(torch::mm(dy.narrow(0, start, n), w[e]));
  });
  return dx;
}

// The weights' gradient as the GEMM leaves it: dw [E, N, K] in dy's dtype, one block an expert, or
// (first and count defined) dw [G, N, K] holding partial sums over pieces of the experts' rows,
// expert e's being pieces first[e] .. first[e] + count[e] − 1 (kernels/expert_grad_pieces.h).
struct ExpertWeightGrad {
  at::Tensor dw, first, count;
};

// dW_e = dy_eᵀ · x_e per group; experts without rows get zeros. On the grouped GEMM, each expert's
// rows in pieces of at most expert_grad_piece_rows_for(...) rows where that is set.
ExpertWeightGrad weight_grad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& w) {
  if (grouped_gemm_takes(x, w)) {
#if defined(DD_HAVE_CUDA)
    const int64_t E = w.size(0), R = x.size(0);
    const int64_t piece = expert_grad_piece_rows_for(R, E);
    if (piece > 0 && E <= kernels::kExpertPiecesMaxExperts && R <= INT32_MAX) {
      const int64_t G = kernels::expert_pieces_bound(E, R, piece);
      auto meta = torch::empty({G + 2 * E}, offsets.options());  // piece ends | first | count
      auto piece_ends = meta.narrow(0, 0, G), first = meta.narrow(0, G, E), count = meta.narrow(0, G + E, E);
      check_kernel_launch(kernels::expert_grad_pieces(offsets.data_ptr<int32_t>(), E, piece, G,
                                                      piece_ends.data_ptr<int32_t>(), first.data_ptr<int32_t>(),
                                                      count.data_ptr<int32_t>(), stream_of(offsets)),
                          "expert weight-gradient pieces");
      return {at::_grouped_mm(dy.t(), x, piece_ends), first, count};
    }
#endif
    return {at::_grouped_mm(dy.t(), x, offsets), {}, {}};
  }
  auto dw = torch::zeros(w.sizes(), dy.options());
  for_each_group(offsets, [&](int64_t e, int64_t start, int64_t n) {
    dw[e].copy_(torch::mm(dy.narrow(0, start, n).t(), x.narrow(0, start, n)));
  });
  return {dw, {}, {}};
}

#if defined(DD_HAVE_CUDA)
// The scatter kernel's view of wg for `weights` (their rows in order), no destinations yet.
kernels::GradBlocks blocks_of(const std::vector<at::Tensor>& weights, const ExpertWeightGrad& wg) {
  kernels::GradBlocks b;
  b.n = static_cast<int>(weights.size());
  b.cols = wg.dw.size(2);
  b.experts = wg.first.defined() ? wg.first.size(0) : wg.dw.size(0);
  if (wg.first.defined()) {
    b.piece_first = wg.first.data_ptr<int32_t>();
    b.piece_count = wg.count.data_ptr<int32_t>();
  }
  for (int i = 0; i < b.n; ++i) b.rows[i] = weights[i].size(1);
  return b;
}

// fp64 [grid, n] for the launch's square partials, set in b; their column sums are ‖grad‖² per weight.
at::Tensor square_partials_for(kernels::GradBlocks& b, const at::Tensor& dw) {
  auto partials = torch::empty({kernels::scatter_block_grads_grid(b), b.n}, dw.options().dtype(torch::kFloat64));
  b.square_partials = partials.data_ptr<double>();
  return partials;
}
#endif

// Each weight's block of dw [E, Σ n_i, K] into its .grad: written where that is undefined (a new
// fp32 tensor), added otherwise. One kernel on a GPU when every weight takes its gradient and each
// destination is plain fp32; else ATen per weight (the reference).
void scatter_weight_grads(std::vector<at::Tensor>& weights, const ExpertWeightGrad& wg) {
  const at::Tensor& dw = wg.dw;
  struct Dest {
    at::Tensor grad;
    bool add;
  };
  std::vector<Dest> dest;
  bool plain = true;
  for (auto& w : weights) {
    if (!w.requires_grad()) {
      dest.push_back({at::Tensor(), false});
      plain = false;
      continue;
    }
    at::Tensor& g = w.mutable_grad();
    const bool add = g.defined();
    if (!add) g = torch::empty_like(w, at::MemoryFormat::Contiguous);
    plain = plain && g.scalar_type() == at::kFloat && g.is_contiguous() && g.sizes() == w.sizes();
    dest.push_back({g, add});
  }
#if defined(DD_HAVE_CUDA)
  kernels::DType src_dt{};
  if (plain && dw.is_cuda() && dw.is_contiguous() && dw.scalar_type() != at::kFloat && kernel_dtype(dw.scalar_type(), src_dt) &&
      dest.size() <= static_cast<size_t>(kernels::GradBlocks::kMax)) {
    kernels::GradBlocks b = blocks_of(weights, wg);
    for (int i = 0; i < b.n; ++i) {
      b.dst[i] = dest[i].grad.data_ptr<float>();
      b.add[i] = dest[i].add;
    }
    // The clipping norm's sums of squares, taken as the gradients are written (model/grad_square_sums.h).
    at::Tensor partials;
    if (grad_square_sums_collecting(dw.device())) partials = square_partials_for(b, dw);
    check_kernel_launch(kernels::scatter_block_grads(dw.data_ptr(), src_dt, b, stream_of(dw)), "expert weight gradients");
    if (partials.defined()) {
      const auto sums = partials.sum(0);
      for (int i = 0; i < b.n; ++i) record_grad_square_sum(weights[i], sums[i]);
    }
    return;
  }
#endif
  const at::Tensor whole = wg.first.defined() ? sum_expert_grad_pieces(dw, wg.first, wg.count) : dw;
  int64_t col = 0;
  for (size_t i = 0; i < dest.size(); ++i) {
    const int64_t n = weights[i].size(1);
    if (dest[i].grad.defined()) {
      auto block = whole.narrow(1, col, n);
      if (dest[i].add) dest[i].grad.add_(block.to(dest[i].grad.scalar_type()));
      else dest[i].grad.copy_(block);
    }
    col += n;
  }
}

// Leaves the weights' gradient in its pieces for the optimizer (model/expert_grads_in_pieces.h)
// when a step asked for that and every weight takes it: one read of the pieces sums each weight's
// squares for the clipping norm, nothing is written. A weight whose gradient is already in pieces
// (a second backward in the step) has it written to .grad first, and this gradient is then added
// there. Returns false when the gradient must go to .grad.
bool leave_in_pieces(std::vector<at::Tensor>& weights, const ExpertWeightGrad& wg) {
#if defined(DD_HAVE_CUDA)
  const at::Tensor& dw = wg.dw;
  if (!dw.is_cuda() || !expert_grads_in_pieces(dw.device())) return false;
  bool takes = weights.size() <= static_cast<size_t>(kernels::GradBlocks::kMax);
  int64_t rows = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto& w = weights[i];
    takes = takes && w.requires_grad() && w.scalar_type() == at::kFloat && !w.grad().defined() &&
            expert_grad_pieces_of(w) == nullptr;
    for (size_t j = 0; j < i; ++j) takes = takes && !w.is_same(weights[j]);  // one weight twice: .grad adds
    rows += w.size(1);
  }
  takes = takes && dw.dim() == 3 && rows == dw.size(1);
  kernels::DType src_dt{};
  if (!takes || !dw.is_contiguous() || dw.scalar_type() == at::kFloat || !kernel_dtype(dw.scalar_type(), src_dt)) {
    materialize_expert_grad_pieces(weights);
    return false;
  }
  kernels::GradBlocks b = blocks_of(weights, wg);  // no destinations: squares only
  auto partials = square_partials_for(b, dw);
  check_kernel_launch(kernels::scatter_block_grads(dw.data_ptr(), src_dt, b, stream_of(dw)),
                      "expert weight gradients' squares");
  record_expert_grad_pieces(weights, dw, wg.first, wg.count, partials.sum(0));
  return true;
#else
  (void)weights;
  (void)wg;
  return false;
#endif
}

struct ExpertProductFn : public torch::autograd::Function<ExpertProductFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& offsets, at::TensorList weights,
                            int64_t dtype_code) {
    const auto dtype = static_cast<at::ScalarType>(dtype_code);
    auto xc = (x.scalar_type() == dtype ? x : x.to(dtype)).contiguous();
    auto w = shadowed_expert_blocks(weights, dtype);  // [E, Σ n_i, K], kept current by AdamW
    auto y = forward_product(xc, w, offsets);
    ctx->save_for_backward({xc, w, offsets});
    ctx->saved_data["weights"] = weights.vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &offsets = saved[2];
    auto weights = ctx->saved_data["weights"].toTensorVector();
    tensor_list out(weights.size() + 3);  // x, offsets, each weight (their gradients went to .grad), dtype
    if (!grads[0].defined()) return out;
    auto dy = grads[0].scalar_type() == w.scalar_type() ? grads[0] : grads[0].to(w.scalar_type());
    if (!dy.is_contiguous()) dy = dy.contiguous();
    if (ctx->needs_input_grad(0)) {
      const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      auto dx = input_grad(dy, w, offsets);
      out[0] = dx.scalar_type() == x_dtype ? dx : dx.to(x_dtype);
    }
    bool weights_need = false;
    for (size_t i = 0; i < weights.size(); ++i) weights_need = weights_need || ctx->needs_input_grad(2 + i);
    if (weights_need) {
      auto wg = weight_grad(dy, x, offsets, w);
      if (!leave_in_pieces(weights, wg)) scatter_weight_grads(weights, wg);
    }
    return out;
  }
};

}  // namespace

bool expert_product_applies(const at::Tensor& x, at::TensorList weights, at::ScalarType dtype) {
  if (!allowed || !WeightGradInPlaceScope::active() || !at::GradMode::is_enabled() || !x.is_cuda() ||
      x.dim() != 2 || x.scalar_type() != dtype || weights.empty() ||
      weights.size() > static_cast<size_t>(4))
    return false;
  int64_t n = 0;
  for (const auto& w : weights) {
    if (w.dim() != 3 || w.scalar_type() != at::kFloat || !w.is_contiguous() || w.device() != x.device() ||
        !w.requires_grad() || !w.is_leaf() || w.size(0) != weights[0].size(0) || w.size(2) != x.size(1))
      return false;
    n += w.size(1);
  }
  return grouped_linear_offsets_supported(x.device(), dtype, n, x.size(1)) &&
         grouped_linear_offsets_supported(x.device(), dtype, x.size(1), n);  // the input gradient's product
}

at::Tensor expert_product(const at::Tensor& x, at::TensorList weights, const at::Tensor& offsets, at::ScalarType dtype) {
  TORCH_CHECK(!weights.empty(), "expert_product: no weights");
  TORCH_CHECK(x.dim() == 2, "expert_product: expected x [M, K], got ", x.sizes());
  for (const auto& w : weights)
    TORCH_CHECK(w.dim() == 3 && w.size(0) == weights[0].size(0) && w.size(2) == x.size(1), "expert_product: weight ",
                w.sizes(), " for x ", x.sizes(), " and ", weights[0].size(0), " experts");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == weights[0].size(0) && offsets.scalar_type() == torch::kInt32 &&
                  offsets.device() == x.device(),
              "expert_product: expected int32 offsets [", weights[0].size(0), "] on ", x.device(), ", got ",
              offsets.sizes(), " ", offsets.scalar_type(), " on ", offsets.device());
  return ExpertProductFn::apply(x, offsets, weights, static_cast<int64_t>(dtype));
}

void expert_products(bool on) { allowed = on; }

void scatter_expert_weight_grads(std::vector<at::Tensor> weights, const at::Tensor& dw, const at::Tensor& first,
                                 const at::Tensor& count) {
  scatter_weight_grads(weights, ExpertWeightGrad{dw, first, count});
}

at::Tensor sum_expert_grad_pieces(const at::Tensor& pieces, const at::Tensor& first, const at::Tensor& count) {
  TORCH_CHECK(pieces.dim() == 3 && first.dim() == 1 && count.sizes() == first.sizes(),
              "sum_expert_grad_pieces: expected pieces [G, N, K] and first, count [E], got ", pieces.sizes(), ", ",
              first.sizes(), ", ", count.sizes());
  const int64_t E = first.size(0), G = pieces.size(0);
  // Piece g belongs to the expert whose pieces end past it (experts without pieces are skipped by
  // the search); the unused pieces past the last go to a spare row.
  const auto ends = (first + count).to(torch::kLong);
  const auto owner = torch::searchsorted(ends, torch::arange(G, ends.options()), /*out_int32=*/false, /*right=*/true);
  auto sum = torch::zeros({E + 1, pieces.size(1), pieces.size(2)}, pieces.options().dtype(torch::kFloat));
  sum.index_add_(0, owner, pieces.to(torch::kFloat));
  return sum.narrow(0, 0, E);
}

void expert_grad_piece_rows(int64_t rows) { piece_rows_setting = rows < 0 ? -1 : rows; }

int64_t expert_grad_piece_rows_for(int64_t rows, int64_t experts) {
  const int64_t setting = piece_rows_setting;
  if (setting >= 0) return setting;
  if (rows <= 0 || experts <= 0) return 0;
  const int64_t mean = (rows + experts - 1) / experts;
  return (kExpertGradPieceMeans * mean + 63) / 64 * 64;
}

}  // namespace model

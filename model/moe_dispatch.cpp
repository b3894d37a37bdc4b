#include "model/moe_dispatch.h"

#include <torch/torch.h>

#include <cstdint>

#if defined(DD_HAVE_CUDA)
#include "kernels/moe_combine.h"
#include "kernels/moe_routing.h"
#include "model/kernel_dtype.h"
#endif

namespace model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#if defined(DD_HAVE_CUDA)
// Whether the combine kernels take rows `x` [.., d] with k slots and weights of dtype `w`.
bool combine_kernel_takes(const torch::Tensor& x, int64_t k, c10::ScalarType w = torch::kFloat32) {
  kernels::DType dt;
  return x.is_cuda() && kernel_dtype(x.scalar_type(), dt) && w == torch::kFloat32 && kernels::moe_combine_supports(k) &&
         x.numel() > 0;
}


// out [N, d] = add[t] + Σ_j w[t·k + j] · src[idx[t·k + j]] (w undefined: weights 1; add undefined:
// nothing added; else contiguous and of src's dtype), by the kernel.
torch::Tensor gather_sum_kernel(const torch::Tensor& src, const torch::Tensor& idx, const torch::Tensor& w, int64_t k,
                                const torch::Tensor& add = {}) {
  auto s = src.contiguous();
  const int64_t N = idx.size(0) / k, d = s.size(1);
  auto out = torch::empty({N, d}, s.options());
  check_kernel_launch(kernels::moe_combine_forward(out.data_ptr(), s.data_ptr(), idx.data_ptr<int64_t>(),
                                                   w.defined() ? w.data_ptr<float>() : nullptr,
                                                   add.defined() ? add.data_ptr() : nullptr, N, k, d,
                                                   checked_kernel_dtype(s.scalar_type(), "moe combine"),
                                                   stream_of(s)),
                      "moe combine forward");
  return out;
}

// x [N, d] rows gathered at rows [R], by the kernel.
torch::Tensor gather_rows_kernel(const torch::Tensor& x, const torch::Tensor& rows) {
  auto xc = x.contiguous();
  auto out = torch::empty({rows.size(0), xc.size(1)}, xc.options());
  check_kernel_launch(kernels::moe_gather_rows(out.data_ptr(), xc.data_ptr(), rows.data_ptr<int64_t>(), rows.size(0),
                                               xc.size(1), checked_kernel_dtype(xc.scalar_type(), "moe dispatch"),
                                               stream_of(xc)),
                      "moe dispatch gather");
  return out;
}

bool gather_kernel_takes(const torch::Tensor& x, const torch::Tensor& rows) {
  kernels::DType dt;
  return x.is_cuda() && kernel_dtype(x.scalar_type(), dt) && x.numel() > 0 && rows.numel() > 0;
}
#endif

class DispatchRowsFn : public torch::autograd::Function<DispatchRowsFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& token,
                               const torch::Tensor& inverse, int64_t k) {
    ctx->saved_data["inverse"] = inverse;
    ctx->saved_data["k"] = k;
#if defined(DD_HAVE_CUDA)
    if (gather_kernel_takes(x, token)) return gather_rows_kernel(x, token);
#endif
    return x.index_select(0, token);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto inverse = ctx->saved_data["inverse"].toTensor();
    const int64_t k = ctx->saved_data["k"].toInt();
    const auto& g = grads[0];  // [N·k, d] expert order
#if defined(DD_HAVE_CUDA)
    if (combine_kernel_takes(g, k)) return {gather_sum_kernel(g, inverse, torch::Tensor(), k), {}, {}, {}};
#endif
    auto dx = g.index_select(0, inverse).view({-1, k, g.size(1)}).sum(1);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class CombineRowsFn : public torch::autograd::Function<CombineRowsFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& ys, const torch::Tensor& order,
                               const torch::Tensor& inverse) {
    ctx->saved_data["order"] = order;
    return ys.index_select(0, inverse);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto order = ctx->saved_data["order"].toTensor();
    return {grads[0].index_select(0, order), torch::Tensor(), torch::Tensor()};
  }
};

#if defined(DD_HAVE_CUDA)
class CombineWeightedFn : public torch::autograd::Function<CombineWeightedFn> {
 public:
  // add: the shared expert's output (contiguous, ys' dtype), or an empty tensor for none (an
  // autograd function's tensor inputs must be defined).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& ys, const torch::Tensor& gamma,
                               const torch::Tensor& inverse, const torch::Tensor& add) {
    auto ysc = ys.contiguous();
    auto g = gamma.contiguous();
    ctx->save_for_backward({ysc, g, inverse});
    const bool has_add = add.numel() > 0;
    ctx->saved_data["has_add"] = has_add;
    return gather_sum_kernel(ysc, inverse, g.view({-1}), g.size(1), has_add ? add : torch::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto sv = ctx->get_saved_variables();
    const auto &ys = sv[0], &gamma = sv[1], &inverse = sv[2];
    auto dy = grads[0].contiguous();
    const int64_t N = gamma.size(0), k = gamma.size(1), d = ys.size(1);
    auto dys = torch::empty_like(ys);
    auto dgamma = torch::empty({N, k}, gamma.options());
    check_kernel_launch(kernels::moe_combine_backward(dys.data_ptr(), dgamma.data_ptr<float>(), dy.data_ptr(),
                                                      ys.data_ptr(), inverse.data_ptr<int64_t>(),
                                                      gamma.data_ptr<float>(), N, k, d,
                                                      checked_kernel_dtype(ys.scalar_type(), "moe combine"),
                                                      stream_of(ys)),
                        "moe combine backward");
    // y = add + Σ: add's gradient is y's.
    return {dys, dgamma, torch::Tensor(), ctx->saved_data["has_add"].toBool() ? grads[0] : torch::Tensor()};
  }
};
#endif

}  // namespace

namespace {

void check_flat(const torch::Tensor& flat, int64_t k, int64_t E) {
  TORCH_CHECK(flat.dim() == 1 && flat.scalar_type() == torch::kInt64 && k > 0 && flat.size(0) % k == 0 && E >= 0,
              "expert_order: expected int64 experts [N·k] with k = ", k, " and E >= 0, got ", flat.sizes(), " ",
              flat.scalar_type(), ", E = ", E);
}

}  // namespace

ExpertOrder expert_order(const torch::Tensor& flat, int64_t k, int64_t E) {
  check_flat(flat, k, E);
#if defined(DD_HAVE_CUDA)
  const int64_t P = flat.size(0);
  if (flat.is_cuda() && E > 0 && E <= kernels::MOE_ORDER_MAX_EXPERTS && P > 0 && P <= INT32_MAX) {
    auto f = flat.contiguous();
    auto i64 = f.options();
    ExpertOrder o;
    o.sorted = torch::empty({P}, i64);
    o.order = torch::empty({P}, i64);
    o.inverse = torch::empty({P}, i64);
    o.token = torch::empty({P}, i64);
    o.counts = torch::empty({E}, i64);
    o.ends = torch::empty({E}, i64.dtype(torch::kInt32));
    auto scratch = torch::empty({kernels::moe_order_scratch_ints(P, E)}, i64.dtype(torch::kInt32));
    check_kernel_launch(kernels::moe_expert_order(f.data_ptr<int64_t>(), P, k, E, o.sorted.data_ptr<int64_t>(),
                                                  o.order.data_ptr<int64_t>(), o.inverse.data_ptr<int64_t>(),
                                                  o.token.data_ptr<int64_t>(), o.counts.data_ptr<int64_t>(),
                                                  o.ends.data_ptr<int32_t>(), scratch.data_ptr<int32_t>(),
                                                  stream_of(f)),
                        "moe expert order");
    return o;
  }
#endif
  return expert_order_reference(flat, k, E);
}

ExpertOrder expert_order_reference(const torch::Tensor& flat, int64_t k, int64_t E) {
  check_flat(flat, k, E);
  ExpertOrder o;
  auto sorted = torch::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  o.sorted = std::get<0>(sorted);
  o.order = std::get<1>(sorted);
  o.inverse = torch::empty_like(o.order).scatter_(0, o.order, torch::arange(flat.size(0), o.order.options()));
  o.token = o.order.div(k, "floor");
  if (E > 0) {
    o.counts = expert_counts_sorted(o.sorted, E);
    o.ends = o.counts.cumsum(0).to(torch::kInt32);
  }
  return o;
}

torch::Tensor expert_counts_sorted(const torch::Tensor& sorted, int64_t E) {
  TORCH_CHECK(sorted.dim() == 1 && sorted.scalar_type() == torch::kInt64 && E > 0,
              "expert_counts_sorted: expected ascending int64 experts [N·k] and E > 0, got ", sorted.sizes(), " ",
              sorted.scalar_type(), ", E = ", E);
  // first[e] = the first position holding expert ≥ e, for e = 0..E; counts are the differences.
  auto first = torch::searchsorted(sorted, torch::arange(E + 1, sorted.options()));
  return first.narrow(0, 1, E) - first.narrow(0, 0, E);
}

torch::Tensor dispatch_rows(const torch::Tensor& x, const ExpertOrder& o, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) * k == o.order.size(0), "dispatch_rows: expected x [", o.order.size(0) / k,
              ", d], got ", x.sizes());
  return DispatchRowsFn::apply(x, o.token, o.inverse, k);
}

torch::Tensor combine_rows(const torch::Tensor& ys, const ExpertOrder& o) {
  TORCH_CHECK(ys.dim() == 2 && ys.size(0) == o.order.size(0), "combine_rows: expected ys [", o.order.size(0),
              ", d], got ", ys.sizes());
  return CombineRowsFn::apply(ys, o.order, o.inverse);
}

torch::Tensor combine_weighted_reference(const torch::Tensor& ys, const ExpertOrder& o, const torch::Tensor& gamma,
                                         const torch::Tensor& add) {
  const int64_t k = gamma.size(1);
  auto yt = combine_rows(ys, o).view({-1, k, ys.size(1)});
  auto y = (yt * gamma.to(ys.scalar_type()).unsqueeze(-1)).sum(1);
  return add.defined() ? add + y : y;
}

torch::Tensor combine_weighted(const torch::Tensor& ys, const ExpertOrder& o, const torch::Tensor& gamma,
                               const torch::Tensor& add) {
  TORCH_CHECK(gamma.dim() == 2 && gamma.numel() == o.order.size(0) && ys.dim() == 2 && ys.size(0) == gamma.numel(),
              "combine_weighted: expected ys [N·k, d] and gamma [N, k] with N·k = ", o.order.size(0), ", got ",
              ys.sizes(), " and ", gamma.sizes());
  TORCH_CHECK(!add.defined() || (add.dim() == 2 && add.size(0) == gamma.size(0) && add.size(1) == ys.size(1)),
              "combine_weighted: expected add [", gamma.size(0), ", ", ys.size(1), "], got ", add.sizes());
#if defined(DD_HAVE_CUDA)
  if (combine_kernel_takes(ys, gamma.size(1), gamma.scalar_type()) &&
      (!add.defined() || (add.scalar_type() == ys.scalar_type() && add.device() == ys.device())))
    return CombineWeightedFn::apply(ys, gamma, o.inverse,
                                    add.defined() ? add.contiguous() : torch::empty({0}, ys.options()));
#endif
  return combine_weighted_reference(ys, o, gamma, add);
}

}  // namespace model

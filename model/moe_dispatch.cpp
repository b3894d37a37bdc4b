#include "model/moe_dispatch.h"

#include <torch/torch.h>

#include <atomic>
#include <cstdint>

#if defined(DD_HAVE_CUDA)
#include "kernels/moe_combine.h"
#include "kernels/moe_fan.h"
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

// x's rows permuted: out = x[take]; backward: g[back], with back the inverse permutation of take.
class PermuteRowsFn : public torch::autograd::Function<PermuteRowsFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& take,
                               const torch::Tensor& back) {
    ctx->saved_data["back"] = back;
    return x.index_select(0, take);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto back = ctx->saved_data["back"].toTensor();
    return {grads[0].index_select(0, back), torch::Tensor(), torch::Tensor()};
  }
};

#if defined(DD_HAVE_CUDA)
// y [N, d] = add + Σ_j ys[inverse[t·k + j]] by the combine kernel; backward: each expert-order row
// gets its token's dy, by the fan-out kernel (one read of each dy row, k writes).
class CombineSumFn : public torch::autograd::Function<CombineSumFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& ys, const torch::Tensor& inverse, int64_t k,
                               const torch::Tensor& add) {
    ctx->saved_data["inverse"] = inverse;
    ctx->saved_data["k"] = k;
    const bool has_add = add.numel() > 0;
    ctx->saved_data["has_add"] = has_add;
    return gather_sum_kernel(ys, inverse, torch::Tensor(), k, has_add ? add : torch::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto inverse = ctx->saved_data["inverse"].toTensor();
    const int64_t k = ctx->saved_data["k"].toInt();
    auto dy = grads[0].contiguous();
    const int64_t N = dy.size(0), d = dy.size(1);
    auto dys = torch::empty({N * k, d}, dy.options());
    const auto dt = checked_kernel_dtype(dy.scalar_type(), "moe combine");
    check_kernel_launch(kernels::moe_fan_out(dys.data_ptr(), nullptr, dy.data_ptr(), inverse.data_ptr<int64_t>(), N,
                                             k, d, dt, dt, stream_of(dy)),
                        "moe combine backward (fan-out)");
    return {dys, torch::Tensor(), torch::Tensor(), ctx->saved_data["has_add"].toBool() ? grads[0] : torch::Tensor()};
  }
};
#endif

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

std::atomic<bool> fan_allowed{true};

// The open step of moe_inputs (model/moe_dispatch.h): u itself for the router, and the experts'
// two tensors allocated for the fill. The backward sums the three gradients into u's in fp32: one
// kernel on a GPU, else ATen ops (the reference).
class MoEInputsFn : public torch::autograd::Function<MoEInputsFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& u, const torch::Tensor& inverse, int64_t k,
                               int64_t dtype, bool with_experts) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["inverse"] = inverse;  // filled by moe_inputs_fill before any backward runs
    ctx->saved_data["k"] = k;
    const auto opt = u.options().dtype(static_cast<c10::ScalarType>(dtype));
    auto experts = with_experts ? torch::empty(u.sizes(), opt) : torch::empty({0}, opt);
    return {u, experts, torch::empty({u.size(0) * k, u.size(1)}, opt)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto inverse = ctx->saved_data["inverse"].toTensor();
    const int64_t k = ctx->saved_data["k"].toInt();
    torch::Tensor g_router = grads[0], g_experts = grads[1], g_rows = grads[2];
    if (g_experts.defined() && g_experts.numel() == 0) g_experts = torch::Tensor();
    const int64_t N = inverse.size(0) / k;
#if defined(DD_HAVE_CUDA)
    if (g_rows.defined() && g_rows.is_cuda() && (!g_experts.defined() || g_experts.scalar_type() == g_rows.scalar_type()) &&
        (!g_router.defined() || g_router.scalar_type() == torch::kFloat32)) {
      auto rows = g_rows.contiguous();
      auto a = g_router.defined() ? g_router.contiguous() : torch::Tensor();
      auto b = g_experts.defined() ? g_experts.contiguous() : torch::Tensor();
      const int64_t d = rows.size(1);
      auto du = torch::empty({N, d}, rows.options().dtype(torch::kFloat32));
      check_kernel_launch(kernels::moe_fan_in(du.data_ptr(), a.defined() ? a.data_ptr() : nullptr,
                                              b.defined() ? b.data_ptr() : nullptr, rows.data_ptr(),
                                              inverse.data_ptr<int64_t>(), N, k, d, kernels::DType::F32,
                                              checked_kernel_dtype(rows.scalar_type(), "moe inputs"),
                                              stream_of(rows)),
                          "moe inputs fan-in");
      return {du, {}, {}, {}, {}};
    }
#endif
    torch::Tensor du;
    auto add = [&du](const torch::Tensor& g) { du = du.defined() ? du + g.to(torch::kFloat32) : g.to(torch::kFloat32); };
    if (g_router.defined()) add(g_router);
    if (g_experts.defined()) add(g_experts);
    if (g_rows.defined()) add(g_rows.index_select(0, inverse).view({N, k, g_rows.size(1)}).to(torch::kFloat32).sum(1));
    return {du, {}, {}, {}, {}};
  }
};

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

bool moe_inputs_fused(const torch::Tensor& u, int64_t k, c10::ScalarType dtype) {
#if defined(DD_HAVE_CUDA)
  return fan_allowed && u.is_cuda() && u.dim() == 2 && u.numel() > 0 && u.scalar_type() == torch::kFloat32 &&
         (dtype == torch::kBFloat16 || dtype == torch::kFloat16) && kernels::moe_fan_supports(k);
#else
  (void)u, (void)k, (void)dtype;
  return false;
#endif
}

void moe_inputs_fusion(bool on) { fan_allowed = on; }

MoEInputs moe_inputs_open(const torch::Tensor& u, int64_t k, c10::ScalarType dtype, bool with_experts) {
  TORCH_CHECK(u.dim() == 2 && k > 0, "moe_inputs_open: expected u [N, d] and k > 0, got ", u.sizes(), ", k = ", k);
  MoEInputs in;
  in.inverse = torch::empty({u.size(0) * k}, u.options().dtype(torch::kInt64));
  auto out = MoEInputsFn::apply(u.contiguous(), in.inverse, k, static_cast<int64_t>(dtype), with_experts);
  in.router = out[0];
  if (with_experts) in.experts = out[1];
  in.rows = out[2];
  return in;
}

void moe_inputs_fill(MoEInputs& in, const torch::Tensor& u, const ExpertOrder& o) {
  TORCH_CHECK(in.rows.defined() && o.inverse.sizes() == in.inverse.sizes() && u.dim() == 2 &&
                  in.rows.size(0) == o.inverse.size(0) && in.rows.size(1) == u.size(1),
              "moe_inputs_fill: expected u [N, d] and an order of the open step's N·k = ", in.inverse.numel(),
              " pairs, got u ", u.sizes(), " and ", o.inverse.sizes());
  // The outputs' values are written in place, outside autograd: nothing has read them yet.
  torch::NoGradGuard no_grad;
  in.inverse.copy_(o.inverse);
  auto x = u.detach().contiguous();
  const int64_t k = o.inverse.size(0) / x.size(0);
#if defined(DD_HAVE_CUDA)
  if (moe_inputs_fused(x, k, in.rows.scalar_type())) {
    check_kernel_launch(kernels::moe_fan_out(in.rows.data_ptr(), in.experts.defined() ? in.experts.data_ptr() : nullptr,
                                             x.data_ptr(), o.inverse.data_ptr<int64_t>(), x.size(0), k, x.size(1),
                                             kernels::DType::F32,
                                             checked_kernel_dtype(in.rows.scalar_type(), "moe inputs"), stream_of(x)),
                        "moe inputs fan-out");
    return;
  }
#endif
  auto cast = x.to(in.rows.scalar_type());
  if (in.experts.defined()) in.experts.detach().copy_(cast);
  in.rows.detach().copy_(cast.index_select(0, o.token));
}

torch::Tensor combine_rows(const torch::Tensor& ys, const ExpertOrder& o) {
  TORCH_CHECK(ys.dim() == 2 && ys.size(0) == o.order.size(0), "combine_rows: expected ys [", o.order.size(0),
              ", d], got ", ys.sizes());
  return PermuteRowsFn::apply(ys, o.inverse, o.order);
}

torch::Tensor combine_sum(const torch::Tensor& ys, const ExpertOrder& o, int64_t k, const torch::Tensor& add) {
  TORCH_CHECK(k > 0 && ys.dim() == 2 && ys.size(0) == o.order.size(0) && o.order.size(0) % k == 0,
              "combine_sum: expected ys [N·k, d] with N·k = ", o.order.size(0), " and k = ", k, ", got ", ys.sizes());
  const int64_t N = ys.size(0) / k;
  TORCH_CHECK(!add.defined() || (add.dim() == 2 && add.size(0) == N && add.size(1) == ys.size(1)),
              "combine_sum: expected add [", N, ", ", ys.size(1), "], got ", add.sizes());
#if defined(DD_HAVE_CUDA)
  if (combine_kernel_takes(ys, k) && (!add.defined() || (add.scalar_type() == ys.scalar_type() && add.device() == ys.device())))
    return CombineSumFn::apply(ys.contiguous(), o.inverse, k,
                               add.defined() ? add.contiguous() : torch::empty({0}, ys.options()));
#endif
  auto y = combine_rows(ys, o).view({N, k, ys.size(1)}).sum(1);
  return add.defined() ? add + y : y;
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

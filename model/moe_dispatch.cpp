#include "model/moe_dispatch.h"

#include <torch/torch.h>

namespace model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class DispatchRowsFn : public torch::autograd::Function<DispatchRowsFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& token,
                               const torch::Tensor& inverse, int64_t k) {
    ctx->saved_data["inverse"] = inverse;
    ctx->saved_data["k"] = k;
    return x.index_select(0, token);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto inverse = ctx->saved_data["inverse"].toTensor();
    const int64_t k = ctx->saved_data["k"].toInt();
    const auto& g = grads[0];  // [N·k, d] expert order
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

}  // namespace

ExpertOrder expert_order(const torch::Tensor& flat, int64_t k) {
  TORCH_CHECK(flat.dim() == 1 && flat.scalar_type() == torch::kInt64 && k > 0 && flat.size(0) % k == 0,
              "expert_order: expected int64 experts [N·k] with k = ", k, ", got ", flat.sizes(), " ",
              flat.scalar_type());
  ExpertOrder o;
  o.order = std::get<1>(torch::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  o.inverse = torch::empty_like(o.order).scatter_(0, o.order, torch::arange(flat.size(0), o.order.options()));
  o.token = o.order.div(k, "floor");
  return o;
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

}  // namespace model

#include "model/moe_router.h"

#include <torch/torch.h>

#if defined(DD_HAVE_CUDA)
#include "kernels/column_sum.h"
#include "kernels/moe_routing.h"
#include "model/kernel_dtype.h"
#endif

namespace model {
namespace {

#if defined(DD_HAVE_CUDA)
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Outputs {probs, w, idx, mean_probs}; idx carries no gradient. mean_probs comes from the forward
// kernel's per-block sums and one column sum (kernels/column_sum.h): no pass over probs, and its
// gradient reaches the backward kernel as one broadcast row.
class RouterTopKFn : public torch::autograd::Function<RouterTopKFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& logits, int64_t k, bool norm) {
    ctx->set_materialize_grads(false);  // outputs nobody reads hand back no gradient, not zeros
    auto x = logits.contiguous();
    const int64_t N = x.size(0), E = x.size(1);
    auto probs = torch::empty_like(x);
    auto w = torch::empty({N, k}, x.options());
    auto idx = torch::empty({N, k}, x.options().dtype(torch::kInt64));
    auto sums = torch::empty({kernels::moe_router_prob_sum_rows(N), E}, x.options());
    check_kernel_launch(kernels::moe_router_topk_forward(x.data_ptr<float>(), probs.data_ptr<float>(),
                                                         idx.data_ptr<int64_t>(), w.data_ptr<float>(),
                                                         sums.data_ptr<float>(), N, E, k, norm, stream_of(x)),
                        "moe router top-k forward");
    auto mean = torch::empty({E}, x.options());
    check_kernel_launch(kernels::column_sum_f32(mean.data_ptr<float>(), sums.data_ptr<float>(), sums.size(0), E,
                                                stream_of(x), 1.f / static_cast<float>(N)),
                        "moe router mean probabilities");
    ctx->mark_non_differentiable({idx});
    ctx->save_for_backward({probs, idx});
    ctx->saved_data["norm"] = norm;
    return {probs, w, idx, mean};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto sv = ctx->get_saved_variables();
    const auto &probs = sv[0], &idx = sv[1];
    const bool norm = ctx->saved_data["norm"].toBool();
    const int64_t N = probs.size(0), E = probs.size(1), k = idx.size(1);
    // dprobs: probs' own gradient, plus mean_probs' divided by N on every row. A gradient broadcast
    // over the tokens (row stride 0: mean_probs' alone, or a sum over tokens') is read as it is;
    // any other layout is made contiguous.
    torch::Tensor dprobs = grads[0].defined() ? grads[0].to(torch::kFloat32) : torch::Tensor();
    if (grads[3].defined()) {
      auto dmean = (grads[3].to(torch::kFloat32) / static_cast<double>(N)).contiguous().unsqueeze(0);  // [1, E]
      dprobs = dprobs.defined() ? dprobs + dmean : dmean.expand({N, E});
    }
    int64_t dprobs_stride = E;
    if (dprobs.defined()) {
      if (dprobs.stride(0) == 0 && dprobs.stride(1) == 1) dprobs_stride = 0;
      else dprobs = dprobs.contiguous();
    }
    torch::Tensor dw = grads[1].defined() ? grads[1].to(torch::kFloat32).contiguous() : torch::Tensor();
    auto dlogits = torch::empty_like(probs);
    check_kernel_launch(kernels::moe_router_topk_backward(
                            dlogits.data_ptr<float>(), probs.data_ptr<float>(), idx.data_ptr<int64_t>(),
                            dw.defined() ? dw.data_ptr<float>() : nullptr,
                            dprobs.defined() ? dprobs.data_ptr<float>() : nullptr, dprobs_stride, N, E, k, norm,
                            stream_of(probs)),
                        "moe router top-k backward");
    return {dlogits, torch::Tensor(), torch::Tensor()};
  }
};
#endif

}  // namespace

RouterTopK router_topk_reference(const torch::Tensor& logits, int64_t k, bool norm) {
  auto probs = torch::softmax(logits, -1);
  auto top = torch::topk(probs, k, /*dim=*/-1);
  auto w = std::get<0>(top);
  if (norm) w = w / w.sum(-1, /*keepdim=*/true);
  return {probs, std::get<1>(top), w, probs.mean(0)};
}

RouterTopK router_topk(const torch::Tensor& logits, int64_t k, bool norm) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) > 0 && k >= 1 && k <= logits.size(1),
              "moe router: expected logits [N>0, E] and 1 <= k <= E, got ", logits.sizes(), " and k = ", k);
#if defined(DD_HAVE_CUDA)
  if (logits.is_cuda() && logits.scalar_type() == torch::kFloat32 &&
      kernels::moe_router_supports(logits.size(1), k)) {
    auto out = RouterTopKFn::apply(logits, k, norm);
    return {out[0], out[2], out[1], out[3]};
  }
#endif
  return router_topk_reference(logits, k, norm);
}

}  // namespace model

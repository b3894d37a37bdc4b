#include "model/fused_embedding.h"

#include <torch/torch.h>

#include "model/mixed_linear.h"

#if defined(DD_HAVE_CUDA)
#include "kernels/embedding_backward.h"
#include "model/kernel_dtype.h"
#endif

namespace model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// grad [V, C] fp32 += Σ dy rows per token: the kernel on a GPU (stable sort, one block per token),
// index_add_ elsewhere (sequential on the CPU, so deterministic there too).
void add_embedding_grad(at::Tensor& grad, const at::Tensor& dy, const at::Tensor& tokens) {
  const int64_t C = grad.size(1);
  auto dy2 = dy.reshape({-1, C});
  auto toks = tokens.reshape({-1});
#if defined(DD_HAVE_CUDA)
  if (grad.is_cuda() && grad.scalar_type() == at::kFloat && grad.is_contiguous()) {
    if (dy2.scalar_type() != at::kFloat) dy2 = dy2.to(at::kFloat);
    if (!dy2.is_contiguous()) dy2 = dy2.contiguous();
    auto [sorted, order] = at::sort(toks, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    check_kernel_launch(kernels::embedding_backward_add(grad.data_ptr<float>(), dy2.data_ptr<float>(),
                                                        sorted.data_ptr<int64_t>(), order.data_ptr<int64_t>(),
                                                        toks.size(0), C, stream_of(grad)),
                        "embedding backward");
    return;
  }
#endif
  grad.index_add_(0, toks, dy2.to(grad.scalar_type()));
}

struct EmbeddingInPlaceFn : public torch::autograd::Function<EmbeddingInPlaceFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& tokens) {
    TORCH_CHECK(weight.dim() == 2, "embedding_in_place: weight must be [V, C], got ", weight.sizes());
    ctx->save_for_backward({tokens});
    ctx->saved_data["weight"] = weight;
    return at::embedding(weight, tokens);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto weight = ctx->saved_data["weight"].toTensor();
    if (grads[0].defined() && weight.requires_grad()) {
      at::Tensor& grad = weight.mutable_grad();
      if (!grad.defined()) grad = torch::zeros_like(weight, at::MemoryFormat::Contiguous);
      add_embedding_grad(grad, grads[0], ctx->get_saved_variables()[0]);
    }
    return {at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool embedding_in_place_applies(const at::Tensor& weight, const at::Tensor& tokens) {
  return WeightGradInPlaceScope::active() && torch::GradMode::is_enabled() && weight.defined() && weight.is_cuda() &&
         weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_leaf() && weight.requires_grad() &&
         tokens.defined() && tokens.scalar_type() == at::kLong && tokens.device() == weight.device();
}

at::Tensor embedding_in_place(const at::Tensor& weight, const at::Tensor& tokens) {
  return EmbeddingInPlaceFn::apply(weight, tokens);
}

}  // namespace model

// Reentrant checkpointing: the forward keeps only x; the backward recomputes fn(x) with grad on
// and back-propagates through that fresh graph, which also accumulates the parameters' grads.
#include "model/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace model {

namespace {

struct FnHolder : torch::CustomClassHolder {
  CheckpointedFn fn;
  bool autocast_on = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                                c10::intrusive_ptr<FnHolder> holder) {
    ctx->save_for_backward({x});
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    torch::NoGradGuard no_grad;
    return holder->fn(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    std::vector<torch::Tensor> outs;
    {
      torch::AutoGradMode grad_on(true);
      // Recompute under the autocast state of the original forward so the graph matches it.
      const bool was_on = at::autocast::is_autocast_enabled(at::kCUDA);
      const auto was_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
      at::autocast::set_autocast_enabled(at::kCUDA, holder->autocast_on);
      at::autocast::set_autocast_dtype(at::kCUDA, holder->autocast_dtype);
      try {
        outs = holder->fn(x);
      } catch (...) {
        at::autocast::set_autocast_enabled(at::kCUDA, was_on);
        at::autocast::set_autocast_dtype(at::kCUDA, was_dtype);
        throw;
      }
      at::autocast::set_autocast_enabled(at::kCUDA, was_on);
      at::autocast::set_autocast_dtype(at::kCUDA, was_dtype);
    }
    std::vector<torch::Tensor> roots, root_grads;
    for (size_t i = 0; i < outs.size() && i < grads.size(); ++i) {
      if (grads[i].defined() && outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

std::vector<torch::Tensor> run_checkpointed(const CheckpointedFn& fn, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return fn(x);
  auto holder = c10::make_intrusive<FnHolder>();
  holder->fn = fn;
  holder->autocast_on = at::autocast::is_autocast_enabled(at::kCUDA);
  holder->autocast_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  return CheckpointFunction::apply(x, holder);
}

}  // namespace model

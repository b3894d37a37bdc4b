// Reentrant checkpointing: the forward keeps only x; the backward recomputes fn(x) with grad on
// and back-propagates through that fresh graph, which also accumulates the parameters' grads.
#include "model/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "model/linear.h"

namespace model {

namespace {

// The precision settings a forward ran under: autocast per device type and the FP8 linear mode.
// The backward runs on the autograd engine's threads, so the recompute re-applies them.
struct PrecisionState {
  bool cuda_on = false, cpu_on = false, fp8 = false;
  at::ScalarType cuda_dtype = at::kBFloat16, cpu_dtype = at::kBFloat16;

  static PrecisionState current() {
    PrecisionState s;
    s.cuda_on = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    s.cpu_on = at::autocast::is_autocast_enabled(at::kCPU);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.fp8 = Fp8Scope::active();
    return s;
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_on);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_enabled(at::kCPU, cpu_on);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
  }
};

// Applies a PrecisionState for a scope and restores the previous one, also on exceptions.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(const PrecisionState& s) : saved_(PrecisionState::current()), fp8_(s.fp8) { s.apply(); }
  ~PrecisionGuard() { saved_.apply(); }

 private:
  PrecisionState saved_;
  Fp8Scope fp8_;
};

struct FnHolder : torch::CustomClassHolder {
  CheckpointedFn fn;
  PrecisionState precision;
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
      // Recompute under the precision of the original forward so the graph matches it.
      PrecisionGuard precision(holder->precision);
      outs = holder->fn(x);
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
  holder->precision = PrecisionState::current();
  return CheckpointFunction::apply(x, holder);
}

}  // namespace model

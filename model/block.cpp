// Block dispatch: the mixer letter picks one of three modules at construction, so forward is a
// switch and not a virtual call through a type-erased holder (LibTorch modules are held by value).
#include "model/block.h"

#include <torch/torch.h>

#include <stdexcept>

#include "model/activation_checkpoint.h"

namespace model {

BlockImpl::BlockImpl(const ModelConfig& c, int64_t layer)
    : mixer_(mixer_at(c, layer)), checkpoint_(c.activation_checkpointing) {
  norm1 = register_module("norm1", RMSNorm(c.d, c.norm_affine));
  switch (mixer_) {
    case 'S': attn = register_module("attn", Attention(c)); break;
    case 'G': gdn = register_module("gdn", GatedDeltaNet(c)); break;
    case 'A': mla = register_module("mla", MLA(c)); break;
    default:
      throw std::invalid_argument(std::string("model.pattern: unknown mixer '") + mixer_ + "' (use G, A or S)");
  }
  norm2 = register_module("norm2", RMSNorm(c.d, c.norm_affine));
  if (c.moe_experts > 0) moe = register_module("moe", MoE(c));
  else ffn = register_module("ffn", SwiGLU(c.d, c.ffn_hidden));
}

torch::Tensor BlockImpl::mix(const torch::Tensor& u, const Positions& p) {
  switch (mixer_) {
    case 'S': return attn(u, p);
    case 'G': return gdn(u, p);
    default: return mla(u, p);
  }
}

BlockOutput BlockImpl::forward_plain(const torch::Tensor& x, const torch::Tensor& branch, const Positions& p) {
  // Norms whose output is read only by matmuls (every mixer's input projections, SwiGLU's fused
  // gate|up) emit it in the matmul's dtype: autocast would round it to that dtype for each matmul
  // anyway, and the casts and their fp32 gradients go away. MoE's router reads norm2's output in
  // fp32, so that one keeps it.
  auto n1 = norm1->add_forward(x, branch, /*for_matmul=*/true);
  auto n2 = norm2->add_forward(n1.h, mix(n1.y, p), /*for_matmul=*/!moe);
  if (moe) {
    auto r = moe(n2.y);
    return {n2.h, r.y, r.aux_loss};
  }
  return {n2.h, ffn(n2.y), {}};
}

BlockOutput BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& branch, const Positions& p) {
  if (!checkpoint_ || !is_training()) return forward_plain(x, branch, p);
  // Positions are captured by value: the recompute runs after this call has returned.
  auto outs = run_checkpointed(
      [this, p](const torch::Tensor& xin) {
        auto r = forward_plain(xin, {}, p);
        auto out = r.x + r.branch;
        return r.aux_loss.defined() ? std::vector<torch::Tensor>{out, r.aux_loss} : std::vector<torch::Tensor>{out};
      },
      branch.defined() ? x + branch : x);
  return {outs[0], {}, outs.size() > 1 ? outs[1] : torch::Tensor()};
}

torch::Tensor BlockImpl::step(const torch::Tensor& x, MixerCache& cache) {
  auto u = norm1(x);
  torch::Tensor m;
  switch (mixer_) {
    case 'S': m = attn->step(u, cache); break;
    case 'G': m = gdn->step(u, cache); break;
    default: m = mla->step(u, cache); break;
  }
  auto h = x + m;
  return h + (moe ? moe(norm2(h)).y : ffn(norm2(h)));
}

void BlockImpl::reset_parameters(double std0, double std_out) {
  torch::NoGradGuard no_grad;
  for (auto* n : {&norm1, &norm2})
    if ((*n)->weight.defined()) (*n)->weight.fill_(1.0);
  if (attn) attn->reset_parameters(std0, std_out);
  if (gdn) gdn->reset_parameters(std0, std_out);
  if (mla) mla->reset_parameters(std0, std_out);
  if (ffn) ffn->reset_parameters(std0, std_out);
  if (moe) moe->reset_parameters(std0, std_out);
}

}  // namespace model

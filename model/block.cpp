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

BlockOutput BlockImpl::forward_plain(const torch::Tensor& x, const Positions& p) {
  auto h = x + mix(norm1(x), p);
  if (moe) {
    auto r = moe(norm2(h));
    return {h + r.y, r.aux_loss};
  }
  return {h + ffn(norm2(h)), {}};
}

BlockOutput BlockImpl::forward(const torch::Tensor& x, const Positions& p) {
  if (!checkpoint_ || !is_training()) return forward_plain(x, p);
  // Positions are captured by value: the recompute runs after this call has returned.
  auto outs = run_checkpointed(
      [this, p](const torch::Tensor& xin) {
        auto r = forward_plain(xin, p);
        return r.aux_loss.defined() ? std::vector<torch::Tensor>{r.x, r.aux_loss} : std::vector<torch::Tensor>{r.x};
      },
      x);
  return {outs[0], outs.size() > 1 ? outs[1] : torch::Tensor()};
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

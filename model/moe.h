// Dropless MoE feed-forward (MODEL.md §3 "MoE"): fp32 softmax router, top-k, optional top-k
// renormalisation, routed SwiGLU experts stacked as [E,...] tensors, an optional shared SwiGLU
// expert and the Switch/DeepSeek balance loss α Σ f_e P_e. forward() is the fast dispatch (tokens
// sorted by expert, one contiguous slice per expert); forward_reference() is the index_add loop
// it is tested against. Both share route(), so they agree on the experts chosen.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include "model/layers.h"
#include "model/model_config.h"

namespace model {

struct MoEOutput {
  torch::Tensor y;         // like u
  torch::Tensor aux_loss;  // scalar α Σ_e f_e P_e, fp32 (fp64 when u is fp64)
};

struct MoERouting {
  torch::Tensor probs;     // [N,E] softmax of the router logits, fp32 (fp64 for fp64 u)
  torch::Tensor topk_idx;  // [N,k] int64, k distinct experts per token
  torch::Tensor topk_w;    // [N,k] γ, renormalised to sum 1 when norm_topk; dtype of probs
  torch::Tensor mean_probs;  // [E] probs averaged over the tokens (the aux loss's P); dtype of probs
};

class MoEImpl : public torch::nn::Module {
 public:
  // Parameters are drawn by reset_parameters(c.init_std, c.init_std / sqrt(2L)).
  explicit MoEImpl(const ModelConfig& c);

  // u [..., d] -> y like u, plus the aux loss over the flattened tokens. Fast dispatch: no host
  // sync in bf16 on sm90/sm100 (grouped_linear_offsets), else one device-to-host copy of the
  // per-expert token counts per call. Fails (TORCH_CHECK) on a wrong width.
  MoEOutput forward(const torch::Tensor& u);
  // MODEL.md §3 reference: for each expert, index_add γ·SwiGLU_e(u[idx]) into y[idx].
  MoEOutput forward_reference(const torch::Tensor& u);
  // Router for flattened tokens u2 [N,d]; runs in fp32 with autocast off.
  MoERouting route(const torch::Tensor& u2);
  // α Σ_e f_e P_e with f_e = E/(kN)·#{t: e ∈ I_t} (no gradient) and P_e = mean_t probs[t,e].
  torch::Tensor aux_loss(const MoERouting& r) const;
  // The same from the assignments per expert [E] (int64), when the caller has them.
  torch::Tensor aux_loss(const MoERouting& r, const torch::Tensor& counts_per_expert) const;
  // Whether forward() keeps the expert counts on the device (no host sync) for experts running in
  // `dtype` on `device`: both grouped products take device offsets (model/grouped_linear.h).
  static bool counts_stay_on_device(const ModelConfig& c, const c10::Device& device, c10::ScalarType dtype);
  // router, gate, up, shared gate/up N(0,std0); down and shared down N(0,std_out).
  void reset_parameters(double std0, double std_out);

  torch::Tensor router;  // [E,d]
  torch::Tensor gate;    // [E,fe,d]
  torch::Tensor up;      // [E,fe,d]
  torch::Tensor down;    // [E,d,fe]
  SwiGLU shared{nullptr};  // width fs; null when fs == 0

 private:
  int64_t d_, E_, k_, fe_;
  bool norm_topk_;
  double alpha_;
};
TORCH_MODULE(MoE);

// Where forward() applies the router weights γ: on, inside the experts' SwiGLU (each expert row's
// activation scaled by its γ, model/fused_swiglu.h), so the combine is a plain sum whose backward
// is a gather of dy and never reads the experts' outputs again; off, in the combine (γ · ys summed,
// whose backward reads ys for dγ). On by default; process-wide, any thread (`bench train
// --moe-weights swiglu|combine`, to measure the change).
void moe_router_weights_in_swiglu(bool on);

}  // namespace model

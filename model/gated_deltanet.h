// The Gated DeltaNet mixer, the hybrid's G layer (MODEL.md §4): q/k/v projections through a
// depthwise causal short conv (+SiLU), L2-normed q/k, gates β = σ(u W_bᵀ) and
// g = −e^{A_log} softplus(u W_aᵀ + dt_bias), the gated delta rule core (model/gdr.h), then a
// per-head RMSNorm gated by silu(u W_gᵀ) and the output projection. Gate math, L2Norm, the core and
// the gated norm run in fp32 (fp64 when the input is fp64); the projections in the input dtype.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>

#include "model/linear.h"
#include "model/layers.h"
#include "model/model_config.h"

namespace model {

struct GdrOutput;  // model/gdr.h

// silu(depthwise causal conv) over x [B,T,C] with taps w [C,W] (w[:,W-1] multiplies the current
// token). Taps never reach before the start of a row or, for packed rows (p.varlen()), of the
// token's document. Returns [B,T,C] in x's dtype (w is cast to it if needed).
// Any thread; bad shapes throw c10::Error.
torch::Tensor short_conv(const torch::Tensor& x, const torch::Tensor& w, const Positions& p);

class GatedDeltaNetImpl : public torch::nn::Module {
 public:
  // Parameters are drawn by reset_parameters(c.init_std, c.init_std / sqrt(2L)).
  explicit GatedDeltaNetImpl(const ModelConfig& c);

  // u [B,T,d] (normed block input) -> [B,T,d]. Dense or packed (B=1, p.cu_seqlens) batches.
  // Any thread that owns the module; fails (TORCH_CHECK) on a wrong width or a varlen B != 1.
  torch::Tensor forward(const torch::Tensor& u, const Positions& p);
  // One decoding step: u [B,1,d] -> [B,1,d]. Reads and replaces cache.conv_q/k/v
  // [B,W-1,channels] (pre-conv inputs), cache.state [B,H,dk,dv] (fp32, fp64 for fp64 input) and
  // advances cache.pos; an empty cache starts a sequence. Fails (TORCH_CHECK) unless u has one token.
  torch::Tensor step(const torch::Tensor& u, MixerCache& cache);
  // MODEL.md §7 + §4: Linears N(0,std0), wo N(0,std_out), A = U(0,16] → A_log = ln A,
  // softplus(dt_bias) = dt log-uniform in [1e-3,0.1], conv taps U(±1/√W), norm_w = 1.
  // Caller's thread; no failure mode.
  void reset_parameters(double std0, double std_out);

  // Route forward through gdr_forward_ref instead of the chunked core (tests, benchmarks).
  bool use_reference = false;

  Linear wq{nullptr}, wk{nullptr};  // [Kg,d]
  Linear wv{nullptr}, wg{nullptr};  // [Vg,d]
  Linear wa{nullptr}, wb{nullptr};  // [H,d]
  Linear wo{nullptr};               // [d,Vg]
  torch::Tensor A_log;    // [H]
  torch::Tensor dt_bias;  // [H]
  torch::Tensor conv_q;   // [Kg,W]
  torch::Tensor conv_k;   // [Kg,W]
  torch::Tensor conv_v;   // [Vg,W]
  torch::Tensor norm_w;   // [dv] gated-norm weight shared by all heads

 private:
  // Gated RMSNorm and output projection: the delta rule's output (o [B,T,H,dv] in the compute
  // dtype, or its rows by index) and the gate projection z = u W_gᵀ [B,T,Vg] -> [B,T,d] in `out_dtype`.
  torch::Tensor output(const GdrOutput& r, const torch::Tensor& z, torch::ScalarType out_dtype);

  int64_t d_, H_, dk_, dv_, W_, chunk_;
  bool neg_eig_;
  std::string scan_precision_;  // model.gdn_scan_precision (model/gdr.h: gdr_scan_uses_tf32)
  double scale_;
};
TORCH_MODULE(GatedDeltaNet);

}  // namespace model

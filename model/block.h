// Block: one pre-norm residual layer of MODEL.md §2 — x + Mixer(RMSNorm(x)), then
// x + FFN(RMSNorm(x)). The mixer is G (Gated DeltaNet), A (MLA) or S (GPT attention) by the
// layer's letter of the pattern; the FFN is SwiGLU, or MoE when moe_experts > 0. Exactly one
// mixer holder and one FFN holder are non-null, so a block's parameter names say what it is
// (blocks.3.gdn.*, blocks.2.mla.*, blocks.0.attn.*, *.ffn.* / *.moe.*).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include "model/gated_deltanet.h"
#include "model/layers.h"
#include "model/mla.h"
#include "model/model_config.h"
#include "model/moe.h"

namespace model {

struct BlockOutput {
  torch::Tensor x;         // [B,T,d] residual stream
  // [B,T,d] the FFN's output, not yet added to x: the next norm adds it in its fused kernel
  // (x + branch is the block's output). Undefined when x is already the whole output.
  torch::Tensor branch;
  torch::Tensor aux_loss;  // scalar fp32 MoE load-balancing loss; undefined without MoE
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& c, int64_t layer);
  // The block's input is x + branch (branch: the previous block's unadded FFN output, or
  // undefined). With activation_checkpointing the block's activations are recomputed in backward
  // and the output comes whole (branch undefined).
  BlockOutput forward(const torch::Tensor& x, const torch::Tensor& branch, const Positions& p);
  // One decoding step: x [B,1,d] at position cache.pos; the mixer appends to its cache.
  torch::Tensor step(const torch::Tensor& x, MixerCache& cache);
  // MODEL.md §7 for every sub-module; norm weights 1.
  void reset_parameters(double std0, double std_out);
  char mixer_kind() const { return mixer_; }

  RMSNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};    // S
  GatedDeltaNet gdn{nullptr}; // G
  MLA mla{nullptr};           // A
  SwiGLU ffn{nullptr};        // moe_experts == 0
  MoE moe{nullptr};           // moe_experts > 0

 private:
  BlockOutput forward_plain(const torch::Tensor& x, const torch::Tensor& branch, const Positions& p);
  torch::Tensor mix(const torch::Tensor& u, const Positions& p);
  char mixer_;
  bool checkpoint_;
};
TORCH_MODULE(Block);

}  // namespace model

// DecoderLM: the pre-norm decoder stack of MODEL.md §2 with one mixer per layer chosen by the
// pattern. The GPT baseline is the pattern "S"; the hybrid's G and A mixers (issue 3) plug into
// the same Block. Parameters are created fp32 (master weights) and initialised per §7.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/types.h>

#include "model/layers.h"
#include "model/model_config.h"

namespace model {

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& c, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const Positions& p);  // x [B,T,d]
  RMSNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  SwiGLU ffn{nullptr};
};
TORCH_MODULE(Block);

class DecoderLMImpl : public torch::nn::Module {
 public:
  // Throws std::invalid_argument when the config does not validate or uses a mixer/FFN this
  // build does not have yet.
  explicit DecoderLMImpl(const ModelConfig& c);

  // tokens [B,T] int64 -> logits [B,T,V] (fp32 when the head runs in fp32).
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross-entropy over targets != -1. targets [B,T] int64.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  const ModelConfig& config() const { return cfg_; }
  // (Re)draws every parameter per MODEL.md §7 from torch's current default generator.
  void init_weights();

  torch::nn::Embedding emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm norm_f{nullptr};
  torch::Tensor lm_head;  // [V,d]; undefined when tied to emb

 private:
  ModelConfig cfg_;
};
TORCH_MODULE(DecoderLM);

}  // namespace model

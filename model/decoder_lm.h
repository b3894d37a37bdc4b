// DecoderLM: the decoder stack of MODEL.md §2 — embedding, L pre-norm blocks whose mixer follows
// the pattern (the GPT baseline is "S", the hybrid "GGA"), final norm, tied or untied head,
// optional softcap. Parameters are created fp32 (master weights) and initialised per §7.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/types.h>

#include <vector>

#include "model/block.h"
#include "model/layers.h"
#include "model/model_config.h"

namespace model {

struct LMOutput {
  torch::Tensor logits;    // [B,T,V] fp32 (fp64 when the model runs in fp64)
  torch::Tensor aux_loss;  // scalar: Σ of the MoE layers' load-balancing losses (0 without MoE)
};

struct LossParts {
  torch::Tensor total;  // ce + aux: what backward() is called on
  torch::Tensor ce;     // mean cross-entropy over targets != -1
  torch::Tensor aux;    // MoE load-balancing loss (0 without MoE)
};

// Decoding state of the whole stack: one cache per layer (GDN state + conv tails, MLA latents,
// or attention K/V) and the number of tokens consumed.
struct DecodeState {
  std::vector<MixerCache> layers;
};

class DecoderLMImpl : public torch::nn::Module {
 public:
  // Throws std::invalid_argument naming the config key when the config does not validate.
  explicit DecoderLMImpl(const ModelConfig& c);

  // Dense batch: tokens [B,T] int64 -> logits [B,T,V].
  torch::Tensor forward(const torch::Tensor& tokens);
  // Packed batch: tokens [B,T], cu_seqlens (int32 or int64) over the flattened B*T tokens, cutting
  // at every row end; no information crosses documents.
  torch::Tensor forward_packed(const torch::Tensor& tokens, const torch::Tensor& cu_seqlens);
  // Logits and the summed MoE aux loss at the given positions.
  LMOutput forward_with_aux(const torch::Tensor& tokens, const Positions& p);

  // Cross-entropy (fp32) + aux. cu_seqlens undefined for dense [B,T] batches.
  LossParts loss_parts(const torch::Tensor& tokens, const torch::Tensor& targets,
                       const torch::Tensor& cu_seqlens = {});
  // The same at positions built by the caller (a captured CUDA-graph step keeps them in fixed
  // device tensors, see trainer/step_graph.h).
  LossParts loss_parts_at(const torch::Tensor& tokens, const torch::Tensor& targets, const Positions& p);
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  // Token-by-token decoding: tokens [B,1] -> logits [B,1,V]; each layer's cache grows by one
  // token (GDN layers keep a constant-size state). Call under NoGradGuard.
  DecodeState new_decode_state() const;
  torch::Tensor step(const torch::Tensor& tokens, DecodeState& state);

  const ModelConfig& config() const { return cfg_; }
  // (Re)draws every parameter per MODEL.md §7 from torch's current default generator.
  void init_weights();

  torch::nn::Embedding emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm norm_f{nullptr};
  torch::Tensor lm_head;  // [V,d]; undefined when tied to emb

 private:
  struct Hidden {
    torch::Tensor normed;  // [B,T,d] the final norm's output, in the head matmul's dtype
    torch::Tensor aux;     // summed MoE aux loss (0 without MoE)
  };
  Hidden hidden(const torch::Tensor& tokens, const Positions& p);
  torch::Tensor head(const torch::Tensor& normed);  // LM head and softcap over the final norm's output
  ModelConfig cfg_;
};
TORCH_MODULE(DecoderLM);

}  // namespace model

// ModelConfig: every size and switch of the GPT baseline and the hybrid DeltaNet-MLA model
// (../shared/docs/MODEL.md §1), as a plain struct with no torch in it so the config parser,
// the UI and the storage layer can see it. Presets are functions; accounting (parameter count,
// FLOPs per token) follows MODEL.md §9-§10 exactly and is tested against the modules' Σ numel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace model {

enum class Family { Gpt, Hybrid };

struct ModelConfig {
  Family family = Family::Gpt;
  std::string preset = "tiny";

  int64_t vocab_size = 4096;  // V
  int64_t d = 128;            // model width
  int64_t n_layers = 6;       // L
  std::string pattern = "S";  // mixer letters applied cyclically: G (Gated DeltaNet), A (MLA), S (attention)
  bool tie_embeddings = true;
  bool norm_affine = true;
  bool embed_norm = false;
  double logit_softcap = 0.0;
  // The LM head and the loss run fused, in chunks of this many tokens (0: as many as fit 256 MiB of
  // fp32 logits), so the batch's logits never exist at once; -1: the plain head (whole logits, then
  // cross_entropy), kept for comparison.
  int64_t loss_chunk_tokens = 0;
  double rope_theta = 10000.0;
  double init_std = 0.02;

  // S: GPT attention mixer.
  int64_t attn_heads = 4;     // nh
  int64_t attn_kv_heads = 2;  // nkv (GQA)
  int64_t attn_head_dim = 32; // dh
  bool qk_norm = true;

  // G: Gated DeltaNet mixer.
  int64_t gdn_heads = 2;      // H
  int64_t gdn_dk = 64;
  int64_t gdn_dv = 128;
  int64_t gdn_conv = 4;       // W
  int64_t gdn_chunk = 64;     // C
  bool gdn_neg_eig = false;
  // The state scan's tensor-core products on a GPU: "tf32" (one TF32 product, about 2⁻¹¹ relative
  // error each), "fp32" (split TF32, close to fp32) or "auto" (tf32 when the matmuls run in bf16,
  // fp16 or fp8; fp32 otherwise). The state itself is fp32 either way (MODEL.md §0).
  std::string gdn_scan_precision = "auto";

  // A: Multi-head Latent Attention mixer.
  int64_t mla_heads = 4;      // nh
  int64_t mla_q_rank = 64;    // rq (0: no q compression)
  int64_t mla_kv_rank = 64;   // rkv
  int64_t mla_nope_dim = 32;  // dn
  int64_t mla_rope_dim = 16;  // dr
  int64_t mla_v_dim = 32;     // dva

  // FFN: SwiGLU width, or MoE when moe_experts > 0.
  int64_t ffn_hidden = 384;   // f
  int64_t moe_experts = 0;    // E
  int64_t moe_top_k = 2;      // k
  int64_t moe_expert_hidden = 128; // fe
  int64_t moe_shared_hidden = 0;   // fs
  bool moe_norm_topk = true;
  double moe_aux_coef = 0.01; // α

  int64_t max_seq_len = 256;  // T the model is trained with (FLOPs accounting, RoPE table size)

  // Recompute each block's activations in the backward pass instead of keeping them: less
  // activation memory for about one more forward pass of compute. No effect on the math.
  bool activation_checkpointing = false;
};

const char* family_name(Family f);
std::optional<Family> family_from_name(const std::string& name);

// The preset names MODEL.md §8 defines, in table order.
const std::vector<std::string>& preset_names();
// A preset of MODEL.md §8 for the given family; nullopt for an unknown name.
std::optional<ModelConfig> make_preset(const std::string& name, Family family);

// MODEL.md §9. Total and active (used per token) parameter counts.
int64_t count_params(const ModelConfig& c);
int64_t count_active_params(const ModelConfig& c);
// MODEL.md §9 per-module counts, so module tests can compare one layer's Σ numel: the mixer
// `mixer` ('G', 'A' or 'S'; 0 for anything else) and one FFN (P_MoE when moe_experts > 0).
int64_t params_mixer(const ModelConfig& c, char mixer);
int64_t params_ffn(const ModelConfig& c);
// MODEL.md §10: training FLOPs per token (fwd + bwd) with context T = c.max_seq_len.
int64_t flops_per_token(const ModelConfig& c);
// Estimated bytes of activations a training step keeps for the backward pass, per token, with
// activations in bf16 (2 bytes) and the tensors MODEL.md §0 keeps in fp32 (GDN chunk states,
// router probabilities, logits) at 4 bytes. Counts the block inputs, norms, projections, mixer
// internals and FFN hidden states of our modules; with activation_checkpointing only the block
// inputs plus one block's internals. An estimate for sizing batches, not a measurement.
int64_t activation_bytes_per_token(const ModelConfig& c);
// Which mixer layer l uses: 'G', 'A' or 'S'.
char mixer_at(const ModelConfig& c, int64_t layer);

// Problems with the sizes, each "model.<key>: ..." (empty when valid).
std::vector<std::string> validate(const ModelConfig& c);

}  // namespace model

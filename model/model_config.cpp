// ModelConfig presets (MODEL.md §8), parameter and FLOPs accounting (§9, §10) and validation.
// The accounting transcribes the spec's formulas term by term rather than summing a per-layer
// parameter list: tests pin these numbers to the §8 table, and the LibTorch modules' Σ numel is
// tested against them, so a "simplified" formula here would hide a module that drifted.
#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

namespace model {

const char* family_name(Family f) {
  switch (f) {
    case Family::Gpt: return "gpt";
    case Family::Hybrid: return "hybrid";
  }
  return "?";
}

std::optional<Family> family_from_name(const std::string& name) {
  if (name == "gpt") return Family::Gpt;
  if (name == "hybrid") return Family::Hybrid;
  return std::nullopt;
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"tiny", "tiny-moe", "small", "base", "moe-1b"};
  return names;
}

namespace {

// One row of the §8 table: the sizes that differ between presets. Everything else (W=4, C=64,
// θ=1e4, norm/QK/top-k switches, α, σ₀, tied embeddings) is the ModelConfig default.
struct PresetRow {
  const char* name;
  int64_t V, d, L, T;
  int64_t gdn_H, gdn_dk;                          // dv = 2·dk
  int64_t mla_nh, mla_rq, mla_rkv, mla_dn, mla_dr, mla_dva;
  int64_t f, E, k, fe, fs;                        // E = 0: dense SwiGLU of width f
  int64_t attn_nh, attn_nkv, attn_dh;
};

// moe-1b has no dense width in the table; its f is k·fe + fs (the routed-plus-shared width one
// token sees), so switching it to dense via moe_experts=0 gives a comparable-compute baseline.
constexpr PresetRow PRESETS[] = {
    {"tiny", 4096, 128, 6, 256, 2, 64, 4, 64, 64, 32, 16, 32, 384, 0, 2, 128, 0, 4, 2, 32},
    {"tiny-moe", 4096, 128, 6, 256, 2, 64, 4, 64, 64, 32, 16, 32, 384, 8, 2, 128, 128, 4, 2, 32},
    {"small", 32768, 384, 6, 2048, 3, 96, 6, 0, 128, 64, 32, 64, 1024, 0, 2, 128, 0, 6, 6, 64},
    {"base", 32768, 768, 12, 2048, 6, 96, 12, 384, 256, 64, 32, 64, 2304, 0, 2, 128, 0, 12, 12, 64},
    {"moe-1b", 32768, 1024, 18, 2048, 6, 128, 16, 512, 256, 64, 32, 64, 2048, 64, 6, 256, 512, 16, 4, 64},
};

}  // namespace

std::optional<ModelConfig> make_preset(const std::string& name, Family family) {
  for (const PresetRow& r : PRESETS) {
    if (name != r.name) continue;
    ModelConfig c;
    c.family = family;
    c.preset = r.name;
    c.vocab_size = r.V;
    c.d = r.d;
    c.n_layers = r.L;
    c.max_seq_len = r.T;
    c.pattern = family == Family::Hybrid ? "GGA" : "S";
    c.tie_embeddings = true;
    c.norm_affine = true;
    c.embed_norm = false;
    c.logit_softcap = 0.0;
    c.rope_theta = 1e4;
    c.init_std = 0.02;

    c.attn_heads = r.attn_nh;
    c.attn_kv_heads = r.attn_nkv;
    c.attn_head_dim = r.attn_dh;
    c.qk_norm = true;

    c.gdn_heads = r.gdn_H;
    c.gdn_dk = r.gdn_dk;
    c.gdn_dv = 2 * r.gdn_dk;
    c.gdn_conv = 4;
    c.gdn_chunk = 64;
    c.gdn_neg_eig = false;

    c.mla_heads = r.mla_nh;
    c.mla_q_rank = r.mla_rq;
    c.mla_kv_rank = r.mla_rkv;
    c.mla_nope_dim = r.mla_dn;
    c.mla_rope_dim = r.mla_dr;
    c.mla_v_dim = r.mla_dva;

    c.ffn_hidden = r.f;
    c.moe_experts = r.E;
    c.moe_top_k = r.k;
    c.moe_expert_hidden = r.fe;
    c.moe_shared_hidden = r.fs;
    c.moe_norm_topk = true;
    c.moe_aux_coef = 0.01;
    return c;
  }
  return std::nullopt;
}

char mixer_at(const ModelConfig& c, int64_t layer) {
  if (c.pattern.empty()) return 'S';
  return c.pattern[static_cast<size_t>(layer % static_cast<int64_t>(c.pattern.size()))];
}

namespace {

int64_t params_g(const ModelConfig& c) {
  const int64_t d = c.d, H = c.gdn_heads, W = c.gdn_conv, dv = c.gdn_dv;
  const int64_t Kg = H * c.gdn_dk, Vg = H * dv;
  return d * (2 * Kg + 3 * Vg) + 2 * d * H + 2 * H + W * (2 * Kg + Vg) + dv;
}

int64_t params_a(const ModelConfig& c) {
  const int64_t d = c.d, nh = c.mla_heads, rq = c.mla_q_rank, rkv = c.mla_kv_rank;
  const int64_t dn = c.mla_nope_dim, dr = c.mla_rope_dim, dva = c.mla_v_dim;
  const int64_t dqk = dn + dr;
  const int64_t q = rq > 0 ? d * rq + rq + rq * nh * dqk : d * nh * dqk;
  return q + d * (rkv + dr) + rkv + rkv * nh * (dn + dva) + nh * dva * d;
}

int64_t params_s(const ModelConfig& c) {
  const int64_t d = c.d, nh = c.attn_heads, nkv = c.attn_kv_heads, dh = c.attn_head_dim;
  return d * dh * (nh + 2 * nkv) + nh * dh * d;
}

int64_t flops_g(const ModelConfig& c) {
  const int64_t d = c.d, H = c.gdn_heads, W = c.gdn_conv, C = c.gdn_chunk;
  const int64_t dk = c.gdn_dk, dv = c.gdn_dv, Kg = H * dk, Vg = H * dv;
  const int64_t proj = 6 * (d * (2 * Kg + 3 * Vg) + 2 * d * H + W * (2 * Kg + Vg));
  const int64_t core = 3 * H * (2 * C * (3 * dk + 2 * dv) + 6 * dk * dv);
  return proj + core;
}

int64_t flops_a(const ModelConfig& c) {
  const int64_t T = c.max_seq_len, nh = c.mla_heads;
  const int64_t dqk = c.mla_nope_dim + c.mla_rope_dim;
  // The norm weights w_qn [rq] and w_kvn [rkv] are parameters but no matmul; rq is 0 without q-LoRA.
  const int64_t matmul_params = params_a(c) - (c.mla_q_rank > 0 ? c.mla_q_rank : 0) - c.mla_kv_rank;
  return 6 * matmul_params + 6 * nh * (dqk + c.mla_v_dim) * T;
}

int64_t flops_s(const ModelConfig& c) {
  return 6 * params_s(c) + 12 * c.attn_heads * c.attn_head_dim * c.max_seq_len;
}

int64_t flops_ffn(const ModelConfig& c) {
  if (c.moe_experts > 0) {
    return 6 * c.d * c.moe_experts +
           18 * c.d * (c.moe_top_k * c.moe_expert_hidden + c.moe_shared_hidden);
  }
  return 18 * c.d * c.ffn_hidden;
}

}  // namespace

int64_t params_mixer(const ModelConfig& c, char mixer) {
  switch (mixer) {
    case 'G': return params_g(c);
    case 'A': return params_a(c);
    case 'S': return params_s(c);
  }
  return 0;
}

int64_t params_ffn(const ModelConfig& c) {
  if (c.moe_experts > 0) {
    const int64_t E = c.moe_experts;
    return E * c.d + 3 * c.d * (E * c.moe_expert_hidden + c.moe_shared_hidden);
  }
  return 3 * c.d * c.ffn_hidden;
}

int64_t count_params(const ModelConfig& c) {
  const int64_t d = c.d, L = c.n_layers;
  int64_t total = c.vocab_size * d * (c.tie_embeddings ? 1 : 2);
  if (c.norm_affine) total += d * (2 * L + 1);
  const int64_t ffn = params_ffn(c);
  for (int64_t l = 0; l < L; ++l) total += params_mixer(c, mixer_at(c, l)) + ffn;
  return total;
}

int64_t count_active_params(const ModelConfig& c) {
  const int64_t total = count_params(c);
  if (c.moe_experts <= 0) return total;
  // Every layer is MoE when moe_experts > 0, so L_moe = L.
  return total - c.n_layers * 3 * c.d * (c.moe_experts - c.moe_top_k) * c.moe_expert_hidden;
}

int64_t flops_per_token(const ModelConfig& c) {
  int64_t f = 6 * c.d * c.vocab_size;
  const int64_t ffn = flops_ffn(c);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    switch (mixer_at(c, l)) {
      case 'G': f += flops_g(c); break;
      case 'A': f += flops_a(c); break;
      case 'S': f += flops_s(c); break;
      default: break;
    }
    f += ffn;
  }
  return f;
}

namespace {

// Appends "model.<key>: must be >= <min> (got <v>)" when v < min.
void check_min(std::vector<std::string>& out, const char* key, int64_t v, int64_t min) {
  if (v >= min) return;
  std::ostringstream s;
  s << "model." << key << ": must be >= " << min << " (got " << v << ")";
  out.push_back(s.str());
}

void check_even(std::vector<std::string>& out, const char* key, int64_t v, const char* why) {
  if (v % 2 == 0) return;
  std::ostringstream s;
  s << "model." << key << ": must be even, " << why << " (got " << v << ")";
  out.push_back(s.str());
}

// inf and nan are TOML floats too; either one here would make every step's loss nan.
void check_positive(std::vector<std::string>& out, const char* key, double v) {
  if (v > 0 && std::isfinite(v)) return;
  std::ostringstream s;
  s << "model." << key << ": must be a finite number > 0 (got " << v << ")";
  out.push_back(s.str());
}

void check_finite_min0(std::vector<std::string>& out, const char* key, double v, const char* zero_means) {
  if (v >= 0 && std::isfinite(v)) return;
  std::ostringstream s;
  s << "model." << key << ": must be a finite number >= 0" << zero_means << " (got " << v << ")";
  out.push_back(s.str());
}

}  // namespace

namespace {

// Elements kept per token by one mixer (bf16 unless noted: fp32 items count twice).
int64_t act_elems_mixer(const ModelConfig& c, char mixer) {
  switch (mixer) {
    case 'G': {
      const int64_t H = c.gdn_heads, Kg = H * c.gdn_dk, Vg = H * c.gdn_dv;
      const int64_t proj = 2 * Kg + Vg;                 // q,k,v before and after the conv
      const int64_t gates = 2 * (2 * H);                // β, g in fp32
      const int64_t core = 2 * (2 * Kg + 3 * Vg);       // fp32: normed q,k; W,U; Vn; o
      const int64_t state = 2 * (H * c.gdn_dk * c.gdn_dv) / std::max<int64_t>(1, c.gdn_chunk);  // h per chunk
      return 2 * proj + gates + core + state + 3 * Vg;  // + gate z, gated-norm output, W_o input
    }
    case 'A': {
      const int64_t dqk = c.mla_nope_dim + c.mla_rope_dim, nh = c.mla_heads;
      const int64_t q = (c.mla_q_rank > 0 ? 2 * c.mla_q_rank : 0) + nh * dqk;
      const int64_t kv = (c.mla_kv_rank + c.mla_rope_dim) + c.mla_kv_rank + nh * (c.mla_nope_dim + c.mla_v_dim);
      // Q, K and V as the kernel takes them (V at its own width: cuDNN's kernels take it so on Hopper;
      // flash's pad it to dqk, so there this is low by nh·(dqk − dva)); the output.
      return q + kv + 2 * nh * dqk + 2 * nh * c.mla_v_dim;
    }
    case 'S': {
      const int64_t qkv = (c.attn_heads + 2 * c.attn_kv_heads) * c.attn_head_dim;
      return 2 * qkv + c.attn_heads * c.attn_head_dim;  // before and after RoPE/QK-norm; output
    }
    default: return 0;
  }
}

int64_t act_elems_ffn(const ModelConfig& c) {
  if (c.moe_experts == 0) return c.d + 3 * c.ffn_hidden;
  const int64_t routed = c.moe_top_k * (c.d + 3 * c.moe_expert_hidden);  // gathered input + hidden per choice
  return c.d + 2 * c.moe_experts + routed + 3 * c.moe_shared_hidden;
}

}  // namespace

int64_t activation_bytes_per_token(const ModelConfig& c) {
  int64_t largest_block = 0, all_blocks = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t block = 4 * c.d + act_elems_mixer(c, mixer_at(c, l)) + act_elems_ffn(c);
    largest_block = std::max(largest_block, block);
    all_blocks += block;
  }
  // Final norm, plus the plain head's fp32 logits and their softmax, or the fused head's dh (its
  // chunk of logits is a fixed 256 MiB, not per token).
  const int64_t head = c.d + (c.loss_chunk_tokens < 0 ? 2 * 2 * c.vocab_size : c.d);
  const int64_t elems = c.activation_checkpointing ? c.n_layers * c.d + largest_block + head : all_blocks + head;
  return 2 * elems;
}


std::vector<std::string> validate(const ModelConfig& c) {
  std::vector<std::string> out;
  check_min(out, "vocab_size", c.vocab_size, 1);
  check_min(out, "d", c.d, 1);
  check_min(out, "L", c.n_layers, 1);
  check_min(out, "max_seq_len", c.max_seq_len, 1);

  if (c.pattern.empty()) {
    out.push_back("model.pattern: must not be empty (letters G, A, S)");
  } else {
    for (char m : c.pattern) {
      if (m != 'G' && m != 'A' && m != 'S') {
        out.push_back("model.pattern: only the letters G, A and S are allowed (got \"" + c.pattern + "\")");
        break;
      }
    }
  }

  // Mixer sizes are checked whatever the pattern: a preset carries all three, and a bad value
  // should surface when it is set, not later when someone switches the pattern.
  check_min(out, "attn_heads", c.attn_heads, 1);
  check_min(out, "attn_kv_heads", c.attn_kv_heads, 1);
  if (c.attn_heads >= 1 && c.attn_kv_heads >= 1 && c.attn_heads % c.attn_kv_heads != 0) {
    std::ostringstream s;
    s << "model.attn_heads: must be divisible by model.attn_kv_heads (got " << c.attn_heads << " and "
      << c.attn_kv_heads << ")";
    out.push_back(s.str());
  }
  check_min(out, "attn_head_dim", c.attn_head_dim, 2);
  check_even(out, "attn_head_dim", c.attn_head_dim, "RoPE rotates pairs");

  check_min(out, "gdn_heads", c.gdn_heads, 1);
  check_min(out, "gdn_dk", c.gdn_dk, 1);
  check_min(out, "gdn_dv", c.gdn_dv, 1);
  check_min(out, "gdn_conv", c.gdn_conv, 1);
  static const std::set<int64_t> chunks = {16, 32, 64, 128};
  if (!chunks.count(c.gdn_chunk)) {
    std::ostringstream s;
    s << "model.gdn_chunk: must be 16, 32, 64 or 128 (got " << c.gdn_chunk << ")";
    out.push_back(s.str());
  }
  if (c.gdn_scan_precision != "auto" && c.gdn_scan_precision != "tf32" && c.gdn_scan_precision != "fp32") {
    out.push_back("model.gdn_scan_precision: must be \"auto\", \"tf32\" or \"fp32\" (got \"" + c.gdn_scan_precision +
                  "\")");
  }

  check_min(out, "mla_heads", c.mla_heads, 1);
  check_min(out, "mla_q_rank", c.mla_q_rank, 0);
  check_min(out, "mla_kv_rank", c.mla_kv_rank, 1);
  check_min(out, "mla_nope_dim", c.mla_nope_dim, 0);
  check_min(out, "mla_rope_dim", c.mla_rope_dim, 2);
  check_even(out, "mla_rope_dim", c.mla_rope_dim, "RoPE rotates pairs");
  check_min(out, "mla_v_dim", c.mla_v_dim, 1);

  check_min(out, "moe_experts", c.moe_experts, 0);
  if (c.moe_experts > 0) {
    if (c.moe_top_k < 1 || c.moe_top_k > c.moe_experts) {
      std::ostringstream s;
      s << "model.moe_top_k: must be in [1, model.moe_experts] (got " << c.moe_top_k << " with "
        << c.moe_experts << " experts)";
      out.push_back(s.str());
    }
    check_min(out, "moe_expert_hidden", c.moe_expert_hidden, 1);
    check_min(out, "moe_shared_hidden", c.moe_shared_hidden, 0);
  } else {
    check_min(out, "ffn_hidden", c.ffn_hidden, 1);
  }

  check_positive(out, "init_std", c.init_std);
  check_positive(out, "rope_theta", c.rope_theta);
  check_min(out, "loss_chunk_tokens", c.loss_chunk_tokens, -1);
  check_finite_min0(out, "logit_softcap", c.logit_softcap, ", 0 = off");
  check_finite_min0(out, "moe_aux_coef", c.moe_aux_coef, ", 0 = no load-balancing loss");
  return out;
}

}  // namespace model

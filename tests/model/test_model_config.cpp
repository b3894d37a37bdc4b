// Tests for ModelConfig presets, accounting and validation: the numbers are MODEL.md §8's table
// and §9's per-module list, copied verbatim rather than recomputed, so a formula change that
// moves any of them fails here (MODEL.md §11 tests 13 and 14, accounting side).
#include "model/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace {

using model::Family;
using model::ModelConfig;

struct Expected {
  const char* preset;
  int64_t hybrid_total, hybrid_active, gpt_total, gpt_active;
  int64_t hybrid_flops, gpt_flops;
  int64_t p_g, p_a, p_s, p_ffn;  // p_ffn is P_MoE for MoE presets
};

// MODEL.md §8 table and §9 per-module values.
const Expected EXPECTED[] = {
    {"tiny", 2072976, 2072976, 1705600, 1705600, 15962112, 12582912, 133764, 63616, 49152, 147456},
    {"tiny-moe", 3848592, 2079120, 3481216, 1711744, 15998976, 12619776, 133764, 63616, 49152, 443392},
    {"small", 24290200, 24290200, 23204736, 23204736, 176375808, 195821568, 891846, 528512, 589824, 1179648},
    {"base", 125115232, 125115232, 117197568, 117197568, 873234432, 929562624, 3557580, 1942144, 2359296,
     5308416},
    {"moe-1b", 1063924368, 242889360, 1016239104, 195204096, 1713045504, 1623982080, 6316300, 3179264,
     2621440, 51970048},
};

ModelConfig preset(const std::string& name, Family f) {
  auto c = model::make_preset(name, f);
  EXPECT_TRUE(c.has_value()) << name;
  return c.value_or(ModelConfig{});
}

TEST(ModelConfig, FamilyNames) {
  EXPECT_STREQ(model::family_name(Family::Gpt), "gpt");
  EXPECT_STREQ(model::family_name(Family::Hybrid), "hybrid");
  EXPECT_EQ(model::family_from_name("gpt"), Family::Gpt);
  EXPECT_EQ(model::family_from_name("hybrid"), Family::Hybrid);
  EXPECT_FALSE(model::family_from_name("Hybrid").has_value());
  EXPECT_FALSE(model::family_from_name("").has_value());
}

TEST(ModelConfig, PresetNamesInTableOrder) {
  const std::vector<std::string> want = {"tiny", "tiny-moe", "small", "base", "moe-1b"};
  EXPECT_EQ(model::preset_names(), want);
  for (const auto& n : want) {
    EXPECT_TRUE(model::make_preset(n, Family::Gpt).has_value()) << n;
    EXPECT_TRUE(model::make_preset(n, Family::Hybrid).has_value()) << n;
  }
  EXPECT_FALSE(model::make_preset("huge", Family::Gpt).has_value());
}

TEST(ModelConfig, PresetSharedSettings) {
  for (const auto& n : model::preset_names()) {
    for (Family f : {Family::Gpt, Family::Hybrid}) {
      const ModelConfig c = preset(n, f);
      SCOPED_TRACE(n + "/" + model::family_name(f));
      EXPECT_EQ(c.family, f);
      EXPECT_EQ(c.preset, n);
      EXPECT_EQ(c.pattern, f == Family::Hybrid ? "GGA" : "S");
      EXPECT_EQ(c.gdn_conv, 4);
      EXPECT_EQ(c.gdn_chunk, 64);
      EXPECT_EQ(c.gdn_dv, 2 * c.gdn_dk);
      EXPECT_EQ(c.rope_theta, 1e4);
      EXPECT_TRUE(c.norm_affine);
      EXPECT_FALSE(c.embed_norm);
      EXPECT_EQ(c.logit_softcap, 0.0);
      EXPECT_TRUE(c.qk_norm);
      EXPECT_TRUE(c.moe_norm_topk);
      EXPECT_EQ(c.moe_aux_coef, 0.01);
      EXPECT_EQ(c.init_std, 0.02);
      EXPECT_TRUE(c.tie_embeddings);
      EXPECT_EQ(c.n_layers % 3, 0);
    }
  }
  const ModelConfig m = preset("moe-1b", Family::Hybrid);
  EXPECT_EQ(m.moe_experts, 64);
  EXPECT_EQ(m.moe_top_k, 6);
  EXPECT_EQ(m.moe_expert_hidden, 256);
  EXPECT_EQ(m.moe_shared_hidden, 512);
  EXPECT_EQ(m.max_seq_len, 2048);
  EXPECT_EQ(preset("tiny", Family::Gpt).max_seq_len, 256);
}

TEST(ModelConfig, MixerPattern) {
  const ModelConfig h = preset("tiny", Family::Hybrid);
  const char want[] = {'G', 'G', 'A', 'G', 'G', 'A'};
  for (int64_t l = 0; l < h.n_layers; ++l) EXPECT_EQ(model::mixer_at(h, l), want[l]) << l;
  const ModelConfig g = preset("tiny", Family::Gpt);
  for (int64_t l = 0; l < g.n_layers; ++l) EXPECT_EQ(model::mixer_at(g, l), 'S') << l;
}

TEST(ModelConfig, PerModuleParams) {
  for (const Expected& e : EXPECTED) {
    for (Family f : {Family::Gpt, Family::Hybrid}) {
      const ModelConfig c = preset(e.preset, f);
      SCOPED_TRACE(std::string(e.preset) + "/" + model::family_name(f));
      EXPECT_EQ(model::params_mixer(c, 'G'), e.p_g);
      EXPECT_EQ(model::params_mixer(c, 'A'), e.p_a);
      EXPECT_EQ(model::params_mixer(c, 'S'), e.p_s);
      EXPECT_EQ(model::params_ffn(c), e.p_ffn);
    }
  }
}

TEST(ModelConfig, ParamCountsMatchTable) {
  for (const Expected& e : EXPECTED) {
    const ModelConfig h = preset(e.preset, Family::Hybrid);
    const ModelConfig g = preset(e.preset, Family::Gpt);
    EXPECT_EQ(model::count_params(h), e.hybrid_total) << e.preset;
    EXPECT_EQ(model::count_active_params(h), e.hybrid_active) << e.preset;
    EXPECT_EQ(model::count_params(g), e.gpt_total) << e.preset;
    EXPECT_EQ(model::count_active_params(g), e.gpt_active) << e.preset;
  }
}

TEST(ModelConfig, FlopsMatchTable) {
  for (const Expected& e : EXPECTED) {
    EXPECT_EQ(model::flops_per_token(preset(e.preset, Family::Hybrid)), e.hybrid_flops) << e.preset;
    EXPECT_EQ(model::flops_per_token(preset(e.preset, Family::Gpt)), e.gpt_flops) << e.preset;
  }
}

// The switches the table does not exercise: untied head, weight-free norms, rq = 0 on a preset
// that has q-LoRA, and a dense FFN in place of MoE.
TEST(ModelConfig, AccountingSwitches) {
  ModelConfig c = preset("tiny", Family::Hybrid);
  const int64_t base = model::count_params(c);
  c.tie_embeddings = false;
  EXPECT_EQ(model::count_params(c), base + c.vocab_size * c.d);
  c.tie_embeddings = true;
  c.norm_affine = false;
  EXPECT_EQ(model::count_params(c), base - c.d * (2 * c.n_layers + 1));

  ModelConfig a = preset("tiny", Family::Hybrid);
  a.mla_q_rank = 0;
  const int64_t dqk = a.mla_nope_dim + a.mla_rope_dim;
  EXPECT_EQ(model::params_mixer(a, 'A'), 63616 - (128 * 64 + 64 + 64 * 4 * dqk) + 128 * 4 * dqk);

  ModelConfig m = preset("tiny-moe", Family::Gpt);
  m.moe_experts = 0;
  EXPECT_EQ(model::params_ffn(m), 3 * m.d * m.ffn_hidden);
  EXPECT_EQ(model::count_active_params(m), model::count_params(m));
}

TEST(ModelConfig, PresetsValidate) {
  for (const auto& n : model::preset_names()) {
    for (Family f : {Family::Gpt, Family::Hybrid}) {
      const auto errs = model::validate(preset(n, f));
      EXPECT_TRUE(errs.empty()) << n << ": " << (errs.empty() ? "" : errs.front());
    }
  }
}

struct BadCase {
  const char* what;
  std::function<void(ModelConfig&)> edit;
  const char* key;  // the message must start with this
  const char* got;  // and contain this (the bad value)
};

TEST(ModelConfig, ValidateRejects) {
  const std::vector<BadCase> cases = {
      {"d zero", [](ModelConfig& c) { c.d = 0; }, "model.d:", "0"},
      {"L zero", [](ModelConfig& c) { c.n_layers = 0; }, "model.L:", "0"},
      {"vocab zero", [](ModelConfig& c) { c.vocab_size = 0; }, "model.vocab_size:", "0"},
      {"attn heads", [](ModelConfig& c) { c.attn_heads = 0; }, "model.attn_heads:", "0"},
      {"gdn heads", [](ModelConfig& c) { c.gdn_heads = 0; }, "model.gdn_heads:", "0"},
      {"mla heads", [](ModelConfig& c) { c.mla_heads = -1; }, "model.mla_heads:", "-1"},
      {"gqa", [](ModelConfig& c) { c.attn_heads = 4; c.attn_kv_heads = 3; }, "model.attn_heads:",
       "(got 4 and 3)"},
      {"odd head dim", [](ModelConfig& c) { c.attn_head_dim = 33; }, "model.attn_head_dim:", "33"},
      {"odd rope dim", [](ModelConfig& c) { c.mla_rope_dim = 15; }, "model.mla_rope_dim:", "15"},
      {"empty pattern", [](ModelConfig& c) { c.pattern = ""; }, "model.pattern:", "empty"},
      {"bad letter", [](ModelConfig& c) { c.pattern = "GGX"; }, "model.pattern:", "GGX"},
      {"lowercase", [](ModelConfig& c) { c.pattern = "gga"; }, "model.pattern:", "gga"},
      {"dk zero", [](ModelConfig& c) { c.gdn_dk = 0; }, "model.gdn_dk:", "0"},
      {"chunk 48", [](ModelConfig& c) { c.gdn_chunk = 48; }, "model.gdn_chunk:", "48"},
      {"scan precision", [](ModelConfig& c) { c.gdn_scan_precision = "bf16"; }, "model.gdn_scan_precision:", "bf16"},
      {"top_k 0", [](ModelConfig& c) { c.moe_experts = 8; c.moe_top_k = 0; }, "model.moe_top_k:", "0"},
      {"top_k > E", [](ModelConfig& c) { c.moe_experts = 8; c.moe_top_k = 9; }, "model.moe_top_k:", "9"},
      {"init_std", [](ModelConfig& c) { c.init_std = 0; }, "model.init_std:", "0"},
      {"rope_theta", [](ModelConfig& c) { c.rope_theta = -1; }, "model.rope_theta:", "-1"},
      {"softcap", [](ModelConfig& c) { c.logit_softcap = -15; }, "model.logit_softcap:", "-15"},
      // inf and nan pass a plain "> 0" test, then make every step's loss nan.
      {"init_std inf", [](ModelConfig& c) { c.init_std = INFINITY; }, "model.init_std:", "inf"},
      {"rope_theta nan", [](ModelConfig& c) { c.rope_theta = NAN; }, "model.rope_theta:", "nan"},
      {"softcap inf", [](ModelConfig& c) { c.logit_softcap = INFINITY; }, "model.logit_softcap:", "inf"},
      {"aux coef", [](ModelConfig& c) { c.moe_aux_coef = -1; }, "model.moe_aux_coef:", "-1"},
      {"aux coef nan", [](ModelConfig& c) { c.moe_aux_coef = NAN; }, "model.moe_aux_coef:", "nan"},
  };
  for (const BadCase& bc : cases) {
    for (Family f : {Family::Gpt, Family::Hybrid}) {
      ModelConfig c = preset("tiny", f);
      bc.edit(c);
      const auto errs = model::validate(c);
      bool found = false;
      for (const auto& e : errs) {
        if (e.rfind(bc.key, 0) == 0 && e.find(bc.got) != std::string::npos) found = true;
      }
      std::string all;
      for (const auto& e : errs) all += "\n  " + e;
      EXPECT_TRUE(found) << bc.what << ": want a line starting \"" << bc.key << "\" containing \"" << bc.got
                         << "\", got:" << all;
    }
  }
}

TEST(ModelConfig, ValidateGqaMessage) {
  ModelConfig c = preset("tiny", Family::Gpt);
  c.attn_heads = 4;
  c.attn_kv_heads = 3;
  const auto errs = model::validate(c);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0], "model.attn_heads: must be divisible by model.attn_kv_heads (got 4 and 3)");
}

// A GPT family may carry any pattern; the family only picks the default.
TEST(ModelConfig, GptFamilyAcceptsAnyPattern) {
  ModelConfig c = preset("tiny", Family::Gpt);
  c.pattern = "GAS";
  EXPECT_TRUE(model::validate(c).empty());
}

// The activation estimate, worked by hand for the tiny GPT (d=128, L=6, V=4096, nh=4, nkv=2,
// dh=32, f=384): per block 4d + (2·(nh+2nkv)·dh + nh·dh) + (d + 3f) = 512 + 640 + 1280 = 2432
// elements; the fused chunked head keeps d + d = 256 per token (the norm's input and dh); the plain
// head d + 4V = 16512 (fp32 logits and softmax count twice). bf16: 2 bytes each.
TEST(ModelConfig, ActivationBytesPerToken) {
  ModelConfig c = preset("tiny", Family::Gpt);
  EXPECT_EQ(model::activation_bytes_per_token(c), 2 * (6 * 2432 + 256));
  c.activation_checkpointing = true;  // block inputs only, plus one block recomputed
  EXPECT_EQ(model::activation_bytes_per_token(c), 2 * (6 * 128 + 2432 + 256));
  c.loss_chunk_tokens = -1;
  EXPECT_EQ(model::activation_bytes_per_token(c), 2 * (6 * 128 + 2432 + 16512));
  // Every hybrid preset needs more with all activations kept than with checkpointing.
  for (const auto& name : model::preset_names()) {
    ModelConfig h = preset(name, Family::Hybrid);
    const int64_t full = model::activation_bytes_per_token(h);
    h.activation_checkpointing = true;
    EXPECT_GT(full, model::activation_bytes_per_token(h)) << name;
  }
}

}  // namespace

// `deltadeck model info`: pure accounting from model_config (no torch, no allocation), so it
// answers instantly even for moe-1b.
#include "app/model_command.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "model/model_config.h"
#include "ui/log/log_line.h"

namespace app {

int model_info(const ModelInfoArgs& a) {
  auto family = model::family_from_name(a.family);
  if (!family) {
    std::cerr << "deltadeck: --family: must be hybrid or gpt (got \"" << a.family << "\")\n";
    return 2;
  }
  auto preset = model::make_preset(a.preset, *family);
  if (!preset) {
    std::cerr << "deltadeck: --preset: unknown preset \"" << a.preset << "\"; choose one of:";
    for (const auto& n : model::preset_names()) std::cerr << " " << n;
    std::cerr << "\n";
    return 2;
  }
  model::ModelConfig c = *preset;
  if (a.seq_len > 0) c.max_seq_len = a.seq_len;
  if (a.vocab_size > 0) c.vocab_size = a.vocab_size;
  auto problems = model::validate(c);
  if (!problems.empty()) {
    for (const auto& p : problems) std::cerr << "deltadeck: " << p << "\n";
    return 2;
  }

  const int64_t total = model::count_params(c), active = model::count_active_params(c);
  const int64_t flops = model::flops_per_token(c);
  const int64_t act = model::activation_bytes_per_token(c);
  model::ModelConfig ckpt = c;
  ckpt.activation_checkpointing = true;
  const int64_t act_ckpt = model::activation_bytes_per_token(ckpt);

  std::cout << "model " << a.family << " " << c.preset << ": pattern \"" << c.pattern << "\", L=" << c.n_layers
            << ", d=" << c.d << ", V=" << c.vocab_size << ", T=" << c.max_seq_len
            << (c.moe_experts > 0 ? ", MoE E=" + std::to_string(c.moe_experts) + " k=" + std::to_string(c.moe_top_k)
                                  : ", SwiGLU f=" + std::to_string(c.ffn_hidden))
            << "\n";
  std::cout << "  parameters, total             " << ui::format_grouped(total) << "\n";
  std::cout << "  parameters, active per token  " << ui::format_grouped(active) << "\n";
  std::cout << "  training FLOPs per token      " << ui::format_grouped(flops) << "  (fwd+bwd, context T=" << c.max_seq_len
            << ")\n";
  std::cout << "  activation memory per token   ~" << ui::format_bytes(static_cast<double>(act)) << " ("
            << ui::format_bytes(static_cast<double>(act) * static_cast<double>(c.max_seq_len)) << " per " << c.max_seq_len
            << "-token row; with activation checkpointing ~" << ui::format_bytes(static_cast<double>(act_ckpt))
            << " per token)\n";
  std::cout << "  per layer:";
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const char m = model::mixer_at(c, l);
    std::cout << (l % 6 == 0 ? "\n   " : "") << " " << l << ":" << m << " " << ui::format_grouped(model::params_mixer(c, m))
              << "+" << ui::format_grouped(model::params_ffn(c));
  }
  std::cout << "\n";
  return 0;
}

}  // namespace app

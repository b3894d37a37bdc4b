// The fingerprint comes from to_json(), the same field table that writes the run's config, so a
// [model] key added later is compared by default; only the keys below, which change no parameter's
// shape, are left out.
#include "trainer/resume_check.h"

#include <nlohmann/json.hpp>

#include <set>

#include "trainer/config.h"

namespace trainer {

namespace {

const std::set<std::string>& behaviour_only_model_keys() {
  static const std::set<std::string> keys = {
      "preset",           // a name; the fields it resolved to are compared
      "logit_softcap",    "loss_chunk_tokens", "rope_theta", "init_std", "max_seq_len",
      "activation_checkpointing", "gdn_chunk", "gdn_neg_eig", "moe_norm_topk", "moe_aux_coef",
  };
  return keys;
}

}  // namespace

std::map<std::string, std::string> resume_fingerprint(const RunConfig& cfg, int64_t world_size) {
  std::map<std::string, std::string> out;
  const nlohmann::json j = nlohmann::json::parse(to_json(cfg));
  for (auto it = j["model"].begin(); it != j["model"].end(); ++it) {
    if (behaviour_only_model_keys().count(it.key())) continue;
    out["model." + it.key()] = it.value().dump();
  }
  out["train.precision"] = j["train"]["precision"].dump();
  // What the optimizer state holds: AdamW moments, or Muon's momenta beside them; EMA weights or
  // none. A run that needs state the checkpoint lacks failed at its first step, after the resume
  // had reopened the run. (Checkpoints written before these keys are not compared on them.)
  out["train.optimizer"] = j["train"]["optimizer"].dump();
  out["train.ema"] = cfg.train.ema_decay > 0 ? "on" : "off";
  // The experts' state: Muon's momenta, or AdamW's moments.
  const bool experts_muon = cfg.train.optimizer == "muon" && cfg.model.moe_experts > 0 && cfg.train.muon_experts;
  out["train.muon_experts"] = experts_muon ? "on" : "off";
  // The loader's saved position holds one cursor a training source; another count failed at the
  // first step (after the resume had recorded the new config as the run's).
  out["data.train_sources"] = std::to_string(cfg.data.train.size());
  out["world_size"] = std::to_string(world_size);
  return out;
}

std::vector<std::string> resume_mismatches(const std::map<std::string, std::string>& checkpoint_compat,
                                           const std::map<std::string, std::string>& run) {
  // Keys added after checkpoints were first fingerprinted: one written before holds what it had then.
  std::map<std::string, std::string> checkpoint = checkpoint_compat;
  if (!checkpoint.empty()) checkpoint.emplace("train.muon_experts", "off");  // Muon left the experts to AdamW
  std::vector<std::string> out;
  for (const auto& [key, have] : checkpoint) {
    auto it = run.find(key);
    if (it == run.end() || it->second == have) continue;
    std::string line = key + ": the checkpoint has " + have + ", this run has " + it->second;
    if (key == "world_size") line += " (each rank's data position is saved; resume on as many ranks)";
    if (key == "train.optimizer") line += " (the optimizer state is saved for the optimizer that wrote it)";
    if (key == "train.ema") line += " (EMA weights are saved only while train.ema_decay > 0)";
    if (key == "train.muon_experts")
      line += " (the MoE experts' state is saved for the optimizer that had them: Muon with optimizer = \"muon\" "
              "and train.muon_experts = true, else AdamW)";
    if (key == "data.train_sources")
      line += " data.train sources (the loader's position is saved for each; other files behind the same sources "
              "are allowed)";
    out.push_back(line);
  }
  return out;
}

}  // namespace trainer

#include "trainer/export.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <stdexcept>

#include "storage/file_util.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace trainer {

ExportResult export_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir, bool ema) {
  CheckpointData ckpt = load_checkpoint(checkpoint_dir);
  if (ckpt.config_toml.empty())
    throw std::runtime_error(checkpoint_dir + "/model.safetensors: carries no run config (written by an older "
                             "deltadeck); its model cannot be described");
  ConfigResult parsed = parse_config(ckpt.config_toml, checkpoint_dir + "/model.safetensors config", {});
  if (!parsed.ok()) throw std::runtime_error(parsed.errors.front());
  const nlohmann::json run = nlohmann::json::parse(to_json(parsed.config));

  NamedTensors weights = ckpt.weights;
  if (ema) {
    std::map<std::string, at::Tensor> state(ckpt.state.begin(), ckpt.state.end());
    for (auto& [name, t] : weights) {
      auto it = state.find("ema." + name);
      if (it == state.end())
        throw std::runtime_error(checkpoint_dir + "/state.safetensors: no EMA weights (the run had train.ema_decay "
                                 "= 0); export without --ema");
      t = it->second;
    }
  }

  storage::files::make_dirs(out_dir);
  ExportResult r;
  r.step = ckpt.step;
  r.ema = ema;
  r.weights_path = out_dir + "/model.safetensors";
  r.config_path = out_dir + "/config.json";
  r.bytes = write_weights_file(r.weights_path, weights,
                               {{"format", "pt"}, {"producer", "deltadeck"}, {"step", std::to_string(ckpt.step)}});
  r.tensors = static_cast<int64_t>(weights.size());

  nlohmann::json cfg;
  cfg["producer"] = "deltadeck";
  cfg["step"] = ckpt.step;
  cfg["weights"] = ema ? "ema" : "live";
  cfg["model"] = run.at("model");
  cfg["tokenizer"] = run.at("data").at("tokenizer");
  cfg["tensors"] = nlohmann::json::object();
  for (const auto& [name, t] : weights) cfg["tensors"][name] = t.sizes().vec();
  std::ofstream f(r.config_path, std::ios::trunc);
  f << cfg.dump(2) << "\n";
  f.close();
  if (!f) throw std::runtime_error(r.config_path + ": could not be written");
  return r;
}

}  // namespace trainer

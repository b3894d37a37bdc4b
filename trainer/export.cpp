#include "trainer/export.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "storage/file_util.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace trainer {

ExportResult export_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir, bool ema,
                               bool replace) {
  if (out_dir.empty()) throw std::runtime_error("export: no output folder given (--out)");
  if (storage::files::exists(out_dir + "/manifest.json"))
    throw std::runtime_error(out_dir + ": a checkpoint folder (it holds manifest.json); the export would replace its "
                             "weights: export to another folder");
  if (!replace) {
    for (const char* name : {"/model.safetensors", "/config.json", "/tokenizer.model"}) {
      if (storage::files::exists(out_dir + name))
        throw std::runtime_error(out_dir + name + " exists; export to another folder, or replace it (--force)");
    }
  }
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
  // Each file goes in by rename, so a failed export leaves whatever was there whole.
  auto put_in_place = [](const std::string& tmp, const std::string& path) {
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      storage::files::remove_tree(tmp);
      throw std::runtime_error(path + ": could not be written (" + why + ")");
    }
  };
  r.bytes = write_weights_file(r.weights_path + ".tmp", weights,
                               {{"format", "pt"}, {"producer", "deltadeck"}, {"step", std::to_string(ckpt.step)}});
  put_in_place(r.weights_path + ".tmp", r.weights_path);
  r.tensors = static_cast<int64_t>(weights.size());

  nlohmann::json cfg;
  cfg["producer"] = "deltadeck";
  cfg["step"] = ckpt.step;
  cfg["weights"] = ema ? "ema" : "live";
  cfg["model"] = run.at("model");
  cfg["tokenizer"] = run.at("data").at("tokenizer");
  // A SentencePiece model goes along, so the folder is all a user of the weights needs.
  const std::string tok = run.at("data").at("tokenizer").get<std::string>();
  const std::string sp = "sentencepiece:";
  if (tok.rfind(sp, 0) == 0) {
    const std::string model_path = tok.substr(sp.size());
    std::ifstream in(model_path, std::ios::binary);
    if (!in) {
      r.warning = "the run's tokenizer model " + model_path + " cannot be read (" + std::strerror(errno) +
                  "); config.json names it as the run recorded it";
    } else {
      r.tokenizer_path = out_dir + "/tokenizer.model";
      {
        std::ofstream o(r.tokenizer_path + ".tmp", std::ios::binary | std::ios::trunc);
        o << in.rdbuf();
        o.close();
        if (!o) {
          storage::files::remove_tree(r.tokenizer_path + ".tmp");
          throw std::runtime_error(r.tokenizer_path + ": could not be written");
        }
      }
      put_in_place(r.tokenizer_path + ".tmp", r.tokenizer_path);
      cfg["tokenizer"] = sp + "tokenizer.model";  // relative to the export folder
      cfg["tokenizer_recorded"] = tok;
    }
  }
  cfg["tensors"] = nlohmann::json::object();
  for (const auto& [name, t] : weights) cfg["tensors"][name] = t.sizes().vec();
  {
    std::ofstream f(r.config_path + ".tmp", std::ios::trunc);
    f << cfg.dump(2) << "\n";
    f.close();
    if (!f) {
      storage::files::remove_tree(r.config_path + ".tmp");
      throw std::runtime_error(r.config_path + ": could not be written");
    }
  }
  put_in_place(r.config_path + ".tmp", r.config_path);
  return r;
}

}  // namespace trainer

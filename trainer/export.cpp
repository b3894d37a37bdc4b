#include "trainer/export.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>
#include <stdexcept>

#include "storage/file_io.h"
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

  ExportResult r;
  r.step = ckpt.step;
  r.ema = ema;
  r.tensors = static_cast<int64_t>(weights.size());
  r.weights_path = out_dir + "/model.safetensors";
  r.config_path = out_dir + "/config.json";

  nlohmann::json cfg;
  cfg["producer"] = "deltadeck";
  cfg["step"] = ckpt.step;
  cfg["weights"] = ema ? "ema" : "live";
  cfg["model"] = run.at("model");
  cfg["tokenizer"] = run.at("data").at("tokenizer");
  // A SentencePiece model goes along, so the folder is all a user of the weights needs.
  std::string tokenizer_bytes;
  const std::string tok = run.at("data").at("tokenizer").get<std::string>();
  const std::string sp = "sentencepiece:";
  if (tok.rfind(sp, 0) == 0) {
    const std::string model_path = tok.substr(sp.size());
    std::ifstream in(model_path, std::ios::binary);
    if (!in) {
      r.warning = "the run's tokenizer model " + model_path + " cannot be read (" + std::strerror(errno) +
                  "); config.json names it as the run recorded it";
    } else {
      std::ostringstream bytes;
      bytes << in.rdbuf();
      tokenizer_bytes = bytes.str();
      r.tokenizer_path = out_dir + "/tokenizer.model";
      cfg["tokenizer"] = sp + "tokenizer.model";  // relative to the export folder
      cfg["tokenizer_recorded"] = tok;
    }
  }
  cfg["tensors"] = nlohmann::json::object();
  for (const auto& [name, t] : weights) cfg["tensors"][name] = t.sizes().vec();

  // Every file is written and fsynced under a temporary name first, and only then are they renamed
  // into place, one after another: a failed export (a full disk, an unreadable file) replaces
  // nothing, and a replaced folder never mixes one export's weights with another's config.
  storage::FileIo& io = storage::posix_io();
  std::vector<std::string> staged;
  try {
    io.make_dirs(out_dir);
    staged.push_back(r.weights_path);
    r.bytes = write_weights_file(io, r.weights_path + ".tmp", weights,
                                 {{"format", "pt"}, {"producer", "deltadeck"}, {"step", std::to_string(ckpt.step)}},
                                 nullptr);
    if (!r.tokenizer_path.empty()) {
      staged.push_back(r.tokenizer_path);
      storage::write_text_file(io, r.tokenizer_path + ".tmp", tokenizer_bytes);
    }
    staged.push_back(r.config_path);
    storage::write_text_file(io, r.config_path + ".tmp", cfg.dump(2) + "\n");
  } catch (const std::exception& e) {
    for (const std::string& path : staged) storage::files::remove_tree(path + ".tmp");
    throw std::runtime_error(std::string("export to ") + out_dir + " failed, nothing replaced: " + e.what());
  }
  for (const std::string& path : staged) io.rename(path + ".tmp", path);
  // A tokenizer.model of an earlier export no longer belongs with these weights.
  if (r.tokenizer_path.empty()) io.remove_tree(out_dir + "/tokenizer.model");
  io.fsync_dir(out_dir);
  return r;
}

}  // namespace trainer

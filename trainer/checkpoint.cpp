#include "trainer/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "storage/file_util.h"
#include "storage/safetensors.h"
#include "storage/sha256.h"

namespace trainer {

namespace {

constexpr int CHECKPOINT_VERSION = 1;

namespace files = storage::files;

std::string errno_text() { return std::strerror(errno); }

const char* safetensors_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    default: throw std::runtime_error(std::string("checkpoint: unsupported dtype ") + c10::toString(t));
  }
}

at::ScalarType torch_dtype(const std::string& d, const std::string& file) {
  if (d == "F32") return at::kFloat;
  if (d == "F64") return at::kDouble;
  if (d == "BF16") return at::kBFloat16;
  if (d == "F16") return at::kHalf;
  if (d == "I64") return at::kLong;
  if (d == "I32") return at::kInt;
  if (d == "U8") return at::kByte;
  throw std::runtime_error(file + ": unsupported dtype " + d);
}

}  // namespace

int64_t write_weights_file(const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& meta) {
  // Contiguous CPU copies must outlive the views handed to the writer.
  std::vector<at::Tensor> keep;
  std::vector<storage::TensorView> views;
  keep.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    keep.push_back(t.detach().to(torch::kCPU).contiguous());
    const auto& c = keep.back();
    views.push_back({name, safetensors_dtype(c.scalar_type()), c.sizes().vec(), c.data_ptr(),
                     static_cast<size_t>(c.nbytes())});
  }
  return storage::write_safetensors(path, views, meta);
}

namespace {

NamedTensors read_tensors(const storage::SafetensorsFile& f, const std::string& path) {
  NamedTensors out;
  for (const auto& name : f.names_in_file_order()) {
    const auto& e = f.entries().at(name);
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(torch_dtype(e.dtype, path)));
    if (e.nbytes) std::memcpy(t.data_ptr(), f.data(name), e.nbytes);
    out.emplace_back(name, std::move(t));
  }
  return out;
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

}  // namespace

SavedCheckpoint save_checkpoint(const std::string& root, const CheckpointData& data) {
  files::make_dirs(root);
  const std::string final_dir = root + "/" + step_dir_name(data.step);
  const std::string tmp_dir = final_dir + ".tmp";
  files::remove_tree(tmp_dir);  // a leftover of a crashed save
  files::make_dirs(tmp_dir);

  nlohmann::json manifest;
  manifest["format"] = "deltadeck-checkpoint";
  manifest["version"] = CHECKPOINT_VERSION;
  manifest["step"] = data.step;
  std::map<std::string, std::string> weights_meta{{"format", "deltadeck-weights"},
                                                  {"version", std::to_string(CHECKPOINT_VERSION)}};
  if (!data.config_toml.empty()) weights_meta["config.toml"] = data.config_toml;
  std::map<std::string, std::string> state_meta = data.meta;
  state_meta["format"] = "deltadeck-state";
  state_meta["version"] = std::to_string(CHECKPOINT_VERSION);
  state_meta["step"] = std::to_string(data.step);

  SavedCheckpoint saved;
  for (const auto& [file, tensors, meta] :
       {std::tuple{std::string("model.safetensors"), &data.weights, &weights_meta},
        std::tuple{std::string("state.safetensors"), &data.state, &state_meta}}) {
    const std::string path = tmp_dir + "/" + file;
    const int64_t bytes = write_weights_file(path, *tensors, *meta);  // fsyncs the file
    const std::string sha = storage::sha256_file(path);
    manifest["files"][file] = {{"bytes", bytes}, {"sha256", sha}};
    saved.bytes += bytes;
    if (file == "model.safetensors") saved.sha256 = sha;
  }

  const std::string manifest_path = tmp_dir + "/manifest.json";
  {
    std::ofstream out(manifest_path, std::ios::binary | std::ios::trunc);
    out << manifest.dump(2) << "\n";
    out.flush();
    if (!out) throw std::runtime_error(manifest_path + ": write failed (" + errno_text() + ")");
  }
  files::fsync_path(manifest_path);
  files::fsync_path(tmp_dir);

  // Move an existing checkpoint of the same step aside only now that the new one is complete.
  const std::string old_dir = final_dir + ".old";
  const bool replacing = files::exists(final_dir);
  if (replacing) {
    files::remove_tree(old_dir);
    if (::rename(final_dir.c_str(), old_dir.c_str()) != 0)
      throw std::runtime_error(final_dir + ": cannot move aside (" + errno_text() + ")");
  }
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    throw std::runtime_error(final_dir + ": cannot rename into place (" + errno_text() + ")");
  files::fsync_path(root);
  if (replacing) files::remove_tree(old_dir);
  saved.dir = final_dir;
  return saved;
}

CheckpointData load_checkpoint(const std::string& dir) {
  const std::string manifest_path = dir + "/manifest.json";
  std::ifstream in(manifest_path, std::ios::binary);
  if (!in) throw std::runtime_error(manifest_path + ": missing (" + errno_text() + "); the checkpoint is incomplete");
  nlohmann::json manifest;
  try {
    in >> manifest;
  } catch (const std::exception& e) {
    throw std::runtime_error(manifest_path + ": not valid JSON (" + e.what() + ")");
  }
  if (manifest.value("format", "") != "deltadeck-checkpoint")
    throw std::runtime_error(manifest_path + ": not a deltadeck checkpoint manifest");
  if (manifest.value("version", 0) != CHECKPOINT_VERSION)
    throw std::runtime_error(manifest_path + ": version " + std::to_string(manifest.value("version", 0)) +
                             ", this program reads version " + std::to_string(CHECKPOINT_VERSION));
  for (const char* file : {"model.safetensors", "state.safetensors"}) {
    const std::string path = dir + "/" + file;
    if (!manifest.contains("files") || !manifest["files"].contains(file))
      throw std::runtime_error(manifest_path + ": lists no " + file);
    const auto& entry = manifest["files"][file];
    const int64_t size = files::file_size(path);
    if (size < 0) throw std::runtime_error(path + ": missing (" + errno_text() + ")");
    const int64_t expected_bytes = entry.at("bytes").get<int64_t>();
    if (size != expected_bytes)
      throw std::runtime_error(path + ": size " + std::to_string(size) + " bytes, manifest says " +
                               std::to_string(expected_bytes));
    const std::string actual = storage::sha256_file(path);
    const std::string expected = entry.at("sha256").get<std::string>();
    if (actual != expected)
      throw std::runtime_error(path + ": checksum mismatch (expected sha256 " + expected + ", got " + actual + ")");
  }
  CheckpointData data;
  data.step = manifest.at("step").get<int64_t>();
  const std::string wpath = dir + "/model.safetensors", spath = dir + "/state.safetensors";
  auto wf = storage::SafetensorsFile::read(wpath);
  auto sf = storage::SafetensorsFile::read(spath);
  data.weights = read_tensors(wf, wpath);
  data.state = read_tensors(sf, spath);
  data.meta = sf.metadata();
  const auto& wmeta = wf.metadata();
  if (auto it = wmeta.find("config.toml"); it != wmeta.end()) data.config_toml = it->second;
  return data;
}

std::string find_checkpoint(const std::string& path) {
  if (files::exists(path + "/manifest.json")) return path;
  if (!files::is_dir(path)) throw std::runtime_error(path + ": no such checkpoint or run directory");
  for (const std::string& root : {path + "/checkpoints", path}) {
    auto all = list_checkpoints(root);
    if (!all.empty()) return all.back().second;
  }
  throw std::runtime_error(path + ": holds no complete checkpoint (expected step_XXXXXXXX/manifest.json under it or "
                           "under its checkpoints/ folder)");
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& name : files::list_dir(root)) {
    const std::string path = root + "/" + name;
    if (name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos || !files::is_dir(path)) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), path);
    } catch (const std::exception&) {
      continue;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> prune_checkpoints(const std::string& root, int64_t keep, int64_t protected_step) {
  auto all = list_checkpoints(root);
  std::vector<int64_t> removed;
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 1)) < all.size(); ++i) {
    if (all[i].first == protected_step) continue;
    if (files::remove_tree(all[i].second)) removed.push_back(all[i].first);
  }
  return removed;
}

}  // namespace trainer

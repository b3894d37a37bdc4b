#include "trainer/checkpoint.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "storage/file_util.h"
#include "storage/safetensors.h"
#include "storage/sha256.h"

namespace trainer {

namespace {

constexpr int CHECKPOINT_VERSION = 1;

namespace files = storage::files;

// A committed checkpoint that a save of the same step moves aside until its own commit.
constexpr const char* kMovedAside = ".old";
// A pruned checkpoint between its rename and its removal.
constexpr const char* kBeingDeleted = ".deleting";

// "step_<something><suffix>": a checkpoint folder renamed with that suffix.
bool is_step_with_suffix(const std::string& name, const std::string& suffix) {
  return name.rfind("step_", 0) == 0 && name.size() > suffix.size() + 5 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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
  return write_weights_file(storage::posix_io(), path, tensors, meta, nullptr);
}

int64_t write_weights_file(storage::FileIo& io, const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& meta, std::string* sha256) {
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
  return storage::write_safetensors(io, path, views, meta, sha256);
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


std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> bytes;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": missing (" + errno_text() + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat (" + why + ")");
  }
  bytes.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string why = errno_text();
      ::close(fd);
      throw std::runtime_error(path + ": read failed (" + why + ")");
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  bytes.resize(got);
  return bytes;
}

// The manifest of dir, checked for shape; throws naming the manifest and what is wrong with it.
nlohmann::json read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!files::exists(path))
    throw std::runtime_error(path + ": missing; the save did not finish (no committed manifest)");
  const int64_t size = files::file_size(path);
  if (size == 0) throw std::runtime_error(path + ": empty (0 bytes); the checkpoint cannot be verified");
  const std::vector<uint8_t> bytes = read_file(path);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  // A field of the wrong JSON type (a hand-edited manifest, "version": "2") throws nlohmann's
  // type_error, which would not name the file.
  try {
    if (!manifest.is_object() || manifest.value("format", "") != "deltadeck-checkpoint")
      throw std::runtime_error(path + ": not a deltadeck checkpoint manifest");
    if (manifest.value("version", 0) != CHECKPOINT_VERSION)
      throw std::runtime_error(path + ": version " + manifest["version"].dump() + ", this program reads version " +
                               std::to_string(CHECKPOINT_VERSION));
    for (const char* file : {"model.safetensors", "state.safetensors"}) {
      const nlohmann::json* entry = manifest.contains("files") && manifest["files"].is_object() &&
                                            manifest["files"].contains(file)
                                        ? &manifest["files"][file]
                                        : nullptr;
      if (!entry || !entry->is_object() || !entry->contains("bytes") || !(*entry)["bytes"].is_number_integer() ||
          !entry->contains("sha256") || !(*entry)["sha256"].is_string())
        throw std::runtime_error(path + ": lists no bytes (an integer) and sha256 (a string) for " + file);
    }
    if (!manifest.contains("step") || !manifest["step"].is_number_integer())
      throw std::runtime_error(path + ": has no step");
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": malformed (" + e.what() + ")");
  }
  return manifest;
}

// Throws naming the file when its size or digest differs from the manifest's entry.
void check_file(const std::string& path, const nlohmann::json& entry, int64_t size, const std::string& digest) {
  const int64_t expected_bytes = entry.at("bytes").get<int64_t>();
  if (size != expected_bytes)
    throw std::runtime_error(path + ": size " + std::to_string(size) + " bytes, the manifest expects " +
                             std::to_string(expected_bytes) + " (truncated or replaced)");
  const std::string expected = entry.at("sha256").get<std::string>();
  if (digest != expected)
    throw std::runtime_error(path + ": checksum mismatch (expected sha256 " + expected + ", actual " + digest + ")");
}

}  // namespace

SavedCheckpoint save_checkpoint(const std::string& root, const CheckpointData& data, storage::FileIo& io,
                                const std::function<void()>& before_commit) {
  io.make_dirs(root);
  const std::string final_dir = root + "/" + step_dir_name(data.step);
  const std::string tmp_dir = final_dir + ".tmp";
  const std::string old_dir = final_dir + kMovedAside;
  // A leftover of a crashed or failed save of this step: saving the same step again starts clean.
  io.remove_tree(tmp_dir);
  io.make_dirs(tmp_dir);

  nlohmann::json manifest;
  manifest["format"] = "deltadeck-checkpoint";
  manifest["version"] = CHECKPOINT_VERSION;
  manifest["step"] = data.step;
  if (!data.compat.empty()) manifest["compat"] = data.compat;
  std::map<std::string, std::string> weights_meta{{"format", "deltadeck-weights"},
                                                  {"version", std::to_string(CHECKPOINT_VERSION)}};
  if (!data.config_toml.empty()) weights_meta["config.toml"] = data.config_toml;
  std::map<std::string, std::string> state_meta = data.meta;
  state_meta["format"] = "deltadeck-state";
  state_meta["version"] = std::to_string(CHECKPOINT_VERSION);
  state_meta["step"] = std::to_string(data.step);

  SavedCheckpoint saved;
  bool moved_aside = false;
  try {
    for (const auto& [file, tensors, meta] :
         {std::tuple{std::string("model.safetensors"), &data.weights, &weights_meta},
          std::tuple{std::string("state.safetensors"), &data.state, &state_meta}}) {
      const std::string path = tmp_dir + "/" + file;
      std::string sha;
      const int64_t bytes = write_weights_file(io, path, *tensors, *meta, &sha);  // fsyncs the file
      manifest["files"][file] = {{"bytes", bytes}, {"sha256", sha}};
      saved.bytes += bytes;
      if (file == "model.safetensors") saved.sha256 = sha;
    }
    // The manifest goes in by rename, so a manifest.json is always whole.
    const std::string manifest_tmp = tmp_dir + "/manifest.json.tmp";
    storage::write_text_file(io, manifest_tmp, manifest.dump(2) + "\n");
    io.rename(manifest_tmp, tmp_dir + "/manifest.json");
    io.fsync_dir(tmp_dir);
    if (before_commit) before_commit();
    // An existing checkpoint of the same step is moved aside only now that the new one is complete.
    if (files::exists(final_dir)) {
      io.remove_tree(old_dir);
      io.rename(final_dir, old_dir);
      moved_aside = true;
    }
    io.rename(tmp_dir, final_dir);
    io.fsync_dir(root);
  } catch (...) {
    // Best effort: a process that is going down (or a disk that refuses) leaves these to the next save.
    try {
      io.remove_tree(tmp_dir);
      if (moved_aside && !files::exists(final_dir)) io.rename(old_dir, final_dir);
    } catch (const std::exception&) {
    }
    throw;
  }
  if (moved_aside) {
    try {
      io.remove_tree(old_dir);
    } catch (const std::exception&) {
      // Committed already; a stray ".old" beside the new step_X is never chosen; the next save removes it.
    }
  }
  saved.dir = final_dir;
  return saved;
}

CheckpointData load_checkpoint(const std::string& dir) {
  const nlohmann::json manifest = read_manifest(dir);
  CheckpointData data;
  data.step = manifest.at("step").get<int64_t>();
  std::map<std::string, storage::SafetensorsFile> parsed;
  for (const char* file : {"model.safetensors", "state.safetensors"}) {
    const std::string path = dir + "/" + file;
    if (!files::exists(path)) throw std::runtime_error(path + ": missing (listed in the manifest)");
    std::vector<uint8_t> bytes = read_file(path);
    check_file(path, manifest["files"][file], static_cast<int64_t>(bytes.size()),
               storage::sha256_hex(bytes.data(), bytes.size()));
    parsed.emplace(file, storage::SafetensorsFile::parse(path, std::move(bytes)));
  }
  const auto& wf = parsed.at("model.safetensors");
  const auto& sf = parsed.at("state.safetensors");
  data.weights = read_tensors(wf, dir + "/model.safetensors");
  data.state = read_tensors(sf, dir + "/state.safetensors");
  data.meta = sf.metadata();
  const auto& wmeta = wf.metadata();
  if (auto it = wmeta.find("config.toml"); it != wmeta.end()) data.config_toml = it->second;
  if (manifest.contains("compat")) data.compat = manifest["compat"].get<std::map<std::string, std::string>>();
  return data;
}

std::string checkpoint_problem(const std::string& dir) {
  try {
    const nlohmann::json manifest = read_manifest(dir);
    for (const char* file : {"model.safetensors", "state.safetensors"}) {
      const std::string path = dir + "/" + file;
      const int64_t size = files::file_size(path);
      if (size < 0) return path + ": missing (listed in the manifest)";
      check_file(path, manifest["files"][file], size,
                 size == manifest["files"][file].at("bytes").get<int64_t>() ? storage::sha256_file(path) : "");
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::map<std::string, std::string> read_compat(const std::string& dir) {
  const nlohmann::json manifest = read_manifest(dir);
  if (!manifest.contains("compat") || !manifest["compat"].is_object()) return {};
  std::map<std::string, std::string> out;
  for (auto it = manifest["compat"].begin(); it != manifest["compat"].end(); ++it)
    if (it.value().is_string()) out[it.key()] = it.value().get<std::string>();
  return out;
}

namespace {

// "step_X.old" directories with a manifest and no "step_X" beside them (choose_checkpoint).
std::vector<std::pair<int64_t, std::string>> moved_aside_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  const std::string suffix = kMovedAside;
  for (const auto& name : files::list_dir(root)) {
    if (!is_step_with_suffix(name, suffix)) continue;
    const std::string base = name.substr(0, name.size() - suffix.size());
    if (base.find('.') != std::string::npos || files::exists(root + "/" + base)) continue;
    const std::string dir = root + "/" + name;
    if (!files::is_dir(dir) || !files::exists(dir + "/manifest.json")) continue;
    try {
      out.emplace_back(std::stoll(base.substr(5)), dir);
    } catch (const std::exception&) {
    }
  }
  return out;
}

}  // namespace

std::string restored_name(const std::string& dir) {
  const std::string suffix = kMovedAside;
  if (dir.size() <= suffix.size() || dir.compare(dir.size() - suffix.size(), suffix.size(), suffix) != 0) return dir;
  const std::string to = dir.substr(0, dir.size() - suffix.size());
  if (files::exists(to)) return dir;  // chosen by its own path beside a step_X: resumed from as it is
  return to;
}

std::string restore_moved_aside(const std::string& dir) {
  const std::string to = restored_name(dir);
  if (to == dir) return dir;
  if (std::rename(dir.c_str(), to.c_str()) != 0)
    throw std::runtime_error("cannot rename " + dir + " back to " + to + ": " + std::strerror(errno));
  files::fsync_path(files::parent_dir(to));
  return to;
}

CheckpointChoice choose_checkpoint(const std::string& path) {
  CheckpointChoice out;
  if (files::exists(path + "/manifest.json")) {
    out.dir = path;
    return out;
  }
  if (!files::is_dir(path)) throw std::runtime_error(path + ": no such checkpoint or run directory");
  for (const std::string& root : {path + "/checkpoints", path}) {
    std::vector<std::string> unfinished;
    for (const auto& name : files::list_dir(root)) {
      if (name.rfind("step_", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
        unfinished.push_back(name);
    }
    std::sort(unfinished.rbegin(), unfinished.rend());
    for (const auto& name : unfinished)
      out.skipped.push_back(root + "/" + name + ": an unfinished save (never committed); ignored");
    // Directories named step_X without a manifest were not committed by this program's saves
    // (or lost it since): listed as skipped too.
    for (const auto& name : files::list_dir(root)) {
      const std::string dir = root + "/" + name;
      if (name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos && files::is_dir(dir) &&
          !files::exists(dir + "/manifest.json"))
        out.skipped.push_back(dir + "/manifest.json: missing; the save did not finish (no committed manifest)");
    }
    auto all = list_checkpoints(root);
    for (const auto& [step, dir] : moved_aside_checkpoints(root)) all.emplace_back(step, dir);
    std::sort(all.begin(), all.end());
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const std::string problem = checkpoint_problem(it->second);
      if (problem.empty()) {
        out.dir = it->second;
        return out;
      }
      out.skipped.push_back(problem);
    }
    if (!all.empty()) return out;
  }
  return out;
}

std::string find_checkpoint(const std::string& path) {
  const CheckpointChoice c = choose_checkpoint(path);
  if (!c.dir.empty()) return c.dir;
  std::string why;
  for (const auto& s : c.skipped) why += "\n  skipped " + s;
  throw std::runtime_error(path + ": holds no usable checkpoint (expected step_XXXXXXXX/manifest.json under it or "
                           "under its checkpoints/ folder)" + why);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& name : files::list_dir(root)) {
    const std::string path = root + "/" + name;
    if (name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos || !files::is_dir(path)) continue;
    if (!files::exists(path + "/manifest.json")) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), path);
    } catch (const std::exception&) {
      continue;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<int64_t, std::string>> set_aside_checkpoints_after(const std::string& root, int64_t from) {
  std::vector<std::pair<int64_t, std::string>> out;
  // A step_X.old (a re-save cut short) is a resume's choice as much as a step_X is.
  auto all = list_checkpoints(root);
  for (const auto& moved : moved_aside_checkpoints(root)) all.push_back(moved);
  std::sort(all.begin(), all.end());
  for (const auto& [step, dir] : all) {
    if (step <= from) continue;
    std::string to = dir + ".superseded";
    for (int k = 2; files::exists(to); ++k) to = dir + ".superseded-" + std::to_string(k);
    if (std::rename(dir.c_str(), to.c_str()) != 0) {
      throw std::runtime_error("cannot set aside " + dir + " (a checkpoint after step " + std::to_string(from) +
                               " that a later resume would choose): " + std::strerror(errno));
    }
    out.emplace_back(step, to);
  }
  if (!out.empty()) files::fsync_path(root);
  return out;
}

std::vector<int64_t> prune_checkpoints(const std::string& root, int64_t keep, int64_t protected_step,
                                       storage::FileIo& io) {
  // Leftovers of a removal cut short (below): no checkpoints any more, removed again.
  for (const auto& name : files::list_dir(root)) {
    if (!is_step_with_suffix(name, kBeingDeleted)) continue;
    try {
      io.remove_tree(root + "/" + name);
    } catch (const std::exception&) {
    }
  }
  auto all = list_checkpoints(root);
  std::vector<int64_t> removed;
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 1)) < all.size(); ++i) {
    if (all[i].first == protected_step) continue;
    // Renamed first, in one atomic step: a removal cut short (a crash, a file that cannot go)
    // leaves a step_X.deleting, never a step_X that lost its manifest and lingers half-deleted.
    const std::string doomed = all[i].second + kBeingDeleted;
    try {
      io.rename(all[i].second, doomed);
    } catch (const std::exception&) {
      continue;  // left for the next save's pruning; the newer checkpoints are what a resume needs
    }
    removed.push_back(all[i].first);
    try {
      io.remove_tree(doomed);
    } catch (const std::exception&) {
      // Removed at the next pruning.
    }
  }
  if (!removed.empty()) {
    try {
      io.fsync_dir(root);
    } catch (const std::exception&) {
    }
  }
  return removed;
}

std::shared_ptr<const CheckpointData> load_checkpoint_shared(const std::string& dir) {
  // One load in progress or alive per folder. The registry holds it weakly: the data goes when the
  // ranks holding it let go, and the entry itself when its last caller returns.
  struct Load {
    std::mutex mu;
    bool done = false;
    std::shared_ptr<const CheckpointData> data;
    std::exception_ptr error;
  };
  struct Entry {
    std::weak_ptr<Load> loading;
    std::weak_ptr<const CheckpointData> data;
  };
  static std::mutex registry_mu;
  static std::map<std::string, Entry> registry;
  std::shared_ptr<Load> load;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    Entry& e = registry[dir];
    if (auto alive = e.data.lock()) return alive;
    load = e.loading.lock();
    if (!load) {
      load = std::make_shared<Load>();
      e.loading = load;
    }
  }
  std::lock_guard<std::mutex> lock(load->mu);
  if (!load->done) {
    try {
      load->data = std::make_shared<const CheckpointData>(load_checkpoint(dir));
    } catch (...) {
      load->error = std::current_exception();
    }
    load->done = true;
    std::lock_guard<std::mutex> reg(registry_mu);
    if (load->data) registry[dir].data = load->data;
    // Entries of freed data are dropped as they are found, so the map stays as small as the loads alive.
    for (auto it = registry.begin(); it != registry.end();) {
      if (it->second.data.expired() && it->second.loading.expired() && it->first != dir) it = registry.erase(it);
      else ++it;
    }
  }
  if (load->error) std::rethrow_exception(load->error);
  return load->data;
}

}  // namespace trainer

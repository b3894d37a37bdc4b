#include "app/gui_launch.h"

#include <signal.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "storage/file_util.h"
#include "storage/run_store.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/device.h"
#include "trainer/session.h"

namespace app {

std::vector<std::string> list_devices() {
  std::vector<std::string> out;
  out.push_back("cpu (" + std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " cores)");
  try {
    for (const auto& d : trainer::rank_devices("all")) out.push_back(trainer::describe_device(d));
  } catch (const std::exception&) {
    // No GPU: the CPU is the only device.
  }
  return out;
}

std::vector<std::string> check_runnable(trainer::RunConfig& cfg) {
  std::vector<std::string> errors = trainer::check_device(cfg);
  for (auto& e : trainer::resolve_config(cfg)) errors.push_back(std::move(e));
  return errors;
}

int64_t world_size_of(const trainer::RunConfig& cfg) {
  return static_cast<int64_t>(trainer::rank_devices(cfg.run.devices).size());
}

PreparedRun prepare_resume(const std::string& db_path, int64_t run_id, int64_t step,
                           const std::vector<std::string>& overrides) {
  PreparedRun out;
  out.db_path = db_path;
  out.store = storage::RunStore::open(db_path);
  const auto run = out.store->run(run_id);
  if (!run) throw std::runtime_error("run " + std::to_string(run_id) + " is not in " + db_path);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  if (run->status == "running" && run->pid != 0 && run->host == host && kill(static_cast<pid_t>(run->pid), 0) == 0)
    throw std::runtime_error("run '" + run->name + "' is still running (pid " + std::to_string(run->pid) + ")");
  const std::string runs_dir = storage::files::parent_dir(db_path);
  out.run_id = run_id;
  out.run_dir = (runs_dir.empty() ? "." : runs_dir) + "/" + run->name;
  const std::string where = "run '" + run->name + "' config";
  trainer::ConfigResult parsed = trainer::parse_config(out.store->run_config_toml(run_id), where, overrides);
  if (!parsed.ok()) throw std::runtime_error(where + ": " + parsed.errors.front());
  trainer::RunConfig cfg = parsed.config;
  cfg.run.runs_dir = runs_dir.empty() ? "." : runs_dir;
  if (auto errors = check_runnable(cfg); !errors.empty()) throw std::runtime_error(where + ": " + errors.front());
  // The checkpoint directories on disk are the truth (a record may outlive a pruned directory).
  for (const auto& [s, dir] : trainer::list_checkpoints(out.run_dir + "/checkpoints"))
    if (step < 0 || s == step) out.resume_from = dir;
  if (out.resume_from.empty())
    throw std::runtime_error("run '" + run->name + "' has no complete checkpoint" +
                             (step >= 0 ? " at step " + std::to_string(step) : "") + " under " + out.run_dir +
                             "/checkpoints");
  const int64_t from = std::stoll(out.resume_from.substr(out.resume_from.rfind("step_") + 5));
  out.store->reopen_run(run_id);
  const int64_t dropped = out.store->remove_metrics_after(run_id, from);
  out.store->add_event({run_id, from, "info",
                        "resumed from " + out.resume_from + " in the desktop app (" + std::to_string(dropped) +
                            " metric rows after step " + std::to_string(from) + " replaced by the resumed run)",
                        ""});
  out.cfg = std::move(cfg);
  return out;
}

}  // namespace app

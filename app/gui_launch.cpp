#include "app/gui_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "app/run_owner.h"
#include "app/run_record.h"
#include "storage/file_util.h"
#include "storage/run_store.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/device.h"
#include "trainer/resume_check.h"
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
  // After a multi-GPU failure this process does no more CUDA work (the engine would refuse the run
  // once started; refusing here keeps the run from being recorded at all).
  if (const std::string why = trainer::cuda_blocked_reason(); !why.empty() && errors.empty()) {
    try {
      const auto devices = trainer::rank_devices(cfg.run.devices);
      if (!devices.empty() && devices.front().is_cuda())
        errors.push_back("run.devices: this process can no longer use the GPU: " + why +
                         "; start GPU runs in a new deltadeck process, or restart the app");
    } catch (const std::exception&) {
      // check_device reported the devices already.
    }
  }
  return errors;
}

int64_t world_size_of(const trainer::RunConfig& cfg) {
  return static_cast<int64_t>(trainer::rank_devices(cfg.run.devices).size());
}

namespace {

// The step of a checkpoint directory ".../step_00000100" (-1 when the name has none).
int64_t step_of(const std::string& dir) {
  const auto at = dir.rfind("step_");
  if (at == std::string::npos) return -1;
  try {
    return std::stoll(dir.substr(at + 5));
  } catch (const std::exception&) {
    return -1;
  }
}

void resolve(ResumeOutcome& out, PreparedRun& prep, int64_t run_id, int64_t step,
             const std::vector<std::string>& overrides) {
  const auto run = prep.store->run(run_id);
  if (!run) {
    out.error = "run " + std::to_string(run_id) + " is not in " + prep.db_path;
    return;
  }
  out.run_name = run->name;
  if (const std::string busy = storage::still_running(*run); !busy.empty()) {
    out.error = "run '" + run->name + "' " + busy;
    return;
  }
  const std::string runs_dir = storage::files::parent_dir(prep.db_path);
  prep.run_id = run_id;
  const std::string where = "run '" + run->name + "' config";
  trainer::ConfigResult parsed = trainer::parse_config(prep.store->run_config_toml(run_id), where, overrides);
  if (!parsed.ok()) {
    out.error = where + ": " + parsed.errors.front();
    return;
  }
  trainer::RunConfig cfg = parsed.config;
  cfg.run.runs_dir = runs_dir.empty() ? "." : runs_dir;
  prep.run_dir = trainer::run_folder(cfg, run->name);
  if (const std::string busy = run_folder_busy(prep.run_dir, /*wait=*/false, nullptr); !busy.empty()) {
    out.error = "run '" + run->name + "' " + busy;
    return;
  }
  // The run's record beside its checkpoints further along than this database's copy: a job of
  // another database (a cluster chain sharing run.checkpoint_dir) went on with the run. Resuming
  // this copy would rewrite the record from this database's rows, dropping that job's metrics; the
  // command line's resume brings the record into this database first.
  const std::string record = prep.run_dir + "/" + storage::RUN_RECORD_FILE;
  if (storage::files::exists(record)) {
    try {
      const storage::ImportedRun there = read_run_record(record);
      if (same_run(there.record, *run) && there.record.last_step > run->last_step) {
        out.error = record + " is further along than this database's copy of run '" + run->name + "' (step " +
                    std::to_string(there.record.last_step) + " against " + std::to_string(run->last_step) +
                    "): a job of another database went on with it. Resume it once from the command line, which "
                    "brings the record in: deltadeck train --no-gui --resume " + run->name + " --runs-dir " +
                    (runs_dir.empty() ? "." : runs_dir);
        return;
      }
    } catch (const std::exception&) {
      // An unreadable record: this copy is resumed, as the command line does (with a warning there).
    }
  }
  if (auto errors = check_runnable(cfg); !errors.empty()) {
    out.error = where + ": " + errors.front();
    out.gpu_blocked = errors.front().find("can no longer use the GPU") != std::string::npos;
    return;
  }
  // The checkpoint directories on disk are the truth (a record may outlive a pruned directory);
  // each is verified against its manifest before it is chosen.
  if (step < 0) {
    const trainer::CheckpointChoice choice = trainer::choose_checkpoint(prep.run_dir);
    out.skipped = choice.skipped;
    out.checkpoint = choice.dir;
    if (choice.dir.empty()) {
      out.error = "run '" + run->name + "' has no usable checkpoint under " + prep.run_dir + "/checkpoints";
      return;
    }
  } else {
    for (const auto& [s, dir] : trainer::list_checkpoints(prep.run_dir + "/checkpoints"))
      if (s == step) out.checkpoint = dir;
    if (out.checkpoint.empty()) {
      out.error = "run '" + run->name + "' has no complete checkpoint at step " + std::to_string(step) + " under " +
                  prep.run_dir + "/checkpoints";
      return;
    }
    if (const std::string why = trainer::checkpoint_problem(out.checkpoint); !why.empty()) {
      out.error = out.checkpoint + ": " + why;
      return;
    }
  }
  out.mismatches =
      trainer::resume_mismatches(trainer::read_compat(out.checkpoint), trainer::resume_fingerprint(cfg, world_size_of(cfg)));
  if (!out.mismatches.empty()) return;
  prep.resume_from = out.checkpoint;
  prep.cfg = std::move(cfg);
}

}  // namespace

ResumeOutcome prepare_resume(const std::string& db_path, int64_t run_id, int64_t step,
                             const std::vector<std::string>& overrides) {
  ResumeOutcome out;
  try {
    auto prep = std::make_unique<PreparedRun>();
    prep->db_path = db_path;
    prep->store = storage::RunStore::open(db_path);
    resolve(out, *prep, run_id, step, overrides);
    if (!out.error.empty() || !out.mismatches.empty()) return out;
    // Nothing was written before this point: a refused resume leaves the run as it was.
    const int64_t from = step_of(prep->resume_from);
    // A checkpoint a crash left moved aside mid-save gets its name back before the run saves again.
    const std::string chosen = prep->resume_from;
    prep->resume_from = trainer::restore_moved_aside(chosen);
    if (prep->resume_from != chosen)
      prep->store->add_event({run_id, from, "info", "resume renamed " + chosen + " back to " + prep->resume_from +
                                                        " (a save of the same step was cut short)", ""});
    // Checkpoints after the one resumed from belong to the attempt being abandoned: the newest of
    // them would be the next resume's choice although its metrics are superseded.
    for (const auto& [s, to] : trainer::set_aside_checkpoints_after(prep->run_dir + "/checkpoints", from)) {
      prep->store->remove_checkpoint(run_id, s);
      out.set_aside.push_back(to);
    }
    prep->store->reopen_run(run_id);
    record_resumed_config(*prep, from);
    for (const std::string& k : out.skipped) prep->store->add_event({run_id, from, "warn", "resume skipped " + k, ""});
    for (const std::string& k : out.set_aside)
      prep->store->add_event({run_id, from, "info",
                              "resume from step " + std::to_string(from) + " set aside the abandoned attempt's " + k, ""});
    const int64_t superseded = prep->store->supersede_metrics_after(run_id, from);
    prep->store->add_event({run_id, from, "info",
                            "resumed from " + prep->resume_from + " in the desktop app (" + std::to_string(superseded) +
                                " metric rows after step " + std::to_string(from) +
                                " marked superseded; the resumed run writes them again)",
                            ""});
    out.prep = std::move(prep);
  } catch (const std::exception& e) {
    out.error = e.what();
    out.prep.reset();
  }
  return out;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

int spawn_resume_process(const std::string& exe, int64_t run_id, const std::string& runs_dir,
                         const std::string& log_path) {
  const std::vector<std::string> args = {exe, "train", "--no-gui", "--resume", std::to_string(run_id), "--runs-dir",
                                         runs_dir};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    if (kv.rfind("DELTADECK_FAULT=", 0) == 0 || kv.rfind("DELTADECK_IO_FAULT=", 0) == 0) continue;
    envp.push_back(*e);
  }
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
  // Nothing of this process (the database, the X connection) leaks into the child.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
  // A session of its own: the terminal's Ctrl-C and this window's stop signals are not its business.
  // Signal handlers and mask as a fresh program's.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    throw std::runtime_error("cannot start " + exe + " (output to " + log_path + "): " + std::strerror(rc));
  return static_cast<int>(pid);
}

}  // namespace app

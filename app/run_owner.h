// Which process trains a run now, written in the run's folder beside its checkpoints
// (storage::RUN_OWNER_FILE). Node 0 writes it as the run starts, stamps it every storage::HEARTBEAT_EVERY_S
// seconds and removes it at the end. A run whose folder lies under a shared run.checkpoint_dir can
// be known to two databases (each job of a cluster chain keeps its own on node-local disk), and
// neither sees the other's process; a resume and a delete read this file so that two processes
// never write, or remove, one run's checkpoints at once. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "storage/run_store.h"

namespace app {

struct RunOwner {
  std::string host;
  int64_t pid = 0;
  std::string proc_ns;       // storage::this_process_namespace() of that process
  std::string database;      // the database that records the run there
  std::string heartbeat_at;  // UTC, ISO 8601: its last stamp
};

// This process, training a run recorded in `database`.
RunOwner this_process_owner(const std::string& database);

// Writes the file in run_dir naming `owner`, stamped now, whole or not at all (a temporary file of
// this process renamed over it). Throws std::runtime_error naming the file.
void write_run_owner(const std::string& run_dir, RunOwner owner);

// The owner the file in run_dir names; nullopt when there is none, or it cannot be read or parsed
// (a file cut short by a crash tells nothing).
std::optional<RunOwner> read_run_owner(const std::string& run_dir);

// Removes the file where it still names `me` (a later process may have taken the run over).
void release_run_owner(const std::string& run_dir, const RunOwner& me);

// Why the run in run_dir must not be resumed or deleted now, or "" when no other process trains it:
// the file names a process alive on this machine (same host and pid namespace), or another
// machine's with a stamp in the last storage::RUN_QUIET_S seconds (by this machine's clock: the
// nodes' clocks are taken to agree within a minute, as NTP keeps them). Such a stamp may be the
// last of a process that was killed: with `wait`, this waits (telling `say` once, and setting
// *waited) until the file is stamped again (the process lives: busy), removed (it ended: free) or
// quiet past RUN_QUIET_S (it is gone: free), polling every `poll_ms`; a file unreadable meanwhile
// is read again. The run folder may have changed while it waited (the other process's last save):
// a caller that read anything of it before reads it again. `now` gives the time (tests move it).
std::string run_folder_busy(const std::string& run_dir, bool wait, const std::function<void(const std::string&)>& say,
                            bool* waited = nullptr, int poll_ms = 2000,
                            const std::function<std::time_t()>& now = nullptr);

}  // namespace app

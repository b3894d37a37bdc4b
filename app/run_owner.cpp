#include "app/run_owner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "storage/file_io.h"
#include "storage/file_util.h"
#include "storage/run_store.h"

namespace app {

namespace {

std::string owner_file(const std::string& run_dir) { return run_dir + "/" + storage::RUN_OWNER_FILE; }

bool same_process(const RunOwner& a, const RunOwner& b) {
  return a.host == b.host && a.pid == b.pid && a.proc_ns == b.proc_ns;
}

std::string describe(const RunOwner& o) {
  return "pid " + std::to_string(o.pid) + " on " + o.host + ", recording it in " + o.database;
}

}  // namespace

RunOwner this_process_owner(const std::string& database) {
  RunOwner o;
  o.host = storage::this_host();
  o.pid = static_cast<int64_t>(::getpid());
  o.proc_ns = storage::this_process_namespace();
  o.database = database;
  return o;
}

void write_run_owner(const std::string& run_dir, RunOwner owner) {
  owner.heartbeat_at = storage::now_utc();
  const nlohmann::json doc = {{"host", owner.host},         {"pid", owner.pid},
                              {"proc_ns", owner.proc_ns},   {"database", owner.database},
                              {"heartbeat_at", owner.heartbeat_at}};
  const std::string path = owner_file(run_dir), tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    // Not fsynced: a stamp lost to a crash only makes the owner look gone sooner, which it is.
    storage::FileIo& io = storage::posix_io();
    const std::string text = doc.dump(1) + "\n";
    const int fd = io.create(tmp);
    io.write(fd, tmp, text.data(), text.size(), 0);
    io.close(fd, tmp);
    io.rename(tmp, path);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    throw std::runtime_error(std::string("the run's owner file: ") + e.what());
  }
}

std::optional<RunOwner> read_run_owner(const std::string& run_dir) {
  std::ifstream in(owner_file(run_dir), std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  RunOwner o;
  try {
    o.host = doc.at("host").get<std::string>();
    o.pid = doc.at("pid").get<int64_t>();
    o.proc_ns = doc.at("proc_ns").get<std::string>();
    o.database = doc.at("database").get<std::string>();
    o.heartbeat_at = doc.at("heartbeat_at").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return o;
}

void release_run_owner(const std::string& run_dir, const RunOwner& me) {
  const auto there = read_run_owner(run_dir);
  if (there && same_process(*there, me)) std::remove(owner_file(run_dir).c_str());
}

std::string run_folder_busy(const std::string& run_dir, bool wait, const std::function<void(const std::string&)>& say,
                            bool* waited, int poll_ms, const std::function<std::time_t()>& now) {
  const auto clock = [&] { return now ? now() : std::time(nullptr); };
  if (waited) *waited = false;
  auto owner = read_run_owner(run_dir);
  if (!owner || same_process(*owner, this_process_owner(""))) return "";
  const std::string file = owner_file(run_dir);
  switch (storage::process_liveness(owner->host, owner->pid, owner->proc_ns)) {
    case storage::Liveness::Alive: return "is being trained by " + describe(*owner) + " (" + file + ")";
    case storage::Liveness::Dead: return "";
    case storage::Liveness::Unknown: break;
  }
  // Another machine or container: only the stamps tell. ISO 8601 UTC stamps compare as text.
  const auto quiet = [&](const RunOwner& o) {
    return o.heartbeat_at < storage::utc_iso8601(clock() - storage::RUN_QUIET_S);
  };
  if (quiet(*owner)) return "";
  const std::string busy = "is being trained by " + describe(*owner) + ", last stamped " + owner->heartbeat_at + " (" +
                           file + "; a process that is gone is taken as ended " +
                           std::to_string(storage::RUN_QUIET_S) + " s after its last stamp)";
  if (!wait) return busy;
  say("run folder " + run_dir + ": " + describe(*owner) + " stamped it at " + owner->heartbeat_at +
      "; waiting for its next stamp (alive: this stops) or for " + std::to_string(storage::RUN_QUIET_S) +
      " s of quiet (gone: this goes on)");
  if (waited) *waited = true;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
    const auto seen = read_run_owner(run_dir);
    if (!seen) {
      if (!storage::files::exists(file)) return "";  // it ended and removed the file
      continue;                                      // unreadable for now: asked again
    }
    if (!same_process(*seen, *owner) || seen->heartbeat_at != owner->heartbeat_at)
      return "is being trained by " + describe(*seen) + ", stamped again at " + seen->heartbeat_at + " (" + file + ")";
    if (quiet(*seen)) return "";
  }
}

}  // namespace app

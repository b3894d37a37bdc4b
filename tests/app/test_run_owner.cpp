// The run folder's owner file (app/run_owner.h): which process trains the run, judged as a resume
// and a delete judge it: this process and dead ones free it, a live one on this machine holds it, and
// another machine's holds it while it stamps the file, with a wait that tells a killed process's
// last stamp from a live one's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

#include "app/run_owner.h"
#include "storage/file_util.h"
#include "storage/run_store.h"
#include "tests/support/temp_dir.h"

namespace {

using testing_support::TempDir;

// An owner file as another machine's process leaves it, stamped at `stamped`.
app::RunOwner elsewhere(std::time_t stamped) {
  app::RunOwner o;
  o.host = "node-far-away";
  o.pid = 4242;
  o.proc_ns = "boot pid:[1]";
  o.database = "/local/runs/deltadeck.db";
  o.heartbeat_at = storage::utc_iso8601(stamped);
  return o;
}

// Writes `o` with its own stamp (write_run_owner stamps "now"), renamed into place as the owner's
// process does, so that a reader never sees half a file.
void write_as_is(const TempDir& dir, const app::RunOwner& o) {
  dir.write("owner.tmp", "{\"host\": \"" + o.host + "\", \"pid\": " + std::to_string(o.pid) + ", \"proc_ns\": \"" +
                             o.proc_ns + "\", \"database\": \"" + o.database + "\", \"heartbeat_at\": \"" +
                             o.heartbeat_at + "\"}\n");
  ASSERT_EQ(std::rename(dir.file("owner.tmp").c_str(), dir.file(storage::RUN_OWNER_FILE).c_str()), 0);
}

TEST(RunOwner, WrittenReadBackAndReleasedOnlyByItsProcess) {
  TempDir dir;
  EXPECT_FALSE(app::read_run_owner(dir.path()));
  EXPECT_EQ(app::run_folder_busy(dir.path(), true, nullptr), "");
  const app::RunOwner me = app::this_process_owner("/runs/deltadeck.db");
  app::write_run_owner(dir.path(), me);
  const auto back = app::read_run_owner(dir.path());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->host, me.host);
  EXPECT_EQ(back->pid, static_cast<int64_t>(::getpid()));
  EXPECT_EQ(back->database, "/runs/deltadeck.db");
  EXPECT_FALSE(back->heartbeat_at.empty());
  // This process's own file does not hold it back (the desktop app resuming a run it trained).
  EXPECT_EQ(app::run_folder_busy(dir.path(), false, nullptr), "");
  // Another process's file stays when this one releases.
  write_as_is(dir, elsewhere(std::time(nullptr)));
  app::release_run_owner(dir.path(), me);
  EXPECT_TRUE(storage::files::exists(dir.file(storage::RUN_OWNER_FILE)));
  app::write_run_owner(dir.path(), me);
  app::release_run_owner(dir.path(), me);
  EXPECT_FALSE(storage::files::exists(dir.file(storage::RUN_OWNER_FILE)));
  // A file cut short tells nothing.
  dir.write(storage::RUN_OWNER_FILE, "{\"host\": \"n");
  EXPECT_FALSE(app::read_run_owner(dir.path()));
  EXPECT_EQ(app::run_folder_busy(dir.path(), false, nullptr), "");
}

TEST(RunOwner, AProcessOfThisMachineHoldsTheRunWhileItLives) {
  TempDir dir;
  app::RunOwner parent = app::this_process_owner("/other/deltadeck.db");
  parent.pid = static_cast<int64_t>(::getppid());  // alive, and not this process
  app::write_run_owner(dir.path(), parent);
  const std::string busy = app::run_folder_busy(dir.path(), true, nullptr);
  EXPECT_NE(busy.find("is being trained by pid " + std::to_string(parent.pid)), std::string::npos) << busy;
  EXPECT_NE(busy.find("/other/deltadeck.db"), std::string::npos) << busy;
  // A pid no process has.
  app::RunOwner gone = parent;
  gone.pid = 0x3fffffff;
  app::write_run_owner(dir.path(), gone);
  EXPECT_EQ(app::run_folder_busy(dir.path(), true, nullptr), "");
}

TEST(RunOwner, AnotherMachinesStampHoldsTheRunUntilItGoesQuiet) {
  TempDir dir;
  // Quiet longer than RUN_QUIET_S: gone.
  write_as_is(dir, elsewhere(std::time(nullptr) - storage::RUN_QUIET_S - 5));
  EXPECT_EQ(app::run_folder_busy(dir.path(), true, nullptr), "");
  // Recent, without waiting (a dry run, a delete): held.
  write_as_is(dir, elsewhere(std::time(nullptr) - 10));
  const std::string busy = app::run_folder_busy(dir.path(), false, nullptr);
  EXPECT_NE(busy.find("is being trained by pid 4242 on node-far-away"), std::string::npos) << busy;
  EXPECT_NE(busy.find("last stamped"), std::string::npos) << busy;
}

TEST(RunOwner, WaitingTellsALiveStampFromAKilledProcesssLast) {
  TempDir dir;
  const std::time_t t0 = std::time(nullptr);
  // Stamped again while the resume waits: the process lives.
  write_as_is(dir, elsewhere(t0 - 10));
  std::thread stamper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    write_as_is(dir, elsewhere(t0 + 20));
  });
  int said = 0;
  bool waited = false;
  const std::string busy = app::run_folder_busy(dir.path(), true, [&](const std::string&) { ++said; }, &waited, 10);
  stamper.join();
  EXPECT_NE(busy.find("stamped again at " + storage::utc_iso8601(t0 + 20)), std::string::npos) << busy;
  EXPECT_EQ(said, 1);
  EXPECT_TRUE(waited);

  // Never stamped again: the clock passes RUN_QUIET_S after the stamp and the run is free.
  write_as_is(dir, elsewhere(t0 - 10));
  std::atomic<int> polls{0};
  const auto clock = [&] { return t0 + 15 * static_cast<std::time_t>(polls++); };
  EXPECT_EQ(app::run_folder_busy(dir.path(), true, [](const std::string&) {}, nullptr, 1, clock), "");
  EXPECT_GE(polls.load(), static_cast<int>(storage::RUN_QUIET_S / 15));
  // The file removed while waiting (the run ended): free.
  write_as_is(dir, elsewhere(t0 - 10));
  std::thread remover([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::remove(dir.file(storage::RUN_OWNER_FILE).c_str());
  });
  EXPECT_EQ(app::run_folder_busy(dir.path(), true, [](const std::string&) {}, nullptr, 5), "");
  remover.join();
  // Unreadable for a moment (cut short, as by another writer's crash), then stamped again: busy.
  write_as_is(dir, elsewhere(t0 - 10));
  std::thread garbler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    dir.write(storage::RUN_OWNER_FILE, "{\"host\": \"n");
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    write_as_is(dir, elsewhere(t0 + 30));
  });
  EXPECT_NE(app::run_folder_busy(dir.path(), true, [](const std::string&) {}, nullptr, 5).find("stamped again"),
            std::string::npos);
  garbler.join();
}

}  // namespace

// GuiController: the desktop app's state and everything that feeds it, apart from the window.
// Each frame it copies the live run's snapshot from the RunHost (never waiting on the training
// loop), applies results of the background reader (its own read-only SQLite connection, polled
// through PRAGMA data_version), and after the panels have drawn carries out their actions: start or
// resume a run (a resume is prepared on a thread of its own: it hashes checkpoint files), resume
// one in a new process, send commands, edits and exports on worker threads, close the window.
// Main thread only, apart from the workers it owns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/gui_worker.h"
#include "ui/gui/gui_state.h"

namespace app {

class RunHost;

struct GuiOptions {
  std::string runs_dir = "runs";
  std::string config_path;               // the launcher's first draft; empty: the embedded demo config
  std::vector<std::string> overrides;    // --set section.key=value on that draft
  bool start = false;                    // start the draft at once (deltadeck train with a display)
  std::string resume;                    // resume this run at once (id, name, prefix or "latest")
  std::string assets_dir;                // where presets and fonts are
};

class GuiController {
 public:
  // wake: called from worker threads when a result is ready (glfwPostEmptyEvent).
  GuiController(GuiOptions opts, std::function<void()> wake);
  // A run still training is stopped with a checkpoint and waited for (RunHost's destructor), so
  // the frame loop destroys the controller only once ready_to_quit() (or exits without it).
  ~GuiController();
  GuiController(const GuiController&) = delete;
  GuiController& operator=(const GuiController&) = delete;

  ui::GuiState& state() { return state_; }
  // Before drawing a frame: live snapshot, worker results, scheduled polls, resume processes that
  // ended. `now` in seconds (glfwGetTime). Returns true when anything visible changed.
  bool update(double now);
  // After drawing: carries out GuiState::actions.
  void handle_actions();

  // The window's close button: quits when nothing is going; asks first while a run trains or an
  // export is written; a second close while the window waits for a run to stop quits at once.
  void request_close();
  // Stop the run with a checkpoint (if one trains here) and close once it has ended and the
  // exports are written; the window keeps drawing meanwhile. The close dialog's default, the first
  // stop signal, the end of a test script.
  void stop_and_close();

  // A run is training in this process (not yet ended).
  bool run_active() const;
  // The window may close: quit was asked for and nothing is left (the run has ended and is
  // recorded, exports and edits are done, no resume is being prepared).
  bool ready_to_quit() const;
  // The user asked to leave at once while a run was still stopping (GuiState::close.quit_now).
  // The caller must then exit the process without destroying this controller: the run host's
  // destructor would wait for the run.
  bool quit_now() const { return state_.close.quit_now; }
  // Seconds until the next scheduled poll (the frame loop sleeps at most this long).
  double next_poll_in(double now) const;
  // Background tasks queued or running (tests wait for them).
  size_t pending_tasks() const;
  // A resume is being prepared on the launch thread.
  bool launch_pending() const { return !state_.launching.empty(); }
  // Tests: pretend this process may no longer use the GPU (trainer::cuda_blocked_reason() can only
  // be set by a failed multi-GPU run). Empty: the engine's own reason again.
  void set_cuda_blocked_for_test(std::string why) { cuda_blocked_test_ = std::move(why); }

 private:
  void init_launcher();
  void load_config_file(const std::string& path);
  void start_run();
  void resume_run(int64_t run_id, int64_t step, const std::vector<std::string>& overrides = {});
  void resume_in_new_process(int64_t run_id);
  void reap_children();
  void adopt_host(std::unique_ptr<RunHost> host);
  void feed_live();
  void post_poll(bool force);
  void open_run(int64_t run_id);
  void reload_run(int64_t run_id);
  void edit(const std::string& what, std::function<std::string(void*)> task);

  GuiOptions opts_;
  ui::GuiState state_;
  std::unique_ptr<RunHost> host_;
  std::unique_ptr<Mailbox> mailbox_;
  struct DbContext;
  std::unique_ptr<DbContext> db_;          // used only on db_worker_'s thread
  std::unique_ptr<Worker> db_worker_;      // reads and edits, in order
  std::unique_ptr<Worker> file_worker_;    // exports and checksums (long, file-bound)
  std::unique_ptr<Worker> launch_worker_;  // resumes: verifying checkpoints, reopening the run
  uint64_t live_generation_ = 0;           // bumped per adopted host: a live read of an earlier one is dropped
  bool live_tail_read_ = false;            // the live run ended and its last rows were asked for
  std::string cuda_blocked_test_;
  double last_poll_ = -1e9;
  bool poll_in_flight_ = false;
  bool poll_again_ = true;                 // a read came back full: fetch the rest at once
  bool force_poll_ = true;                 // re-read the runs list even if data_version did not move
};

}  // namespace app

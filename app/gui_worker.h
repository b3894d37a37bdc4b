// The desktop app's background threads: a Worker runs posted tasks one after another on its own
// thread (database reads, edits, exports, checksums), and a Mailbox carries their results back to
// the main thread as closures over the GUI state. The main thread never waits on either: post()
// and drain() only take a short mutex, and the worker wakes the frame loop when a result arrives.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "ui/gui/gui_state.h"

namespace app {

// Results for the main thread: closures that apply a result to the GUI state and return whether
// anything visible changed (a poll that found nothing new must not cost a redraw).
// push(): any thread. drain(): main thread.
using Apply = std::function<bool(ui::GuiState&)>;
class Mailbox {
 public:
  explicit Mailbox(std::function<void()> wake) : wake_(std::move(wake)) {}
  void push(Apply apply);
  // Applies every queued result in arrival order; true when any of them changed something.
  bool drain(ui::GuiState& s);

 private:
  std::function<void()> wake_;
  std::mutex mu_;
  std::deque<Apply> q_;
};

class Worker {
 public:
  explicit Worker(std::string name);
  // Finishes the task in progress, drops the rest, joins.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  // Queues a task. Any thread; never blocks. A task's exceptions are its own business (tasks catch
  // and report through the Mailbox); one that escapes is swallowed so the thread lives on.
  void post(std::function<void()> task);
  // Tasks queued or running.
  size_t pending() const;

 private:
  void run();
  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  size_t running_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace app

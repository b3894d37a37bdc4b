#include "app/gui_worker.h"

namespace app {

void Mailbox::push(Apply apply) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(apply));
  }
  if (wake_) wake_();
}

bool Mailbox::drain(ui::GuiState& s) {
  std::deque<Apply> got;
  {
    std::lock_guard<std::mutex> lk(mu_);
    got.swap(q_);
  }
  bool changed = false;
  for (auto& f : got) changed |= f(s);
  return changed;
}

Worker::Worker(std::string name) : name_(std::move(name)), thread_([this] { run(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    q_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void Worker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(task));
  }
  cv_.notify_one();
}

size_t Worker::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return q_.size() + running_;
}

void Worker::run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (stop_) return;
      task = std::move(q_.front());
      q_.pop_front();
      ++running_;
    }
    try {
      task();
    } catch (...) {
      // Tasks report their own failures; this only keeps the thread alive.
    }
    std::lock_guard<std::mutex> lk(mu_);
    --running_;
  }
}

}  // namespace app

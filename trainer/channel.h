// Channel<T>: the only way threads talk (STYLE.md §5). A mutex, two condition variables and a
// bounded deque; close() wakes everyone, after which pop drains what is left and push fails.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace trainer {

template <typename T>
class Channel {
 public:
  explicit Channel(size_t capacity = 1024) : capacity_(capacity) {}

  // Blocks while full. Returns false if the channel is closed. Any thread.
  bool push(T v) {
    std::unique_lock<std::mutex> lk(mu_);
    not_full_.wait(lk, [&] { return closed_ || q_.size() < capacity_; });
    if (closed_) return false;
    q_.push_back(std::move(v));
    not_empty_.notify_one();
    return true;
  }
  // Never blocks: false when full or closed (the caller decides whether dropping is fine).
  bool try_push(T v) {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_ || q_.size() >= capacity_) return false;
    q_.push_back(std::move(v));
    not_empty_.notify_one();
    return true;
  }
  // Never blocks.
  std::optional<T> try_pop() {
    std::lock_guard<std::mutex> lk(mu_);
    return pop_locked();
  }
  // Blocks until an item arrives, the channel is closed and drained (nullopt), or the timeout passes.
  std::optional<T> pop_for(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    not_empty_.wait_for(lk, timeout, [&] { return closed_ || !q_.empty(); });
    return pop_locked();
  }
  // Blocks until an item arrives or the channel is closed and drained (nullopt).
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lk(mu_);
    not_empty_.wait(lk, [&] { return closed_ || !q_.empty(); });
    return pop_locked();
  }
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return closed_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return q_.size();
  }

 private:
  std::optional<T> pop_locked() {
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return v;
  }
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> q_;
  bool closed_ = false;
};

}  // namespace trainer

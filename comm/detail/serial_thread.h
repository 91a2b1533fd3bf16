// SerialThread: a thread that runs posted tasks one at a time, in posting order. The backends use it where an
// engine call must not run on the caller's thread (a wait that must not be cut short, an agreement check that
// must not block the caller) but must keep issue order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace dtrain::comm {

// Thread-safe. A task must not throw (it reports its outcome through state it captured).
class SerialThread {
 public:
  SerialThread() : thread_([this] { loop(); }) {}
  // Runs the tasks still queued, then joins: each must end by a deadline of its own.
  ~SerialThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SerialThread(const SerialThread&) = delete;
  SerialThread& operator=(const SerialThread&) = delete;

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;
};

}  // namespace dtrain::comm

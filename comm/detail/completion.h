// Completion: the outcome of an op that another thread finishes (an engine's communication or waiter thread),
// and CompletionWork, the Work that waits on it. Shared by the backends that run engine calls on threads of
// their own.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "comm/work.h"

namespace dtrain::comm {

// Thread-safety: finish() from the finishing thread, the rest from any thread.
struct Completion {
  // Marks the op finished, with `error` if it failed, and wakes the waiters. Call once.
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      this->error = error;
    }
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;         // guarded by mu
  std::exception_ptr error;  // guarded by mu
};

class CompletionWork : public Work {
 public:
  CompletionWork(OpInfo info, std::shared_ptr<Completion> completion)
      : Work(std::move(info)), completion_(std::move(completion)) {}

 protected:
  bool poll() override {
    std::lock_guard<std::mutex> lock(completion_->mu);
    if (completion_->error) std::rethrow_exception(completion_->error);
    return completion_->done;
  }

  bool wait_until(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(completion_->mu);
    if (!completion_->cv.wait_until(lock, deadline, [&] { return completion_->done; })) return false;
    if (completion_->error) std::rethrow_exception(completion_->error);
    return true;
  }

 private:
  std::shared_ptr<Completion> completion_;
};

}  // namespace dtrain::comm

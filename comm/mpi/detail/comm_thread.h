// CommThread: the thread that makes one communicator's MPI calls, in issue order. Blocking collectives run on
// it one at a time (OpenMPI's tuned algorithms); non-blocking point-to-point requests started on it are
// tested whenever nothing is queued, so a send and a recv issued back to back cannot block each other. One
// thread per communicator lets collectives on different groups proceed independently, as they do on Gloo or
// NCCL.
#pragma once

#include <mpi.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/detail/completion.h"

namespace dtrain::comm::detail {

// One queued MPI call; its outcome is the Completion it extends.
struct Task : Completion {
  std::function<void()> call;
  // A non-blocking call (MPI_Isend, MPI_Irecv) leaves its request here; the task completes when the request
  // does.
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<at::Tensor> keep;  // buffers of a pending request
};

// Thread-safety: enqueue() and run() may be called from any thread. The worker holds a reference to the
// CommThread, so an abandoned thread (stuck inside MPI after a timeout) never touches freed memory.
class CommThread : public std::enable_shared_from_this<CommThread> {
 public:
  static std::shared_ptr<CommThread> start();
  ~CommThread();

  // Queues a task; CommError if this thread was abandoned after a failure.
  std::shared_ptr<Task> enqueue(std::shared_ptr<Task> task);
  std::shared_ptr<Task> enqueue(std::function<void()> call);
  // Runs `call` and waits at most `timeout`; TimeoutError naming `what` after that (the thread is then
  // abandoned).
  void run(std::function<void()> call, std::chrono::milliseconds timeout, const char* what);
  // Marks the thread as stuck: no further calls are accepted, and stop() leaves it behind.
  void abandon() { failed_ = true; }
  bool failed() const { return failed_; }
  // Finishes the queued calls and joins, or, after abandon(), detaches.
  void stop();

 private:
  CommThread() = default;
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::atomic<bool> failed_{false};
  std::thread worker_;
};

}  // namespace dtrain::comm::detail

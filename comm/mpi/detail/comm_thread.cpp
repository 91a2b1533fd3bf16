// CommThread; see comm_thread.h.
#include "comm/mpi/detail/comm_thread.h"

#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm::detail {

std::shared_ptr<CommThread> CommThread::start() {
  std::shared_ptr<CommThread> t(new CommThread());
  t->worker_ = std::thread([self = t] { self->loop(); });
  return t;
}

CommThread::~CommThread() {
  // Reached either after stop() (joined or detached) or on the worker itself when it held the last reference.
  if (worker_.joinable()) worker_.detach();
}

std::shared_ptr<Task> CommThread::enqueue(std::shared_ptr<Task> task) {
  if (failed_) {
    throw CommError(str_cat(rank_prefix(),
                            " mpi backend: an earlier operation on this group timed out, so MPI is ",
                            "in an unknown state. Exit this process; the launcher stops the job."));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
  }
  cv_.notify_one();
  return task;
}

std::shared_ptr<Task> CommThread::enqueue(std::function<void()> call) {
  auto task = std::make_shared<Task>();
  task->call = std::move(call);
  return enqueue(std::move(task));
}

void CommThread::run(std::function<void()> call, std::chrono::milliseconds timeout, const char* what) {
  auto task = enqueue(std::move(call));
  std::unique_lock<std::mutex> lock(task->mu);
  if (!task->cv.wait_for(lock, timeout, [&] { return task->done; })) {
    abandon();
    throw TimeoutError(
        str_cat(rank_prefix(), " mpi backend: ", what, " did not finish within ", timeout.count(),
                " ms. Check that every rank reaches it; raise DTRAIN_TIMEOUT if they are just slow."));
  }
  if (task->error) std::rethrow_exception(task->error);
}

void CommThread::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!worker_.joinable()) return;
  if (failed_ || std::this_thread::get_id() == worker_.get_id()) {
    worker_.detach();  // it may be blocked in a collective that never completes
  } else {
    worker_.join();
  }
}

void CommThread::loop() {
  std::vector<std::shared_ptr<Task>> pending;  // started non-blocking requests
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stop_ || !queue_.empty(); };
      if (pending.empty()) {
        cv_.wait(lock, ready);
      } else {
        cv_.wait_for(lock, std::chrono::microseconds(20), ready);
      }
      if (stop_ && queue_.empty() && (pending.empty() || failed_)) return;
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (task) {
      std::exception_ptr error;
      try {
        task->call();
      } catch (...) {
        error = std::current_exception();
      }
      task->call = nullptr;  // release the tensors it captured; a pending request keeps its own in `keep`
      if (!error && task->request != MPI_REQUEST_NULL) {
        pending.push_back(std::move(task));
      } else {
        task->keep.clear();
        task->finish(error);
      }
    }
    for (size_t i = 0; i < pending.size();) {
      int flag = 0;
      int rc = MPI_Test(&pending[i]->request, &flag, MPI_STATUS_IGNORE);
      if (rc == MPI_SUCCESS && !flag) {
        ++i;
        continue;
      }
      std::exception_ptr error;
      if (rc != MPI_SUCCESS)
        error = std::make_exception_ptr(CommError(str_cat("MPI_Test returned error ", rc)));
      pending[i]->keep.clear();
      pending[i]->finish(error);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}

}  // namespace dtrain::comm::detail

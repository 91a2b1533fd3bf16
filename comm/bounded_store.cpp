// BoundedStore and run_bounded; see bounded_store.h.
#include "comm/detail/bounded_store.h"

#include <atomic>
#include <deque>
#include <thread>

#include "comm/detail/completion.h"
#include "comm/detail/failing.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"

namespace dtrain::comm {

namespace {

// Slack on top of a call's own timeout: c10d times out its waits itself, and its error (naming the key) is
// the better one when the host is alive.
constexpr auto kSlack = std::chrono::milliseconds(1000);

long long ms_between(StoreClock::time_point a, StoreClock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// Waits for `done` until `deadline`; false when the deadline passed first.
bool wait_done(Completion& done, StoreClock::time_point deadline) {
  std::unique_lock<std::mutex> lock(done.mu);
  return done.cv.wait_until(lock, deadline, [&] { return done.done; });
}

}  // namespace

void run_bounded(const std::string& what, StoreClock::time_point deadline, std::function<void()> fn,
                 const std::string& hint) {
  deadline = within_exit_budget(deadline);
  auto done = std::make_shared<Completion>();
  auto start = StoreClock::now();
  std::thread([fn = std::move(fn), done] {
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    done->finish(error);
  }).detach();
  if (!wait_done(*done, deadline)) {
    throw CommError(str_cat(rank_prefix(), " ", what, " did not finish within ", ms_between(start, deadline),
                            " ms.", hint.empty() ? "" : " ", hint));
  }
  std::lock_guard<std::mutex> lock(done->mu);
  if (done->error) std::rethrow_exception(done->error);
}

struct BoundedStore::State {
  struct Task {
    std::function<void(c10d::Store&)> fn;
    std::shared_ptr<Completion> done;
    StoreClock::time_point deadline;
    const char* what = "";
  };

  State(c10::intrusive_ptr<c10d::Store> s, std::string w) : inner(std::move(s)), where(std::move(w)) {}

  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
        busy = true;
        busy_since = StoreClock::now();
      }
      std::exception_ptr error;
      static std::atomic<int64_t> sent{0};  // (this process's store accesses, for the test hook)
      fault_point("store", ++sent);
      if (StoreClock::now() >= task.deadline) {
        error = std::make_exception_ptr(CommError("the caller stopped waiting before the call started"));
      } else {
        try {
          task.fn(*inner);
        } catch (const c10::Error& e) {
          // c10d's errors carry a C++ backtrace in what(); ours name the store instead.
          error = std::make_exception_ptr(CommError(
              str_cat(rank_prefix(), " ", where, ": ", task.what, " failed: ", e.what_without_backtrace())));
        } catch (...) {
          error = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        busy = false;
        stuck_what.clear();
      }
      task.done->finish(error);
    }
  }

  c10::intrusive_ptr<c10d::Store> inner;
  std::string where;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;             // guarded by mu
  bool stop = false;                  // guarded by mu
  bool busy = false;                  // guarded by mu
  StoreClock::time_point busy_since;  // guarded by mu
  std::string stuck_what;             // guarded by mu: the call a caller gave up on, while it still runs
  std::thread thread;                 // started on first use
};

BoundedStore::BoundedStore(c10::intrusive_ptr<c10d::Store> inner, std::string where,
                           std::chrono::milliseconds timeout)
    : c10d::Store(timeout), where_(std::move(where)), extended_(inner->hasExtendedApi()) {
  state_ = std::make_shared<State>(std::move(inner), where_);
}

BoundedStore::~BoundedStore() {
  held_.clear();  // their threads may still call the store
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stop = true;
  bool busy = state_->busy;
  lock.unlock();
  state_->cv.notify_all();
  if (!state_->thread.joinable()) return;
  if (busy) {
    state_->thread.detach();  // stuck in a call that may never return; it holds the state itself
  } else {
    state_->thread.join();
  }
}

StoreClock::time_point BoundedStore::bound(std::chrono::milliseconds wait) const {
  return StoreClock::now() + wait + kSlack;
}

void BoundedStore::submit(const char* what, StoreClock::time_point deadline,
                          std::function<void(c10d::Store&)> fn) {
  auto done = std::make_shared<Completion>();
  auto start = StoreClock::now();
  deadline = within_exit_budget(deadline);  // a failing process: what is left of its exit budget
  if (start >= deadline && failing()) {
    throw CommError(str_cat(rank_prefix(), " ", where_, ": ", what,
                            " was not sent: this process is leaving after a failed collective, and its time "
                            "to leave (",
                            kExitBudget.count(), " ms) is spent."));
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->busy && !state_->stuck_what.empty()) {
      throw CommError(
          str_cat(rank_prefix(), " ", where_, " did not answer ", state_->stuck_what,
                  " (still waiting after ", ms_between(state_->busy_since, start), " ms), so ", what,
                  " was not sent. Its host may be stopped (SIGSTOP, swapping) or unreachable (a cut "
                  "link); check that rank 0 is alive and reachable from this host."));
    }
    if (!state_->thread.joinable()) {
      std::shared_ptr<State> state = state_;
      state_->thread = std::thread([state] { state->loop(); });
    }
    state_->queue.push_back({std::move(fn), done, deadline, what});
  }
  state_->cv.notify_one();
  if (!wait_done(*done, deadline)) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->busy && state_->stuck_what.empty()) state_->stuck_what = what;
    }
    throw CommError(
        str_cat(rank_prefix(), " ", where_, " did not answer ", what, " within ", ms_between(start, deadline),
                " ms. Its host may be stopped (SIGSTOP, swapping), overloaded or unreachable (a cut "
                "link); check that rank 0 is alive and reachable from this host."));
  }
  std::lock_guard<std::mutex> lock(done->mu);
  if (done->error) std::rethrow_exception(done->error);
}

c10::intrusive_ptr<c10d::Store> BoundedStore::clone() {
  auto inner = call("a new connection", bound(timeout_), [](c10d::Store& s) { return s.clone(); });
  return c10::make_intrusive<BoundedStore>(inner, where_, timeout_);
}

void BoundedStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  call("set", bound(timeout_), [key, value](c10d::Store& s) { s.set(key, value); });
}

std::vector<uint8_t> BoundedStore::compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                              const std::vector<uint8_t>& value) {
  return call("compare_set", bound(timeout_),
              [key, current, value](c10d::Store& s) { return s.compareSet(key, current, value); });
}

std::vector<uint8_t> BoundedStore::get(const std::string& key) {
  return call("get", bound(timeout_), [key](c10d::Store& s) { return s.get(key); });
}

int64_t BoundedStore::add(const std::string& key, int64_t value) {
  return call("add", bound(timeout_), [key, value](c10d::Store& s) { return s.add(key, value); });
}

bool BoundedStore::deleteKey(const std::string& key) {
  return call("delete", bound(timeout_), [key](c10d::Store& s) { return s.deleteKey(key); });
}

bool BoundedStore::check(const std::vector<std::string>& keys) {
  return call("check", bound(timeout_), [keys](c10d::Store& s) { return s.check(keys); });
}

int64_t BoundedStore::getNumKeys() {
  return call("num_keys", bound(timeout_), [](c10d::Store& s) { return s.getNumKeys(); });
}

void BoundedStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void BoundedStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::chrono::milliseconds t = timeout;
  call("wait", bound(t), [keys, t](c10d::Store& s) { s.wait(keys, t); });
}

void BoundedStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  call("append", bound(timeout_), [key, value](c10d::Store& s) { s.append(key, value); });
}

std::vector<std::vector<uint8_t>> BoundedStore::multiGet(const std::vector<std::string>& keys) {
  return call("multi_get", bound(timeout_), [keys](c10d::Store& s) { return s.multiGet(keys); });
}

void BoundedStore::multiSet(const std::vector<std::string>& keys,
                            const std::vector<std::vector<uint8_t>>& values) {
  call("multi_set", bound(timeout_), [keys, values](c10d::Store& s) { s.multiSet(keys, values); });
}

void BoundedStore::setTimeout(const std::chrono::milliseconds& timeout) {
  c10d::Store::setTimeout(timeout);
  std::chrono::milliseconds t = timeout;
  call("set_timeout", bound(std::chrono::milliseconds(0)), [t](c10d::Store& s) { s.setTimeout(t); });
}

}  // namespace dtrain::comm

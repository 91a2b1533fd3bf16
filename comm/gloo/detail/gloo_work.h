// The gloo backend's private parts shared by gloo_backend.cpp (the engine calls) and gloo_agreement.cpp (how
// collectives are agreed on and queued): a collective's c10d Work as the issuer sets it, the Work that waits
// on it, and the group's issue order. Private to comm/gloo.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "comm/gloo/gloo_backend.h"
#include "comm/work.h"
#include "core/error.h"

namespace dtrain::comm::gloo_detail {

// Gloo's own deadline sits a little after ours, so that a stuck collective surfaces as dtrain's TimeoutError
// (which names the missing ranks) rather than as Gloo's I/O error, while a torn-down group still frees its
// threads soon.
inline constexpr auto kGlooGrace = std::chrono::milliseconds(1000);

// A collective's c10d Work, known at once or once the issuer thread started it.
struct Issued {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                    // guarded by mu
  std::exception_ptr error;             // guarded by mu: the agreement failed, or starting it did
  c10::intrusive_ptr<c10d::Work> work;  // guarded by mu
};

class GlooWork : public Work {
 public:
  GlooWork(OpInfo info, c10::intrusive_ptr<c10d::Work> work)
      : Work(std::move(info)), work_(std::move(work)) {}
  GlooWork(OpInfo info, std::shared_ptr<Issued> issued) : Work(std::move(info)), issued_(std::move(issued)) {}

 protected:
  bool poll() override {
    if (!started(Clock::now())) return false;
    if (!work_->isCompleted()) return false;
    if (!work_->isSuccess()) std::rethrow_exception(work_->exception());
    return true;
  }

  bool wait_until(Clock::time_point deadline) override {
    if (!started(deadline)) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return poll();
    try {
      work_->wait(left);
    } catch (...) {
      // c10d reports its own timeout as an exception too ("Operation timed out!"): only a completed work
      // carries an engine error, and a work may complete between the timed wait giving up and this check,
      // so the caught exception is never what is reported (it was, rarely, a spurious failure of an op that
      // had succeeded at the end of a wait slice).
      if (!work_->isCompleted()) return false;
      if (work_->isSuccess()) return true;
      std::rethrow_exception(work_->exception());
    }
    return true;
  }

 private:
  // Whether the c10d Work exists (waiting for the issuer until `deadline`); rethrows the issuer's error.
  bool started(Clock::time_point deadline) {
    if (work_) return true;
    std::unique_lock<std::mutex> lock(issued_->mu);
    if (!issued_->cv.wait_until(lock, deadline, [&] { return issued_->done; })) return false;
    if (issued_->error) std::rethrow_exception(issued_->error);
    work_ = issued_->work;
    return true;
  }

  std::shared_ptr<Issued> issued_;
  c10::intrusive_ptr<c10d::Work> work_;
};

// A c10d Work made of several issued together: complete once all are, failed with the first failure.
class AllOfWork : public c10d::Work {
 public:
  explicit AllOfWork(std::vector<c10::intrusive_ptr<c10d::Work>> parts) : parts_(std::move(parts)) {}

  bool isCompleted() override {
    for (auto& p : parts_) {
      if (!p->isCompleted()) return false;
    }
    return true;
  }
  bool isSuccess() const override {
    for (const auto& p : parts_) {
      if (!p->isSuccess()) return false;
    }
    return true;
  }
  std::exception_ptr exception() const override {
    for (const auto& p : parts_) {
      if (!p->isSuccess()) return p->exception();
    }
    return nullptr;
  }
  // One deadline for all the parts; past it, throws as c10d's own timed wait does.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout.count() < 0) {
      for (auto& p : parts_) p->wait(timeout);
      return true;
    }
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto& p : parts_) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 && !p->isCompleted()) throw std::runtime_error("Operation timed out!");
      p->wait(std::max(left, std::chrono::milliseconds(1)));
    }
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};

// A collective that is not handed to c10d because an earlier one of this process failed
// (comm/detail/failing.h): a new engine op would wait for the failed peers up to a timeout of its own.
CommError not_started(const OpInfo& info);

// Settles a collective's Issued: its c10d Work, or the error that stopped it.
void settle(Issued& issued, std::exception_ptr error, c10::intrusive_ptr<c10d::Work> work);

}  // namespace dtrain::comm::gloo_detail

namespace dtrain::comm {

// The order in which a group's signed collectives reach c10d (see GlooBackend::issue): `started` counts the
// collectives whose agreement is settled (the data op queued, or the error stored), in issue order.
struct GlooBackend::Sequencer {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t issued = 0;   // guarded by mu: collectives issued so far
  uint64_t started = 0;  // guarded by mu
  // guarded by mu: the first failed agreement; later collectives fail with it instead of reaching Gloo (the
  // unsigned rest of a run would meet mismatched sizes there)
  std::exception_ptr disagreed;
  uint64_t signed_count = 0;  // guarded by mu: signed collectives begun (their number on the shared board)

  void settle(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mu);
      started = std::max(started, n);
    }
    cv.notify_all();
  }
};

}  // namespace dtrain::comm

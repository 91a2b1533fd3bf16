// How the gloo backend's collectives are agreed on and queued (see GlooBackend::issue): through the engine's
// all_gather, or through the shared-memory board when every rank of the group is on this host.
#include <ATen/ATen.h>

#include <algorithm>
#include <deque>

#include "comm/detail/agreement.h"
#include "comm/detail/completion.h"
#include "comm/detail/failing.h"
#include "comm/detail/serial_thread.h"
#include "comm/gloo/detail/gloo_work.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

namespace gloo_detail {

CommError not_started(const OpInfo& info) {
  return CommError(str_cat(describe(info),
                           ": not started, since an earlier collective of this process failed (this error "
                           "follows from that one, reported first)."));
}

void settle(Issued& issued, std::exception_ptr error, c10::intrusive_ptr<c10d::Work> work) {
  {
    std::lock_guard<std::mutex> lock(issued.mu);
    issued.done = true;
    issued.error = error;
    issued.work = std::move(work);
  }
  issued.cv.notify_all();
}

// Checks the signatures gathered in `all` (check false: known alike), a disagreement recorded in `disagreed`
// (under `mu`) so that later collectives fail with it; then queues the data op unless this process is
// failing. Settles `issued` either way.
void queue_if_agreed(const OpInfo& info, const int64_t* all, bool check, const std::vector<int>& ranks,
                     std::mutex& mu, std::exception_ptr& disagreed,
                     const std::function<c10::intrusive_ptr<c10d::Work>()>& start, Issued& issued) {
  std::exception_ptr error;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    if (check) {
      try {
        check_signatures(info, all, ranks);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!disagreed) disagreed = std::current_exception();
        throw;
      }
    }
    if (failing()) throw not_started(info);
    work = start();
  } catch (...) {
    error = std::current_exception();
  }
  settle(issued, error, std::move(work));
}

}  // namespace gloo_detail

using namespace gloo_detail;

// A signed collective: its signature is all-gathered (a c10d collective of its own), and when that completes,
// c10d's worker thread itself checks the signatures and queues the data op (the future's callback), so the
// data op starts without another thread hand-off. Every rank must queue its c10d collectives in the same
// order, so a collective (its all_gather, or an unsigned member of an AgreementRun itself) is queued only
// once every earlier collective of the group has settled (queued its data op or failed): at once when they
// have (the usual case: the caller waited for the previous one), else by the issuer thread, which waits for
// them; the caller never blocks. After a failed agreement, every later collective fails with that error.
// `start` and everything the agreement's callback holds refer to the process group by a plain pointer: the
// callback runs on the group's own worker thread, which the group joins before it is freed, and a strong
// reference released there would destroy the group on its own thread (join of itself: std::terminate).
WorkPtr GlooBackend::issue(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  if (shm_) {
    // A killed peer's connections close during its exit, a moment before /proc shows it ended: looked at
    // again for up to 300 ms, on the error path only.
    info.dead_peers = [shm = shm_, ranks = global_ranks(), peers = info.peers] {
      const Clock::time_point until = Clock::now() + std::chrono::milliseconds(300);
      for (;;) {
        std::string dead;
        for (size_t g = 0; g < ranks.size(); ++g) {
          int pid = 0;
          if (std::find(peers.begin(), peers.end(), ranks[g]) == peers.end()) continue;
          if (shm->exited(static_cast<int>(g), &pid))
            dead += str_cat(dead.empty() ? "" : ", ", "rank ", ranks[g], " (pid ", pid, ")");
        }
        if (!dead.empty() || Clock::now() >= until) return dead;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling /proc, bounded above
      }
    };
    return issue_shm_agreement(std::move(info), std::move(start));
  }
  return issue_engine_agreement(std::move(info), std::move(start));
}

bool GlooBackend::take_turn(const OpInfo& info, bool signed_op, uint64_t* n) {
  Sequencer& seq = *sequencer_;
  std::lock_guard<std::mutex> lock(seq.mu);
  if (seq.disagreed) std::rethrow_exception(seq.disagreed);
  if (failing()) throw not_started(info);
  *n = ++seq.issued;
  const bool now = seq.started == *n - 1 && issuer_pending_ == 0;
  if (!signed_op && now) {
    seq.started = *n;  // queued by the caller, before any later collective can be
  } else if (!now) {
    ++issuer_pending_;
  }
  return now;
}

WorkPtr GlooBackend::issue_engine_agreement(OpInfo info,
                                            std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  auto issued = std::make_shared<Issued>();
  std::shared_ptr<Sequencer> seq = sequencer_;
  const bool signed_op = info.signature[0] != 0;
  uint64_t n;
  const bool now = take_turn(info, signed_op, &n);
  // An unsigned collective (the rest of an AgreementRun) goes to c10d at once when nothing is pending, else
  // in order behind the collectives before it.
  if (!signed_op && now) return std::make_shared<GlooWork>(std::move(info), start());
  auto begin = [pg = pg_.get(), info, start = std::move(start), issued, seq, n, signed_op,
                ranks = global_ranks()] {
    try {
      {
        std::lock_guard<std::mutex> lock(seq->mu);
        if (seq->disagreed) std::rethrow_exception(seq->disagreed);
      }
      if (failing()) throw not_started(info);
      if (!signed_op) {
        settle(*issued, nullptr, start());
        seq->settle(n);
        return;
      }
      const int size = static_cast<int>(ranks.size());
      at::Tensor mine = at::empty({kSignatureFields}, at::kLong);
      std::copy(info.signature.begin(), info.signature.end(), mine.data_ptr<int64_t>());
      at::Tensor all = at::empty({size * kSignatureFields}, at::kLong);
      c10d::AllgatherOptions o;
      o.timeout = info.timeout + kGlooGrace;
      auto agreement = pg->_allgather_base(all, mine, o);
      agreement->getFuture()->addCallback([info, start, issued, seq, n, ranks, all](c10::ivalue::Future& f) {
        if (f.hasError()) {
          settle(*issued, f.exception_ptr(), {});
        } else {
          queue_if_agreed(info, all.data_ptr<int64_t>(), true, ranks, seq->mu, seq->disagreed, start,
                          *issued);
        }
        seq->settle(n);
      });
    } catch (...) {
      settle(*issued, std::current_exception(), {});
      seq->settle(n);
    }
  };
  if (now) {
    begin();
  } else {
    if (!issuer_) issuer_ = std::make_unique<SerialThread>();
    Clock::time_point deadline = info.deadline;
    issuer_->post([this, seq, n, deadline, begin = std::move(begin), closing = closing_]() mutable {
      {
        // Past the op's deadline the group is failing anyway: queue it rather than wait without end.
        std::unique_lock<std::mutex> lock(seq->mu);
        seq->cv.wait_until(lock, deadline, [&] { return seq->started >= n - 1 || closing->load(); });
        --issuer_pending_;
      }
      begin();
    });
  }
  return std::make_shared<GlooWork>(std::move(info), std::move(issued));
}

namespace {

// How long a signed collective's caller waits for the other ranks' signatures on the shared board before the
// issuer thread takes the wait over (the caller never blocks longer): ranks that issue a collective together
// meet well within it, and the data op then starts from the caller's thread, as an unchecked one would.
constexpr auto kCallerAgreementWait = std::chrono::milliseconds(2);

}  // namespace

// A signed collective with the shared board (ShmAgreement): the signature is published there and, once every
// rank's is, checked and the data op queued, in the same order on every rank as in issue_engine_agreement.
// When every earlier collective has settled and the others publish within kCallerAgreementWait, all of this
// runs on the caller's thread; otherwise the issuer thread does it, waiting up to the op's deadline.
WorkPtr GlooBackend::issue_shm_agreement(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  auto issued = std::make_shared<Issued>();
  std::shared_ptr<Sequencer> seq = sequencer_;
  const bool signed_op = info.signature[0] != 0;
  uint64_t n;
  const bool now = take_turn(info, signed_op, &n);
  if (!signed_op && now) return std::make_shared<GlooWork>(std::move(info), start());
  ShmAgreement* shm = shm_.get();
  // Checks the gathered signatures and queues the data op; settles `issued` either way.
  auto conclude = [info, start, issued, seq, ranks = global_ranks()](const std::vector<int64_t>& all) {
    const size_t k = kSignatureFields;
    bool same = true;  // (the usual case, checked without building a message)
    for (size_t g = 1; g < ranks.size() && same; ++g) {
      same = std::equal(all.begin(), all.begin() + k, all.begin() + g * k);
    }
    queue_if_agreed(info, all.data(), !same, ranks, seq->mu, seq->disagreed, start, *issued);
  };
  // Waits on the shared board up to the op's deadline (and Gloo's grace) on the issuer thread.
  const size_t fields = static_cast<size_t>(group_size()) * kSignatureFields;
  auto finish_late = [shm, info, issued, conclude, fields, closing = closing_,
                      ranks = global_ranks()](uint64_t s) {
    std::vector<int64_t> all(fields);
    if (shm->gather(s, all.data(), info.deadline + kGlooGrace, closing.get())) {
      conclude(all);
      return;
    }
    std::string who, dead;
    for (int g : shm->missing(s)) {
      who += str_cat(who.empty() ? "" : ", ", g);
      int pid = 0;
      if (shm->exited(g, &pid))
        dead += str_cat(dead.empty() ? "" : ", ", "rank ", ranks[g], " (pid ", pid, ")");
    }
    if (!dead.empty()) {
      std::string progress;  // what the others published (bounded; the store's host may be the one gone)
      try {
        if (info.diagnose) progress = info.diagnose();
      } catch (const std::exception& e) {
        progress = str_cat("(the peers' progress could not be read: ", e.what(), ")");
      }
      settle(*issued,
             std::make_exception_ptr(CommError(str_cat(
                 describe(info), ": ", dead,
                 " exited without entering it: its process is dead, not late (it died while this rank waited "
                 "for it: killed, crashed or returned early; its own output and exit status say which).",
                 progress.empty() ? "" : " ", progress))),
             {});
      return;
    }
    settle(
        *issued,
        std::make_exception_ptr(CommError(str_cat(
            describe(info),
            closing->load() ? ": the group was destroyed while waiting for group ranks [" : ": group ranks [",
            who,
            closing->load() ? "] to enter it" : "] never entered it (agreement through shared memory)"))),
        {});
  };
  if (now) {
    uint64_t s;
    {
      std::lock_guard<std::mutex> lock(seq->mu);
      s = ++seq->signed_count;
    }
    shm->publish(s, info.signature.data());
    std::vector<int64_t> all(fields);
    if (shm->gather(s, all.data(), std::min(info.deadline, Clock::now() + kCallerAgreementWait))) {
      conclude(all);
      seq->settle(n);
    } else {
      // The op stays unsettled for the sequencer until the issuer concludes it: later ones queue behind it.
      {
        std::lock_guard<std::mutex> lock(seq->mu);
        ++issuer_pending_;
      }
      if (!issuer_) issuer_ = std::make_unique<SerialThread>();
      issuer_->post([this, seq, n, s, finish_late] {
        finish_late(s);
        {
          std::lock_guard<std::mutex> lock(seq->mu);
          --issuer_pending_;
        }
        seq->settle(n);
      });
    }
    return std::make_shared<GlooWork>(std::move(info), std::move(issued));
  }
  if (!issuer_) issuer_ = std::make_unique<SerialThread>();
  Clock::time_point deadline = info.deadline;
  issuer_->post([this, seq, n, deadline, signed_op, shm, start, issued, finish_late, info,
                 closing = closing_]() mutable {
    {
      std::unique_lock<std::mutex> lock(seq->mu);
      seq->cv.wait_until(lock, deadline, [&] { return seq->started >= n - 1 || closing->load(); });
      --issuer_pending_;
    }
    try {
      {
        std::lock_guard<std::mutex> lock(seq->mu);
        if (seq->disagreed) std::rethrow_exception(seq->disagreed);
      }
      if (failing()) throw not_started(info);
      if (!signed_op) {
        settle(*issued, nullptr, start());
      } else {
        uint64_t s;
        {
          std::lock_guard<std::mutex> lock(seq->mu);
          s = ++seq->signed_count;
        }
        shm->publish(s, info.signature.data());
        finish_late(s);
      }
    } catch (...) {
      settle(*issued, std::current_exception(), {});
    }
    seq->settle(n);
  });
  return std::make_shared<GlooWork>(std::move(info), std::move(issued));
}

}  // namespace dtrain::comm

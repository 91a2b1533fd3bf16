// Work: waiting, completion steps and error translation; see work.h.
#include "comm/work.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "comm/detail/failing.h"
#include "comm/detail/failure_board.h"
#include "comm/timeline.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

std::string describe(const OpInfo& info) {
  std::string prefix = rank_prefix();
  return str_cat(prefix, prefix.empty() ? "" : " ", info.op, " (seq ", info.seq, ", ", info.backend,
                 ", group ", info.group, ")");
}

namespace {

std::string peers_str(const std::vector<int>& peers) {
  std::string s = "[";
  for (size_t i = 0; i < peers.size(); ++i) s += str_cat(i ? ", " : "", peers[i]);
  return s + "]";
}

}  // namespace

void Work::wait() { wait_impl(info_.deadline); }

void Work::wait(std::chrono::milliseconds timeout) {
  wait_impl(std::min(info_.deadline, Clock::now() + timeout));
}

namespace {
std::mutex g_link_mu;
std::atomic<int64_t> g_link_busy_us{
    0};                         // written under g_link_mu; read without it (off: every op's fast path)
Clock::time_point g_link_free;  // guarded by g_link_mu
}  // namespace

void set_simulated_link(std::chrono::microseconds busy) {
  std::lock_guard<std::mutex> lock(g_link_mu);
  g_link_busy_us = std::max<int64_t>(busy.count(), 0);
  g_link_free = Clock::time_point();
}

Clock::time_point simulated_link_slot(Clock::time_point issued) {
  if (g_link_busy_us.load(std::memory_order_relaxed) == 0) return issued;
  std::lock_guard<std::mutex> lock(g_link_mu);
  const std::chrono::microseconds busy(g_link_busy_us.load());
  if (busy.count() == 0) return issued;
  g_link_free = std::max(issued, g_link_free) + busy;
  return g_link_free;
}

bool Work::is_completed() {
  if (done_) return true;
  try {
    if (!poll()) return false;
  } catch (...) {
    return true;  // finished with an error; wait() reports it
  }
  return Clock::now() >= not_before_;
}

std::exception_ptr Work::engine_error(const std::string& what,
                                      const std::function<std::string()>& diagnosis) {
  // A peer that failed and exited closes its connections: when it posted its error first, that error is
  // the cause to report.
  if (info_.abort_reason) {
    if (auto why = info_.abort_reason()) {
      return std::make_exception_ptr(
          CommError(str_cat(describe(info_), " aborted: ", *why, " (the engine then reported: ", what, ")")));
    }
  }
  std::string diag = diagnosis();
  if (info_.dead_peers) {
    std::string dead = info_.dead_peers();
    if (!dead.empty()) {
      return std::make_exception_ptr(CommError(str_cat(
          describe(info_), ": ", dead,
          " exited before this rank finished it: its process is dead, not late (it died while this rank "
          "waited for it: killed, crashed or returned early; its own output and exit status say which). The "
          "engine reported: ",
          what, diag.empty() ? "" : " ", diag)));
    }
  }
  return std::make_exception_ptr(
      CommError(str_cat(describe(info_), " failed while waiting for ranks ", peers_str(info_.peers), ": ",
                        what, diag.empty() ? "" : " ", diag)));
}

void Work::wait_impl(Clock::time_point deadline) {
  if (error_) std::rethrow_exception(error_);
  if (done_) return;
  const Clock::time_point wait_start = Clock::now();
  // Before the deadline, take a snapshot of the peers' progress: when the op then times out, the rank that
  // hosts the store may already be gone (it timed out too), and the snapshot still names the missing ranks.
  const auto snapshot_margin = std::min<Clock::duration>(std::chrono::seconds(1), info_.timeout / 4);
  std::optional<std::string> snapshot;
  std::string board_error;
  auto read_board = [&]() -> std::optional<std::string> {
    try {
      return info_.diagnose();
    } catch (const std::exception& e) {
      board_error = e.what();
      return std::nullopt;
    }
  };
  std::function<std::string()> diagnosis = [&]() -> std::string {
    if (!info_.diagnose) return "";
    if (board_error.empty()) {
      if (std::optional<std::string> now = read_board()) return *now;
    }
    if (snapshot) {
      return str_cat(*snapshot, snapshot->empty() ? "" : " ",
                     "(progress read shortly before the deadline; since then ", board_error, ")");
    }
    return str_cat("(the peers' progress could not be read: ", board_error, ")");
  };
  // Waits in slices of FailureBoard::kPollInterval, reading between them whether another rank reported a
  // failure (a fast op finishes within the first slice and never reads the board).
  struct Aborted {
    std::string why;
  };
  auto wait_watching = [&](Clock::time_point until) {
    if (!info_.abort_reason) return wait_until(until);
    for (;;) {
      if (wait_until(std::min(until, Clock::now() + FailureBoard::kPollInterval))) return true;
      if (auto why = info_.abort_reason()) throw Aborted{*why};
      if (Clock::now() >= until) return false;
    }
  };
  bool finished = false;
  bool disagreed = false;
  try {
    if (info_.diagnose && deadline == info_.deadline && deadline - Clock::now() > 2 * snapshot_margin) {
      finished = wait_watching(deadline - snapshot_margin);
      if (!finished) snapshot = read_board();
    }
    if (!finished) finished = wait_watching(deadline);
  } catch (const Aborted& a) {
    on_timed_out();  // the op is abandoned: the engine may still be in it
    error_ = std::make_exception_ptr(CommError(str_cat(describe(info_), " aborted: ", a.why)));
  } catch (const ValueError&) {
    error_ = std::current_exception();  // the ranks disagree on the call (agreement): the message is complete
    disagreed = true;
  } catch (const Error& e) {
    // (an error that already names this op, e.g. the agreement's, stands as it is)
    const std::string op = describe(info_);
    error_ = std::string(e.what()).rfind(op, 0) == 0
                 ? std::current_exception()
                 : std::make_exception_ptr(CommError(str_cat(op, " failed: ", e.what())));
  } catch (const c10::Error& e) {
    error_ = engine_error(e.what_without_backtrace(), diagnosis);
  } catch (const std::exception& e) {
    error_ = engine_error(e.what(), diagnosis);
  }
  if (!error_ && !finished) {
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - info_.issued);
    if (deadline < info_.deadline) {
      // Only the caller's shorter wait ran out: the op itself still has time, so nothing is stored.
      throw TimeoutError(
          str_cat(describe(info_), " is still running after ", waited.count(), " ms (the wait allowed ",
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - info_.issued).count(),
                  " ms of the op's ", info_.timeout.count(), " ms). Wait again to let it finish."));
    }
    std::string diag = diagnosis();
    on_timed_out();
    error_ = std::make_exception_ptr(TimeoutError(
        str_cat(describe(info_), " timed out after ", waited.count(), " ms waiting for ranks ",
                peers_str(info_.peers), ".", diag.empty() ? "" : " ", diag,
                " Check that every rank calls the same collectives in the same order; if the work between "
                "collectives is just slow, raise the timeout (DTRAIN_TIMEOUT=seconds).")));
  }
  if (error_) {
    if (!disagreed) mark_failing();  // from here every exit path shares one budget (comm/detail/failing.h)
    std::rethrow_exception(error_);
  }
  if (Clock::now() < not_before_) {  // set_simulated_link: a slower network
    std::this_thread::sleep_until(std::min(not_before_, info_.deadline));
  }
  run_steps();
  const Clock::time_point end = Clock::now();
  timeline::add_wait(end - wait_start);
  if (timeline::enabled()) {
    timeline::record({info_.op, "comm", timeline::to_us(info_.issued),
                      timeline::to_us(end) - timeline::to_us(info_.issued),
                      str_cat(info_.backend, " seq ", info_.seq, ", group ", info_.group)});
  }
}

void Work::run_steps() {
  // Completion steps (copy-back, avg, unpadding) run once; an error in one is stored like an engine error.
  try {
    for (auto& step : steps_) step();
  } catch (const std::exception& e) {
    error_ =
        std::make_exception_ptr(CommError(str_cat(describe(info_), " failed while completing: ", e.what())));
    steps_.clear();
    std::rethrow_exception(error_);
  }
  steps_.clear();
  done_ = true;
}

}  // namespace dtrain::comm

// Work: the handle of an issued operation. wait() blocks until it finished, runs its completion steps
// (copy-back, averaging, unpadding) once, and rethrows a stored engine error as CommError, or TimeoutError
// past the deadline, naming the op, its sequence number, this rank and the peers it waited for.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::comm {

using Clock = std::chrono::steady_clock;

inline constexpr int kSignatureFields = 6;

// What an error message needs to know about one operation.
struct OpInfo {
  std::string op;          // "all_reduce", "send", ...
  std::string backend;     // "gloo", "mpi"
  std::string group;       // "world" or a sub-group's id
  uint64_t seq = 0;        // collective sequence number within the group (send/recv: per-process count)
  std::vector<int> peers;  // global ranks this op waits for
  std::chrono::milliseconds timeout{0};
  Clock::time_point issued;
  Clock::time_point deadline;  // issued + timeout
  // Names the peers that have not reached this op, from the progress board ("" when none is known to be
  // behind); throws when the board cannot be read (the message says why). May be null.
  std::function<std::string()> diagnose;
  // A failure another rank reported (FailureBoard), read while the op waits; nullopt when none. May be null.
  std::function<std::optional<std::string>()> abort_reason;
  // Names the peers whose processes are known to have ended ("rank 1 (pid 5776)", comma-separated), "" when
  // none is known. Read when the engine fails: a peer's connections close a moment before its process is
  // seen as ended, so it looks again for a short, bounded while. May be null (no way to tell).
  std::function<std::string()> dead_peers;
  // What every rank must agree on before the engine moves data (collectives only; see Backend): which
  // collective, dtype, total elements, hash of per-rank counts, reduce op, root (-1: none). kind 0: no check.
  std::array<int64_t, kSignatureFields> signature{};
};

// What-if and tests: a simulated link that every op issued from now on occupies for `busy`, one op after
// another in issue order: an op completes (wait() returns, is_completed() turns true) no earlier than
// max(its issue, the previous op's slot end) + busy, as on a slower network, the engine's own time counting
// within it. It shows how much communication overlaps computation. 0 (the default): off. Process-wide;
// thread-safe.
void set_simulated_link(std::chrono::microseconds busy);
// The end of the slot an op issued at `issued` gets on the simulated link (`issued` when it is off).
Clock::time_point simulated_link_slot(Clock::time_point issued);

// Thread-safety: a Work is used by the thread that issued it.
class Work {
 public:
  explicit Work(OpInfo info) : info_(std::move(info)), not_before_(simulated_link_slot(info_.issued)) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Waits until the op's own deadline (issue time + its timeout). Past it: TimeoutError, and the op counts as
  // failed (later waits rethrow the same error; the backend may refuse further ops). A failure another rank
  // reported meanwhile (OpInfo::abort_reason) ends the wait early with a CommError naming that rank.
  void wait();
  // Waits at most `timeout`, never past the op's deadline. If the op is still running when a `timeout`
  // shorter than the op's own runs out, throws TimeoutError but the op goes on: a later wait() can still
  // succeed.
  void wait(std::chrono::milliseconds timeout);
  // True once the engine finished (successfully or not); does not run completion steps.
  bool is_completed();

  // Adds a step run after the engine finished, in order, exactly once, before wait() returns.
  void then(std::function<void()> step) { steps_.push_back(std::move(step)); }
  const OpInfo& info() const { return info_; }

 protected:
  // Blocks until the engine finished or `deadline`; returns false on timeout. Engine errors propagate as
  // exceptions.
  // Must not treat a missed `deadline` as a failure: wait() also calls it with earlier deadlines.
  virtual bool wait_until(Clock::time_point deadline) = 0;
  virtual bool poll() = 0;
  // Called once when the op passed its own deadline unfinished (the engine may be stuck in it).
  virtual void on_timed_out() {}

 private:
  void wait_impl(Clock::time_point deadline);
  // The CommError for an engine error `what`: a failure a peer posted first, else `what` and the diagnosis.
  std::exception_ptr engine_error(const std::string& what, const std::function<std::string()>& diagnosis);
  void run_steps();
  OpInfo info_;
  Clock::time_point not_before_;  // set_simulated_link
  std::vector<std::function<void()>> steps_;
  bool done_ = false;
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete (an op with nothing to move).
class CompletedWork : public Work {
 public:
  using Work::Work;

 protected:
  bool wait_until(Clock::time_point) override { return true; }
  bool poll() override { return true; }
};

// "[rank r/N] all_reduce (seq 7, gloo, group world)": the head of every message about an op.
std::string describe(const OpInfo& info);

}  // namespace dtrain::comm

// CommLog: the collectives issued on behalf of something (a DTensor op, a strategy's gradient reduction, a
// tensor-parallel block, the clipping norm), each with its cause, kind, bytes, and its predicted and measured
// time (DESIGN §4, "Comm accounting"). Tests and users read per-step totals; clear() starts a new step.
// Thread-safe.
//
// Recorded in one place, where collectives are issued: Backend's all_reduce, reduce_scatter(_v),
// all_gather(_v) and all_to_all(_v) (comm/backend.cpp) record every collective issued while a CommCause is
// alive on the issuing thread, once its Work is waited for. The code that communicates only names why
// (CommCause); collectives issued outside any cause (set-up broadcasts and checks, checkpoint I/O, the
// trainer's own bookkeeping) and broadcast, barrier, send and recv are not in the log.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/cost_model.h"

namespace c10 {
class OperatorHandle;
}

namespace dtrain::comm {

struct CommRecord {
  std::string cause;  // "aten::mm", "dp buckets", "zero3", ... (CommCause)
  StepKind kind;
  int axis;       // the mesh axis of a DTensor redistribution step; 0 otherwise
  int64_t bytes;  // contributed by this rank
  double predicted_s;
  double measured_s;  // from issue to the first wait that returned
};

struct CommTotals {
  int64_t collectives = 0;
  int64_t bytes = 0;
  double predicted_s = 0;
  double measured_s = 0;
  std::map<std::string, int64_t> by_kind;   // "all_reduce" -> count
  std::map<std::string, int64_t> by_cause;  // "aten::add_.Tensor" -> count
};

// Bounded: the totals and the summary count every collective since the last clear(), but only the last
// capacity() records are kept one by one (older ones are dropped, and counted by dropped()), so a long run
// that never clears holds a fixed amount of memory.
class CommLog {
 public:
  static constexpr size_t kDefaultCapacity = 65536;
  static CommLog& instance();
  void record(CommRecord r);
  // The most recent records (at most capacity()), oldest first.
  std::vector<CommRecord> records() const;
  CommTotals totals() const;
  // One line per cause and kind: "aten::addmm: 2 x all_gather, 1.2 KB, predicted 0.4 ms, measured 0.9 ms".
  std::string summary() const;
  // Records dropped since the last clear() to keep within the capacity.
  int64_t dropped() const;
  void set_capacity(size_t n);
  void clear();

 private:
  struct Row {
    int64_t n = 0, bytes = 0;
    double predicted = 0, measured = 0;
  };
  mutable std::mutex mu_;
  size_t capacity_ = kDefaultCapacity;                       // guarded by mu_
  std::deque<CommRecord> records_;                           // guarded by mu_
  CommTotals totals_;                                        // guarded by mu_
  std::map<std::pair<std::string, std::string>, Row> rows_;  // guarded by mu_; (cause, kind)
  int64_t dropped_ = 0;                                      // guarded by mu_
};

// While alive, the collectives this thread issues are logged under its cause. Nests: the innermost wins.
class CommCause {
 public:
  explicit CommCause(std::string cause);
  // An aten op: its name is formed only when it communicates (DTensor's handler sets this for every op).
  explicit CommCause(const c10::OperatorHandle& op);
  // A step of a planned redistribution: its mesh axis and the plan's predicted seconds, under the current
  // cause ("redistribute" when none).
  CommCause(int axis, double predicted_s);
  ~CommCause();
  CommCause(const CommCause&) = delete;
  CommCause& operator=(const CommCause&) = delete;

  // Whether a cause is alive on this thread (its collectives are logged).
  static bool active();
  static std::string current();  // "" when none
  static int axis();             // the current step's axis; 0 when none was given
  // The predicted seconds the current step gave; nullopt: the cost model's (predicted_collective_seconds).
  static std::optional<double> predicted();

 private:
  struct Scope {
    bool active = false;
    std::string cause;
    const c10::OperatorHandle* op = nullptr;  // when set, the cause (over `cause`)
    int axis = 0;
    std::optional<double> predicted;
  };
  Scope previous_;
};

// While alive, the collectives this thread issues are not logged, whatever cause is alive: a library's own
// checks inside an op (DTensor's decision check) that are not the op's communication.
class NotLogged {
 public:
  NotLogged();
  ~NotLogged();
  NotLogged(const NotLogged&) = delete;
  NotLogged& operator=(const NotLogged&) = delete;

 private:
  bool previous_;
};

// Seconds the cost model (DTRAIN_COMM_PROFILE's profile when it names one, else the defaults) predicts for a
// collective of `kind` on `group_size` ranks to which this rank contributes `bytes`.
double predicted_collective_seconds(StepKind kind, int64_t bytes, int group_size);

}  // namespace dtrain::comm

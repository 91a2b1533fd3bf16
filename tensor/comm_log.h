// CommLog: every collective the DTensor layer issues, with the op that caused it, its bytes, and its
// predicted and measured time (DESIGN §4, "Comm accounting"). Tests and users read per-step totals; clear()
// starts a new step. Thread-safe.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/redistribute_plan.h"

namespace dtrain::tensor {

struct CommRecord {
  std::string
      cause;  // the aten op whose sharding needed it ("aten::mm"), or "redistribute" for a direct call
  StepKind kind;
  int axis;
  int64_t bytes;  // contributed by this rank
  double predicted_s;
  double measured_s;
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

// Names the op on whose behalf collectives run in this thread while it lives (the dispatcher sets it).
class CommCause {
 public:
  explicit CommCause(std::string op);
  // An aten op: its name is formed only when it communicates (the handler sets this for every op).
  explicit CommCause(const c10::OperatorHandle& op);
  ~CommCause();
  CommCause(const CommCause&) = delete;
  CommCause& operator=(const CommCause&) = delete;
  static std::string current();  // "redistribute" when none is set

 private:
  std::string previous_;
  const c10::OperatorHandle* previous_op_;
  bool by_op_;
};

}  // namespace dtrain::tensor

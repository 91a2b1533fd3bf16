// CommLog: every collective the DTensor layer issues, with the op that caused it, its bytes, and its
// predicted and measured time (DESIGN §4, "Comm accounting"). Tests and users read per-step totals; clear()
// starts a new step. Thread-safe.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/cost_model.h"

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

class CommLog {
 public:
  static CommLog& instance();
  void record(CommRecord r);
  std::vector<CommRecord> records() const;
  CommTotals totals() const;
  // One line per cause and kind: "aten::addmm: 2 x all_gather, 1.2 KB, predicted 0.4 ms, measured 0.9 ms".
  std::string summary() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<CommRecord> records_;  // guarded by mu_
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

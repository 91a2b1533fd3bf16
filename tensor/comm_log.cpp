// CommLog and CommCause; see comm_log.h.
#include "tensor/comm_log.h"

#include <cstdio>

namespace dtrain::tensor {

namespace {
thread_local std::string t_cause = "redistribute";
thread_local const c10::OperatorHandle* t_cause_op = nullptr;  // when set, the cause (over t_cause)
}  // namespace

CommLog& CommLog::instance() {
  static CommLog log;
  return log;
}

void CommLog::record(CommRecord r) {
  std::lock_guard<std::mutex> lock(mu_);
  ++totals_.collectives;
  totals_.bytes += r.bytes;
  totals_.predicted_s += r.predicted_s;
  totals_.measured_s += r.measured_s;
  ++totals_.by_kind[to_string(r.kind)];
  ++totals_.by_cause[r.cause];
  Row& row = rows_[{r.cause, to_string(r.kind)}];
  ++row.n;
  row.bytes += r.bytes;
  row.predicted += r.predicted_s;
  row.measured += r.measured_s;
  records_.push_back(std::move(r));
  while (records_.size() > capacity_) {
    records_.pop_front();
    ++dropped_;
  }
}

std::vector<CommRecord> CommLog::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {records_.begin(), records_.end()};
}

CommTotals CommLog::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

int64_t CommLog::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void CommLog::set_capacity(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = n;
  while (records_.size() > capacity_) {
    records_.pop_front();
    ++dropped_;
  }
}

std::string CommLog::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [key, row] : rows_) {
    char line[256];
    std::snprintf(line, sizeof(line), "%s: %lld x %s, %lld B, predicted %.3f ms, measured %.3f ms\n",
                  key.first.c_str(), static_cast<long long>(row.n), key.second.c_str(),
                  static_cast<long long>(row.bytes), row.predicted * 1e3, row.measured * 1e3);
    out += line;
  }
  return out;
}

void CommLog::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  records_.clear();
  rows_.clear();
  totals_ = {};
  dropped_ = 0;
}

CommCause::CommCause(std::string op)
    : previous_(std::move(t_cause)), previous_op_(t_cause_op), by_op_(false) {
  t_cause = std::move(op);
  t_cause_op = nullptr;
}
CommCause::CommCause(const c10::OperatorHandle& op) : previous_op_(t_cause_op), by_op_(true) {
  t_cause_op = &op;
}
CommCause::~CommCause() {
  t_cause_op = previous_op_;
  if (!by_op_) t_cause = std::move(previous_);
}
std::string CommCause::current() {
  if (t_cause_op == nullptr) return t_cause;
  const auto& n = t_cause_op->schema().operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

}  // namespace dtrain::tensor

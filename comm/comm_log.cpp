// CommLog and CommCause; see comm_log.h.
#include "comm/comm_log.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdio>
#include <cstdlib>

namespace dtrain::comm {

namespace {

thread_local bool t_active = false;
thread_local std::string t_cause;
thread_local const c10::OperatorHandle* t_cause_op = nullptr;  // when set, the cause (over t_cause)
thread_local int t_axis = 0;
thread_local std::optional<double> t_predicted;

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

CommCause::CommCause(std::string cause)
    : previous_{t_active, std::move(t_cause), t_cause_op, t_axis, t_predicted} {
  t_active = true;
  t_cause = std::move(cause);
  t_cause_op = nullptr;
  t_axis = 0;
  t_predicted.reset();
}

CommCause::CommCause(const c10::OperatorHandle& op)
    : previous_{t_active, std::move(t_cause), t_cause_op, t_axis,
                t_predicted} {  // (t_cause unused under an op)
  t_active = true;
  t_cause_op = &op;
  t_axis = 0;
  t_predicted.reset();
}

CommCause::CommCause(int axis, double predicted_s)
    : previous_{t_active, t_cause, t_cause_op, t_axis, t_predicted} {
  if (!t_active) {
    t_cause = "redistribute";
    t_cause_op = nullptr;
  }
  t_active = true;
  t_axis = axis;
  t_predicted = predicted_s;
}

CommCause::~CommCause() {
  t_active = previous_.active;
  t_cause = std::move(previous_.cause);
  t_cause_op = previous_.op;
  t_axis = previous_.axis;
  t_predicted = previous_.predicted;
}

bool CommCause::active() { return t_active; }

NotLogged::NotLogged() : previous_(t_active) { t_active = false; }

NotLogged::~NotLogged() { t_active = previous_; }

std::string CommCause::current() {
  if (!t_active) return "";
  if (t_cause_op == nullptr) return t_cause;
  const auto& n = t_cause_op->schema().operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

int CommCause::axis() { return t_axis; }

std::optional<double> CommCause::predicted() { return t_predicted; }

double predicted_collective_seconds(StepKind kind, int64_t bytes, int group_size) {
  if (group_size <= 1 || bytes == 0) return 0;
  static const CostModel model = [] {
    const char* profile = std::getenv("DTRAIN_COMM_PROFILE");
    return profile == nullptr || *profile == '\0' ? CostModel::defaults(1)
                                                  : CostModel::from_profile(read_profile(profile), 1);
  }();
  const double n = group_size, b = static_cast<double>(bytes);
  double bus = b * (n - 1) / n;  // reduce_scatter (b: the whole input), all_to_all
  if (kind == StepKind::kAllReduce) bus = b * 2 * (n - 1) / n;
  if (kind == StepKind::kAllGather) bus = b * (n - 1);  // (b: this rank's part of the whole output)
  return model.seconds(kind, 0, bus);
}

}  // namespace dtrain::comm

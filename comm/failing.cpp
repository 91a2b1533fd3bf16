// The exit budget; see failing.h.
#include "comm/detail/failing.h"

#include <atomic>

namespace dtrain::comm {

namespace {
// The end of the exit budget in steady-clock ticks; max while the process is not failing.
std::atomic<FailClock::rep> g_exit_deadline{FailClock::time_point::max().time_since_epoch().count()};
}  // namespace

void mark_failing() {
  FailClock::rep none = FailClock::time_point::max().time_since_epoch().count();
  const FailClock::rep end = (FailClock::now() + kExitBudget).time_since_epoch().count();
  g_exit_deadline.compare_exchange_strong(none, end);
}

bool failing() { return g_exit_deadline.load() != FailClock::time_point::max().time_since_epoch().count(); }

FailClock::time_point within_exit_budget(FailClock::time_point deadline) {
  const FailClock::time_point end{FailClock::duration(g_exit_deadline.load())};
  return deadline < end ? deadline : end;
}

}  // namespace dtrain::comm

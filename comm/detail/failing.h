// The exit budget: once a collective of this process failed (a timeout, a peer that died or failed, an engine
// error), the process is on its way out, and everything it still does in comm on that way (reporting to the
// failure board, publishing progress, leaving the job's store, tearing down groups and engines) shares one
// deadline: kExitBudget after the failure. No exit path starts a timeout of its own, so a job ends within its
// timeout and a few seconds, however many paths a rank takes to leave.
#pragma once

#include <chrono>

namespace dtrain::comm {

using FailClock = std::chrono::steady_clock;

// What the process may still spend in comm, all paths together, after its first failure.
inline constexpr std::chrono::milliseconds kExitBudget{2000};

// Marks the process as failing; the first call starts the exit budget, later ones keep it. Thread-safe.
void mark_failing();
// Whether mark_failing() was called.
bool failing();
// `deadline`, or the end of the exit budget when the process is failing and that comes first.
FailClock::time_point within_exit_budget(FailClock::time_point deadline);

}  // namespace dtrain::comm

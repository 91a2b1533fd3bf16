// The launcher behind `dtrain run`: starts the ranks of one node, relays their output with a "[rank R] "
// prefix, stops the whole group when one rank fails or the launcher is interrupted, and restarts the group on
// request.
#pragma once

#include "launch/launch_options.h"

namespace dtrain::launch {

// Runs opts.command as opts.nproc ranks on this node and waits for them.
//
// backend gloo: spawns nproc children, each in its own process group, with the launcher's environment plus
//   rank_env() (rank_env.h); stdin is /dev/null; each stdout/stderr line is re-printed on the launcher's
//   stdout/stderr as "[rank R] line" (R the global rank). With master_port 0 (single node) a free port on
//   master_addr is picked for every attempt.
// backend mpi: runs mpirun_command() as one child and relays its (--tag-output) lines unchanged.
// When a child exits non-zero or is killed by a signal, the others get SIGTERM and, after opts.stop_grace,
// SIGKILL (to their whole process groups); one line on stderr names the child, its pid and its exit code or
// signal. SIGINT, SIGTERM and SIGHUP to the launcher are forwarded the same way (a second one sends SIGKILL
// at once). After a failure the group is relaunched up to opts.max_restarts times with DTRAIN_RESTART_COUNT
// counting up.
//
// Returns 0 when every rank exited 0; 1 when the last attempt failed; 128 + signal number when the launcher
// was stopped by a signal (no restart then). Throws ValueError for invalid options (it calls validate()), a
// program that cannot be started, or a master_addr it cannot bind.
//
// Not reentrant: it owns the process's SIGINT/SIGTERM/SIGHUP handlers and ignores SIGPIPE while it runs
// (restoring them on return), so at most one run() may be active in a process. If the launcher itself is
// SIGKILLed its ranks are not stopped.
int run(const LaunchOptions& opts);

}  // namespace dtrain::launch

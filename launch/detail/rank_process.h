// One child of the launcher (a rank, or mpirun): started in its own process group with its stdout and stderr
// through pipes, watched through a pidfd, signalled as a group. Internal to the launcher; not thread-safe.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "launch/detail/line_relay.h"
#include "launch/rank_env.h"

namespace dtrain::launch::detail {

class RankProcess {
 public:
  // Starts argv[0], looked up on the launcher's PATH, with the launcher's environment plus `extra_env` (which
  // wins), stdin from /dev/null, and stdout/stderr relayed to `out_fd`/`err_fd` with `prefix` on every line.
  // `label` names the child in messages ("rank 2"). The child gets `death_signal` when the launcher dies
  // (PR_SET_PDEATHSIG), so a killed launcher leaves no ranks behind. Throws ValueError when the program
  // cannot be started.
  RankProcess(std::string label, const std::string& prefix, const std::vector<std::string>& argv,
              const EnvList& extra_env, int out_fd, int err_fd, int death_signal);
  // A child that was never reaped is killed with its group and reaped, so an exception never leaks processes.
  ~RankProcess();
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  const std::string& label() const { return label_; }
  pid_t pid() const { return pid_; }
  // Readable once the child has exited; -1 when the kernel has no pidfds (then poll exited() on a timer).
  int pidfd() const { return pidfd_; }
  int out_fd() const { return out_pipe_; }  // -1 once at end of stream
  int err_fd() const { return err_pipe_; }

  // Whether the child has exited; leaves it unreaped (a zombie), so its process group can still be signalled.
  bool exited();
  // The wait status once exited() returned true.
  int status() const { return status_; }
  // Collects the exited child; after this the group is never signalled again (its id may be reused).
  void reap();
  bool reaped() const { return reaped_; }

  // Sends `sig` to the child's process group (it and its descendants); a no-op once reaped.
  void signal_group(int sig);

  // Reads what is available on `fd` (out_fd() or err_fd()) and relays it; at end of stream flushes the
  // partial line and closes the pipe. With `until_empty` it keeps reading until the pipe has nothing more
  // right now.
  void pump(int fd, bool until_empty = false);
  // Relays what is left in both pipes without waiting, then closes them (the child may have left descendants
  // that hold the pipes open).
  void drain_and_close();

 private:
  void close_pipe(int& fd, LineRelay& relay);

  std::string label_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_pipe_ = -1;
  int err_pipe_ = -1;
  LineRelay out_relay_;
  LineRelay err_relay_;
  bool exited_ = false;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace dtrain::launch::detail

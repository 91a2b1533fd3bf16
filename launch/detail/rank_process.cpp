// Spawning and watching one child process; see rank_process.h.
#include "launch/detail/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/env.h"
#include "core/error.h"

namespace dtrain::launch::detail {

namespace {

// Owns the spawn attributes and file actions, which need explicit destruction.
struct SpawnSetup {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t actions;
  SpawnSetup() {
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_init(&actions);
  }
  ~SpawnSetup() {
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
  }
};

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(str_cat("dtrain run: pipe2 failed: ", std::strerror(errno),
                        ". The launcher may have run out of file descriptors; raise `ulimit -n`."));
  }
  // Only the launcher's read end is non-blocking; the child writes to a normal blocking pipe.
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
}

}  // namespace

RankProcess::RankProcess(std::string label, const std::string& prefix, const std::vector<std::string>& argv,
                         const EnvList& extra_env, int out_fd, int err_fd)
    : label_(std::move(label)), out_relay_(prefix, out_fd), err_relay_(prefix, err_fd) {
  DTRAIN_ASSERT(!argv.empty(), "no program for ", label_);
  EnvMap env = current_env();
  for (const auto& [k, v] : extra_env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int out[2], err[2];
  make_pipe(out);
  try {
    make_pipe(err);
  } catch (...) {
    ::close(out[0]);
    ::close(out[1]);
    throw;
  }

  SpawnSetup s;
  // Own process group: signals to the group reach the rank's descendants (`sh -c` wrappers), and a Ctrl-C in
  // the terminal reaches only the launcher, which forwards it. Signals the launcher catches or ignores are
  // reset.
  sigset_t defaults, empty;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setflags(&s.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&s.attr, 0);
  posix_spawnattr_setsigmask(&s.attr, &empty);
  posix_spawnattr_setsigdefault(&s.attr, &defaults);
  // Ranks live in a background process group: reading the terminal would stop them (SIGTTIN).
  posix_spawn_file_actions_addopen(&s.actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&s.actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&s.actions, err[1], 2);

  const int rc = ::posix_spawnp(&pid_, args[0], &s.actions, &s.attr, args.data(), envp.data());
  ::close(out[1]);
  ::close(err[1]);
  out_pipe_ = out[0];
  err_pipe_ = err[0];
  if (rc != 0) {
    ::close(out_pipe_);
    ::close(err_pipe_);
    out_pipe_ = err_pipe_ = -1;
    reaped_ = true;
    throw ValueError(str_cat(
        "dtrain run: cannot start '", argv[0], "' for ", label_, ": ", std::strerror(rc),
        ". Check that the program exists and is executable; a name without '/' is looked up ", "on PATH."));
  }
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ >= 0) ::fcntl(pidfd_, F_SETFD, FD_CLOEXEC);
}

RankProcess::~RankProcess() {
  if (!reaped_) {
    signal_group(SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) ::close(pidfd_);
  if (out_pipe_ >= 0) ::close(out_pipe_);
  if (err_pipe_ >= 0) ::close(err_pipe_);
}

bool RankProcess::exited() {
  if (exited_) return true;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
    return false;
  }
  exited_ = true;
  status_ = info.si_code == CLD_EXITED ? W_EXITCODE(info.si_status & 0xff, 0) : W_EXITCODE(0, info.si_status);
  return true;
}

void RankProcess::reap() {
  if (reaped_) return;
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  status_ = st;  // the authoritative status
  exited_ = reaped_ = true;
  if (pidfd_ >= 0) ::close(pidfd_);
  pidfd_ = -1;
}

void RankProcess::signal_group(int sig) {
  if (reaped_) return;
  // The group exists while its leader (even as a zombie) is unreaped; fall back to the pid if setpgid lost a
  // race.
  if (::killpg(pid_, sig) != 0) ::kill(pid_, sig);
}

void RankProcess::pump(int fd, bool until_empty) {
  if (fd < 0) return;
  LineRelay& relay = fd == out_pipe_ ? out_relay_ : err_relay_;
  int& pipe = fd == out_pipe_ ? out_pipe_ : err_pipe_;
  char buf[16384];
  do {
    ssize_t n = ::read(pipe, buf, sizeof(buf));
    if (n > 0) {
      relay.feed(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    close_pipe(pipe, relay);  // end of stream, or an error that will not go away
    return;
  } while (until_empty);
}

void RankProcess::drain_and_close() {
  pump(out_pipe_, true);
  pump(err_pipe_, true);
  if (out_pipe_ >= 0) close_pipe(out_pipe_, out_relay_);
  if (err_pipe_ >= 0) close_pipe(err_pipe_, err_relay_);
}

void RankProcess::close_pipe(int& fd, LineRelay& relay) {
  relay.flush();
  ::close(fd);
  fd = -1;
}

}  // namespace dtrain::launch::detail

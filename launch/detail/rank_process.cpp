// Spawning and watching one child process; see rank_process.h.
#include "launch/detail/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/env.h"
#include "core/error.h"

namespace dtrain::launch::detail {

namespace {

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(str_cat("dtrain run: pipe2 failed: ", std::strerror(errno),
                        ". The launcher may have run out of file descriptors; raise `ulimit -n`."));
  }
  // Only the launcher's read end is non-blocking; the child writes to a normal blocking pipe.
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
}

// `name` itself when it contains a '/', else the first executable file of that name on PATH; "" if none.
std::string find_program(const std::string& name, const EnvMap& env) {
  if (name.find('/') != std::string::npos) return name;
  auto it = env.find("PATH");
  std::string dirs = it == env.end() ? "/usr/local/bin:/usr/bin:/bin" : it->second;
  size_t start = 0;
  for (;;) {
    size_t end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

}  // namespace

RankProcess::RankProcess(std::string label, const std::string& prefix, const std::vector<std::string>& argv,
                         const EnvList& extra_env, int out_fd, int err_fd, int death_signal)
    : label_(std::move(label)), out_relay_(prefix, out_fd), err_relay_(prefix, err_fd) {
  DTRAIN_ASSERT(!argv.empty(), "no program for ", label_);
  EnvMap env = current_env();
  for (const auto& [k, v] : extra_env) env[k] = v;
  CStringArray envp(env_strings(env)), args(argv);

  int out[2], err[2];
  make_pipe(out);
  try {
    make_pipe(err);
  } catch (...) {
    ::close(out[0]);
    ::close(out[1]);
    throw;
  }

  // The program's path, looked up here: between fork and exec the child may only make async-signal-safe
  // calls (the launcher may have threads).
  std::string path = find_program(argv[0], env);
  int status_pipe[2];  // the child writes errno here if exec fails; closed by a successful exec
  make_pipe(status_pipe);
  ::fcntl(status_pipe[0], F_SETFL, ::fcntl(status_pipe[0], F_GETFL) & ~O_NONBLOCK);
  const pid_t parent = ::getpid();
  sigset_t empty;
  sigemptyset(&empty);
  pid_ = path.empty() ? -1 : ::fork();
  if (pid_ == 0) {
    // Own process group: signals to the group reach the rank's descendants (`sh -c` wrappers), and a Ctrl-C
    // in the terminal reaches only the launcher, which forwards it. Dies with the launcher. Signals the
    // launcher catches or ignores are reset. Ranks live in a background process group: reading the terminal
    // would stop them (SIGTTIN), so stdin is /dev/null.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, death_signal);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before the line above
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(path.c_str(), args.data(), envp.data());
    int e = errno;
    [[maybe_unused]] ssize_t n = ::write(status_pipe[1], &e, sizeof(e));
    ::_exit(127);
  }
  int rc = path.empty() ? ENOENT : pid_ < 0 ? errno : 0;
  ::close(status_pipe[1]);
  if (pid_ > 0) {
    ::setpgid(pid_, pid_);  // also here, so that signal_group() never races the child's own call
    int e = 0;
    ssize_t n;
    while ((n = ::read(status_pipe[0], &e, sizeof(e))) < 0 && errno == EINTR) {
    }
    if (n == sizeof(e)) {
      rc = e;
      int st;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  ::close(status_pipe[0]);
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

// The launcher's event loop; see launcher.h.
//
// One attempt ("group") is a loop over poll(): the signal self-pipe, every child's stdout and stderr pipes,
// and every child's pidfd. Cases:
//   output readable       -> relay complete lines with the child's prefix
//   child exited, code 0  -> reap it; the others keep running
//   child failed          -> remember it (first failure only), SIGTERM every unreaped group (its own too, for
//                            descendants), arm the SIGKILL deadline, reap it
//   signal to launcher    -> forward it to every group and arm the deadline; a second one sends SIGKILL
//   deadline passed       -> SIGKILL every unreaped group
//   rank 0's store gone   -> (node 1, 2, ... under gloo) ranks still running 3 s later are stopped as after a
//                            failed child: the job ended on another node (a job that ends well ends here too)
// The attempt ends when every child is reaped; what is left in the pipes is relayed, then one summary line is
// printed.
#include "launch/launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "core/env.h"
#include "core/error.h"
#include "core/secure_random.h"
#include "launch/detail/line_relay.h"
#include "launch/detail/rank_process.h"
#include "launch/detail/store_watch.h"
#include "launch/rank_env.h"

namespace dtrain::launch {

using detail::RankProcess;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};
int g_signal_pipe_write = -1;  // written by the handler; one run() per process

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe_write, &b, 1);
  errno = saved;
}

// Installs the forwarding handlers for the duration of run() and restores the previous ones.
class SignalPipe {
 public:
  SignalPipe() {
    DTRAIN_ASSERT(g_signal_pipe_write < 0, "dtrain::launch::run() is already running in this process");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(str_cat("dtrain run: pipe2 failed: ", std::strerror(errno), ". Raise `ulimit -n`."));
    }
    read_fd_ = fds[0];
    g_signal_pipe_write = fds[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      ::sigaction(kForwardedSignals[i], &sa, &old_[i]);
    }
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);  // a closed stdout must not kill the launcher before its ranks
  }
  ~SignalPipe() {
    for (std::size_t i = 0; i < std::size(kForwardedSignals); ++i)
      ::sigaction(kForwardedSignals[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe_write);
    g_signal_pipe_write = -1;
    ::close(read_fd_);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_fd_; }
  // Signals received since the last call, in order.
  std::vector<int> take() {
    std::vector<int> sigs;
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(read_fd_, buf, sizeof(buf))) > 0) sigs.insert(sigs.end(), buf, buf + n);
    return sigs;
  }

 private:
  int read_fd_ = -1;
  struct sigaction old_[std::size(kForwardedSignals)]{};
  struct sigaction old_pipe_ {};
};

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? str_cat("SIG", abbrev) : str_cat("signal ", sig);
}

// "exited with code 3" / "was killed by signal 9 (SIGKILL)".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return str_cat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return str_cat("was killed by signal ", WTERMSIG(status), " (", signal_name(WTERMSIG(status)), ")");
  return str_cat("ended with wait status ", status);
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// Binds port 0 on `addr`, reads the port the kernel chose and releases it. Another process could take the
// port before the ranks bind it (as with torchrun); on one node that is rare.
int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(addr.c_str(), "0", &hints, &res); rc != 0) {
    throw ValueError(str_cat("dtrain run: --master-addr '", addr, "' does not resolve: ", ::gai_strerror(rc),
                             ". Use an address of this machine, e.g. 127.0.0.1."));
  }
  std::string last_error = "no address";
  int port = 0;
  for (addrinfo* ai = res; ai != nullptr && port == 0; ai = ai->ai_next) {
    int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (s < 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::bind(s, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    } else {
      last_error = std::strerror(errno);
    }
    ::close(s);
  }
  ::freeaddrinfo(res);
  if (port == 0) {
    throw ValueError(str_cat("dtrain run: cannot bind a port on --master-addr '", addr, "': ", last_error,
                             ". On a single node use an address of this machine (e.g. 127.0.0.1), or pass ",
                             "--master-port."));
  }
  return port;
}

// The job secret to hand to the ranks (DTRAIN_JOB_SECRET), or "" when the user gave one (DTRAIN_JOB_SECRET or
// DTRAIN_JOB_SECRET_FILE, which the ranks read themselves). One node: a fresh secret in the ranks'
// environment. Several nodes: node 0 writes a fresh one to a file only the user can read and says how to pass
// it on; the other nodes must be given it.
std::string job_secret(const LaunchOptions& o, const EnvMap& env) {
  if (env.count("DTRAIN_JOB_SECRET") || env.count("DTRAIN_JOB_SECRET_FILE") || o.backend == "mpi") return "";
  if (o.nnodes == 1) return random_hex(32);
  if (o.node_rank != 0) {
    throw ValueError(str_cat("dtrain run: node ", o.node_rank, " of a ", o.nnodes,
                             "-node job has no job secret, so rank 0 would refuse its ranks. Start it with "
                             "DTRAIN_JOB_SECRET_FILE=<the file node 0 printed> (copied here, mode 600) or "
                             "DTRAIN_JOB_SECRET=<its contents>."));
  }
  std::string home = env.count("HOME") ? env.at("HOME") : "/tmp";
  std::string dir = home + "/.dtrain";
  ::mkdir(dir.c_str(), 0700);
  std::string path = str_cat(dir, "/job-", o.master_port, ".secret");
  std::string secret = random_hex(32);
  {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::fchmod(fd, 0600) != 0) {
      throw Error(str_cat("dtrain run: cannot write the job secret to ", path, ": ", std::strerror(errno),
                          ". Set DTRAIN_JOB_SECRET_FILE to a file of your own on every node."));
    }
    std::string line = secret + "\n";
    detail::write_all(fd, line);
    ::close(fd);
  }
  detail::write_all(
      2, str_cat("dtrain run: the job secret is in ", path,
                 " (readable only by you). Start the other nodes with DTRAIN_JOB_SECRET_FILE "
                 "pointing at a copy of it (mode 600), or DTRAIN_JOB_SECRET set to its contents.\n"));
  return secret;
}

// DTRAIN_PROGRESS for the ranks: "1" when the launcher writes to a terminal (a rank may then draw a progress
// bar, which the line relay shows in place), "0" otherwise; the user's own value wins.
std::string progress_env() {
  if (const char* v = std::getenv("DTRAIN_PROGRESS")) return v;
  return ::isatty(1) ? "1" : "0";
}

struct GroupResult {
  bool ok = true;
  int interrupted_by = 0;  // the signal that stopped the launcher, 0 if none
};

// Starts the children of one attempt (see the file comment for the loop) and waits for all of them.
class Group {
 public:
  Group(const LaunchOptions& opts, SignalPipe& signals, std::string secret)
      : opts_(opts), signals_(signals), secret_(std::move(secret)) {}

  GroupResult run(int restart_count, const EnvMap& parent_env, int cores) {
    start(restart_count, parent_env, cores);
    loop();
    for (auto& c : children_) c->drain_and_close();
    return summarize();
  }

 private:
  void start(int restart_count, const EnvMap& parent_env, int cores) {
    if (opts_.backend == "mpi") {
      auto argv = mpirun_command(opts_, cores, ::geteuid() == 0, parent_env);
      EnvList env = {{"DTRAIN_RESTART_COUNT", std::to_string(restart_count)},
                     {"DTRAIN_LAUNCHER_PID", std::to_string(::getpid())},
                     {"DTRAIN_PROGRESS", progress_env()}};
      // SIGTERM, not SIGKILL, when the launcher dies: mpirun then stops its ranks itself.
      children_.push_back(std::make_unique<RankProcess>("mpirun", "", argv, env, 1, 2, SIGTERM));
      return;
    }
    const int port = opts_.master_port != 0 ? opts_.master_port : pick_free_port(opts_.master_addr);
    if (opts_.node_rank > 0) store_watch_.emplace(opts_.master_addr, port);
    for (int local_rank = 0; local_rank < opts_.nproc; ++local_rank) {
      const int rank = opts_.node_rank * opts_.nproc + local_rank;
      auto env = rank_env(opts_, local_rank, restart_count, port, cores, parent_env);
      env.emplace_back("DTRAIN_LAUNCHER_PID", std::to_string(::getpid()));
      env.emplace_back("DTRAIN_PROGRESS", progress_env());
      if (!secret_.empty()) env.emplace_back("DTRAIN_JOB_SECRET", secret_);
      children_.push_back(std::make_unique<RankProcess>(str_cat("rank ", rank), str_cat("[rank ", rank, "] "),
                                                        opts_.command, env, 1, 2, SIGKILL));
    }
  }

  void loop() {
    bool have_pidfds =
        std::all_of(children_.begin(), children_.end(), [](auto& c) { return c->pidfd() >= 0; });
    std::vector<pollfd> fds;
    while (std::any_of(children_.begin(), children_.end(), [](auto& c) { return !c->reaped(); })) {
      fds.clear();
      fds.push_back({signals_.fd(), POLLIN, 0});
      for (auto& c : children_) {
        for (int fd : {c->out_fd(), c->err_fd(), c->reaped() ? -1 : c->pidfd()}) {
          if (fd >= 0) fds.push_back({fd, POLLIN, 0});
        }
      }
      int timeout_ms = have_pidfds ? -1 : 50;  // without pidfds, look for exits on a timer
      if (store_watch_ && !stopping()) {
        const int due = store_gone_at_ ? 100 : store_watch_->due_in_ms();
        timeout_ms = timeout_ms < 0 ? due : std::min(timeout_ms, due);
      }
      if (deadline_ && !killed_) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - Clock::now()).count();
        timeout_ms = timeout_ms < 0 ? static_cast<int>(std::max<long>(0, left))
                                    : std::min(timeout_ms, static_cast<int>(std::max<long>(0, left)));
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
        throw Error(str_cat("dtrain run: poll failed: ", std::strerror(errno), "."));
      }
      for (int sig : signals_.take()) on_launcher_signal(sig);
      for (auto& c : children_) {
        for (const pollfd& p : fds) {
          if (p.revents == 0) continue;
          if (p.fd == c->out_fd() || p.fd == c->err_fd()) c->pump(p.fd);
        }
      }
      for (auto& c : children_) {
        if (!c->reaped() && c->exited()) on_exit(*c);
      }
      if (store_watch_ && !stopping()) {
        if (!store_gone_at_ && store_watch_->gone()) store_gone_at_ = Clock::now();
        if (store_gone_at_ && Clock::now() >= *store_gone_at_ + kStoreGoneWait) {
          store_gone_ = true;
          stop(SIGTERM);
        }
      }
      if (deadline_ && !killed_ && Clock::now() >= *deadline_)
        kill_all(str_cat("after the ", opts_.stop_grace.count(), " ms grace period"));
    }
  }

  void on_exit(RankProcess& c) {
    if (!first_exit_) first_exit_ = Failure{c.label(), c.pid(), c.status(), Clock::now()};
    if (failed(c.status()) && !stopping()) {
      failure_ = Failure{c.label(), c.pid(), c.status(), Clock::now()};
      stop(SIGTERM);  // c is a zombie until reaped below, so its group (descendants) is signalled too
    }
    c.reap();
  }

  void on_launcher_signal(int sig) {
    if (interrupted_by_) {
      kill_all("at a second signal");  // a second Ctrl-C: do not wait for the grace period
      return;
    }
    interrupted_by_ = sig;
    for (auto& c : children_) c->signal_group(sig);
    if (!deadline_) deadline_ = Clock::now() + opts_.stop_grace;
  }

  bool stopping() const { return deadline_.has_value(); }

  void stop(int sig) {
    for (auto& c : children_) c->signal_group(sig);
    deadline_ = Clock::now() + opts_.stop_grace;
  }

  void kill_all(const std::string& why) {
    if (killed_) return;
    kill_reason_ = why;
    for (auto& c : children_) {
      if (c->reaped()) continue;
      ++killed_count_;
      c->signal_group(SIGKILL);
    }
    killed_ = true;
  }

  GroupResult summarize() {
    GroupResult r;
    std::string forced;
    if (killed_count_ > 0) {
      forced = str_cat(" (", killed_count_, " needed SIGKILL ", kill_reason_, ")");
    }
    if (failure_) {
      r.ok = false;
      std::string others = children_.size() > 1 ? "; stopped the other ranks" : "";
      detail::write_all(2, str_cat("dtrain run: ", failure_->label, " (pid ", failure_->pid, ") ",
                                   describe_status(failure_->status), others, forced, "\n"));
      if (first_exit_ && first_exit_->label != failure_->label) {
        // The rank that left first is the likelier cause: the others may have failed waiting for it.
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(failure_->when - first_exit_->when);
        detail::write_all(2, str_cat("dtrain run: ", first_exit_->label, " (pid ", first_exit_->pid,
                                     ") had already ", describe_status(first_exit_->status), " ", ms.count(),
                                     " ms earlier, while the others ran: look there first\n"));
      }
    }
    if (store_gone_ && !failure_) {
      r.ok = false;
      detail::write_all(2,
                        str_cat("dtrain run: the job's store at ", store_watch_->where(),
                                " (rank 0's) stopped answering: rank 0 exited, so the job ended on another "
                                "node; stopped this node's ranks",
                                forced, "\n"));
    }
    if (interrupted_by_) {
      r.ok = false;
      r.interrupted_by = interrupted_by_;
      detail::write_all(2,
                        str_cat("dtrain run: received ", signal_name(interrupted_by_), "; forwarded it to ",
                                children_.size() == 1 ? children_[0]->label() : "all ranks", " and stopped ",
                                children_.size() == 1 ? "it" : "them", failure_ ? "" : forced, "\n"));
    }
    return r;
  }

  struct Failure {
    std::string label;
    pid_t pid;
    int status;
    Clock::time_point when;
  };

  const LaunchOptions& opts_;
  SignalPipe& signals_;
  std::string secret_;
  std::vector<std::unique_ptr<RankProcess>> children_;
  std::optional<Clock::time_point> deadline_;  // set once stopping: SIGKILL when it passes
  bool killed_ = false;
  int killed_count_ = 0;
  std::string kill_reason_;  // why SIGKILL was sent, for the summary line
  int interrupted_by_ = 0;
  std::optional<Failure> failure_;
  std::optional<Failure> first_exit_;               // the first child to exit, successful or not
  std::optional<detail::StoreWatch> store_watch_;   // node 1, 2, ...: rank 0's store port
  std::optional<Clock::time_point> store_gone_at_;  // when the watch saw it refuse after it had answered
  bool store_gone_ = false;                         // ranks were still running kStoreGoneWait later
  // How long this node's ranks may take to end by themselves once rank 0's store is gone (they end at once
  // when the job ended well, or when their peers' connections reset).
  static constexpr std::chrono::seconds kStoreGoneWait{3};
};

}  // namespace

int run(const LaunchOptions& opts) {
  validate(opts);
  SignalPipe signals;
  const EnvMap parent_env = current_env();
  const int cores = available_cores();
  const std::string secret = job_secret(opts, parent_env);
  for (int attempt = 0;; ++attempt) {
    GroupResult r = Group(opts, signals, secret).run(attempt, parent_env, cores);
    if (r.ok) return 0;
    if (r.interrupted_by) return 128 + r.interrupted_by;
    if (attempt >= opts.max_restarts) return 1;
    detail::write_all(2, str_cat("dtrain run: restarting the group (restart ", attempt + 1, " of ",
                                 opts.max_restarts, ")\n"));
  }
}

}  // namespace dtrain::launch

// Tests of the launcher (launch/): pure tests of validation, the rank environment and the mpirun command
// line, and process tests that run the launcher in a forked child against tests/fake_rank, under a parent
// deadline.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <regex>
#include <string>

#include "core/error.h"
#include "launch/launch_options.h"
#include "launch/launcher.h"
#include "launch/rank_env.h"

#ifndef DTRAIN_FAKE_RANK
#error "DTRAIN_FAKE_RANK must be defined to the path of the fake_rank test program"
#endif

namespace dtrain::launch {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

LaunchOptions fake(int nproc, std::vector<std::string> args) {
  LaunchOptions o;
  o.nproc = nproc;
  o.command = {DTRAIN_FAKE_RANK};
  o.command.insert(o.command.end(), args.begin(), args.end());
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// Pure tests.

std::string validate_error(const LaunchOptions& o) {
  try {
    validate(o);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchOptions, DefaultsWithACommandAreValid) { EXPECT_NO_THROW(validate(fake(1, {}))); }

TEST(LaunchOptions, RejectsBadValuesNamingThem) {
  auto o = fake(0, {});
  EXPECT_NE(validate_error(o).find("--nproc-per-node 0"), std::string::npos) << validate_error(o);
  o = fake(2, {});
  o.backend = "nccl2";
  EXPECT_NE(validate_error(o).find("'nccl2'"), std::string::npos);
  EXPECT_NE(validate_error(o).find("gloo or mpi"), std::string::npos);
  o = fake(2, {});
  o.nnodes = 0;
  EXPECT_NE(validate_error(o).find("--nnodes 0"), std::string::npos);
  o = fake(2, {});
  o.nnodes = 2;
  o.master_port = 29500;
  o.node_rank = 2;
  EXPECT_NE(validate_error(o).find("--node-rank 2 is outside [0, 2)"), std::string::npos)
      << validate_error(o);
  o.node_rank = -1;
  EXPECT_NE(validate_error(o).find("--node-rank -1"), std::string::npos);
  o = fake(2, {});
  o.nnodes = 2;
  o.node_rank = 1;
  EXPECT_NE(validate_error(o).find("--master-port"), std::string::npos);
  EXPECT_NE(validate_error(o).find("--nnodes 2"), std::string::npos);
  o = fake(2, {});
  o.max_restarts = -1;
  EXPECT_NE(validate_error(o).find("--max-restarts -1"), std::string::npos);
  o = fake(2, {});
  o.command.clear();
  EXPECT_NE(validate_error(o).find("command is empty"), std::string::npos);
  o = fake(2, {});
  o.master_port = 70000;
  EXPECT_NE(validate_error(o).find("70000"), std::string::npos);
}

TEST(LaunchOptions, MultiNodeMpiIsNotSupported) {
  auto o = fake(2, {});
  o.backend = "mpi";
  o.nnodes = 2;
  o.master_port = 29500;
  try {
    validate(o);
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun/srun"), std::string::npos) << e.what();
  }
}

TEST(RankEnv, SecondNodeOfTwo) {
  auto o = fake(3, {});
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.0.0.1";
  o.master_port = 29500;
  auto list = rank_env(o, 2, 1, 29500, 12, {});
  std::map<std::string, std::string> env(list.begin(), list.end());
  EXPECT_EQ(env.size(), list.size()) << "a variable is set twice";
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["WORLD_SIZE"], "6");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env["DTRAIN_BACKEND"], "gloo");
  EXPECT_EQ(env["DTRAIN_RESTART_COUNT"], "1");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env["MKL_NUM_THREADS"], "4");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "4");
  EXPECT_EQ(env["OMP_WAIT_POLICY"], "PASSIVE");
}

TEST(RankEnv, ThreadsAtLeastOneAndUserSettingsWin) {
  auto o = fake(4, {});
  auto list = rank_env(o, 0, 0, 1234, 2, {{"OMP_NUM_THREADS", "7"}, {"OMP_WAIT_POLICY", "ACTIVE"}});
  std::map<std::string, std::string> env(list.begin(), list.end());
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(env.count("OMP_WAIT_POLICY"), 0u);
  // the BLAS follow the user's OpenMP count (a different MKL count changes a matrix product's rounding)
  EXPECT_EQ(env["MKL_NUM_THREADS"], "7");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "7");
  // none set: cores / ranks, at least 1
  list = rank_env(o, 0, 0, 1234, 2, {});
  env = std::map<std::string, std::string>(list.begin(), list.end());
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["MKL_NUM_THREADS"], "1");
}

TEST(MpirunCommand, OversubscribedAsRoot) {
  auto o = fake(4, {"--print", "1"});
  o.backend = "mpi";
  auto cmd = mpirun_command(o, 2, true, {{"MKL_NUM_THREADS", "3"}});
  std::vector<std::string> want = {"mpirun",
                                   "-n",
                                   "4",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--bind-to",
                                   "none",
                                   "--tag-output",
                                   "--mca",
                                   "mpi_yield_when_idle",
                                   "1",
                                   "-x",
                                   "DTRAIN_BACKEND=mpi",
                                   "-x",
                                   "DTRAIN_RESTART_COUNT",
                                   "-x",
                                   "DTRAIN_LAUNCHER_PID",
                                   "-x",
                                   "DTRAIN_PROGRESS",
                                   "-x",
                                   "OMP_NUM_THREADS=3",
                                   "-x",
                                   "MKL_NUM_THREADS",
                                   "-x",
                                   "OPENBLAS_NUM_THREADS=3",
                                   "-x",
                                   "OMP_WAIT_POLICY=PASSIVE",
                                   DTRAIN_FAKE_RANK,
                                   "--print",
                                   "1"};
  EXPECT_EQ(cmd, want);
}

TEST(MpirunCommand, FitsOnCoresNotRoot) {
  auto o = fake(2, {});
  o.backend = "mpi";
  auto cmd = mpirun_command(o, 8, false);
  EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "--allow-run-as-root"), 0);
  EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "mpi_yield_when_idle"), 0);
  EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "OMP_NUM_THREADS=4"), 1);
  EXPECT_EQ(cmd.back(), DTRAIN_FAKE_RANK);
}

// ---------------------------------------------------------------------------------------------------------------
// Process tests: the launcher runs in a forked child (this binary has no libtorch and no threads, so fork is
// safe), with its stdout and stderr captured through pipes.

struct Launched {
  pid_t pid = -1;
  int pidfd = -1;
  int out = -1, err = -1;
};

struct Outcome {
  int rc = -1;  // launcher's exit code; -1 if it did not exit normally
  std::string out, err;
  bool timed_out = false;
  double seconds = 0;
};

Launched start_launcher(const LaunchOptions& opts) {
  int out[2], err[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    int rc;
    try {
      rc = run(opts);
    } catch (const std::exception& e) {
      std::string msg = std::string("exception: ") + e.what() + "\n";
      [[maybe_unused]] auto n = write(2, msg.data(), msg.size());
      rc = 100;
    }
    _exit(rc);
  }
  close(out[1]);
  close(err[1]);
  Launched l{pid, static_cast<int>(syscall(SYS_pidfd_open, pid, 0)), out[0], err[0]};
  return l;
}

// Reads the launcher's output until it exits. `on_output(out)` may send it a signal; it is called after every
// read. Past `deadline` the launcher is SIGKILLed (its fake ranks die with it through PDEATHSIG) and
// timed_out is set.
Outcome wait_launcher(Launched l, std::chrono::milliseconds deadline,
                      const std::function<void(const std::string&, pid_t)>& on_output = {}) {
  Outcome o;
  const auto t0 = Clock::now();
  bool exited = false;
  while (l.out >= 0 || l.err >= 0 || !exited) {
    std::vector<pollfd> fds;
    if (l.out >= 0) fds.push_back({l.out, POLLIN, 0});
    if (l.err >= 0) fds.push_back({l.err, POLLIN, 0});
    if (!exited) fds.push_back({l.pidfd, POLLIN, 0});
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t0 + deadline - Clock::now()).count();
    if (left <= 0) {
      o.timed_out = true;
      kill(l.pid, SIGKILL);
      deadline += 5s;  // collect what is left
      continue;
    }
    poll(fds.data(), fds.size(), static_cast<int>(left));
    for (auto* fd : {&l.out, &l.err}) {
      if (*fd < 0) continue;
      pollfd p{*fd, POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) continue;
      char buf[4096];
      ssize_t n = read(*fd, buf, sizeof(buf));
      if (n <= 0) {
        close(*fd);
        *fd = -1;
      } else {
        (fd == &l.out ? o.out : o.err).append(buf, n);
        if (on_output && fd == &l.out) on_output(o.out, l.pid);
      }
    }
    if (!exited) {
      pollfd p{l.pidfd, POLLIN, 0};
      exited = poll(&p, 1, 0) > 0;
    }
  }
  int st = 0;
  waitpid(l.pid, &st, 0);
  close(l.pidfd);
  o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return o;
}

Outcome launch(const LaunchOptions& opts, std::chrono::milliseconds deadline = 20s,
               const std::function<void(const std::string&, pid_t)>& on_output = {}) {
  return wait_launcher(start_launcher(opts), deadline, on_output);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::size_t start = 0;
  while (start < s.size()) {
    auto nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    v.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return v;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

int count_of(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (auto p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

TEST(Launcher, PrefixesEveryLineWithItsRank) {
  auto r = launch(fake(3, {"--print", "4"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0) << r.err;
  auto out = lines(r.out), err = lines(r.err);
  EXPECT_EQ(out.size(), 3u * 5u) << r.out;  // 4 lines and a partial "tail" line per rank
  EXPECT_EQ(err.size(), 3u * 4u) << r.err;
  std::regex out_line(R"(\[rank (\d)\] (out (\d) \d|tail (\d)))"), err_line(R"(\[rank (\d)\] err (\d) \d)");
  std::smatch m;
  for (const auto& l : out) {
    ASSERT_TRUE(std::regex_match(l, m, out_line)) << l;
    EXPECT_EQ(m[1], m[3].matched ? m[3] : m[4]) << l;
  }
  for (const auto& l : err) {
    ASSERT_TRUE(std::regex_match(l, m, err_line)) << l;
    EXPECT_EQ(m[1], m[2]) << l;
  }
  for (int r_ = 0; r_ < 3; ++r_) EXPECT_TRUE(contains(r.out, "[rank " + std::to_string(r_) + "] tail"));
}

TEST(Launcher, FailingRankStopsTheOthers) {
  auto o = fake(3, {"--exit-code", "7", "--on-rank", "2", "--hang"});
  o.stop_grace = 10s;  // the hanging ranks must go at SIGTERM, not at the SIGKILL deadline
  auto r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex(R"(dtrain run: rank 2 \(pid \d+\) exited with code 7; stopped )"
                                          R"(the other ranks\n)")))
      << r.err;
  EXPECT_FALSE(contains(r.err, "SIGKILL")) << r.err;
}

TEST(Launcher, StuckRankIsKilledAfterTheGracePeriod) {
  // Both ranks ignore SIGTERM; once both are ready the test kills rank 0, and rank 1 must get SIGKILL at the
  // deadline.
  auto o = fake(2, {"--hang", "--ignore-term"});
  o.stop_grace = 300ms;
  bool sent = false;
  auto r = launch(o, 20s, [&](const std::string& out, pid_t) {
    std::smatch m;
    if (!sent && count_of(out, "] ready ") == 2 &&
        std::regex_search(out, m, std::regex(R"(\[rank 0\] ready 0 pid (\d+))"))) {
      kill(std::stoi(m[1]), SIGKILL);
      sent = true;
    }
  });
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.rc, 1);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex(R"(rank 0 \(pid \d+\) was killed by signal 9 \(SIGKILL\); )"
                                          R"(stopped the other ranks \(1 needed SIGKILL after the 300 ms )"
                                          R"(grace period\))")))
      << r.err;
}

TEST(Launcher, RankKilledBySignalIsNamed) {
  auto r = launch(fake(2, {"--signal", "9", "--on-rank", "1", "--hang"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex(R"(rank 1 \(pid \d+\) was killed by signal 9 \(SIGKILL\))")))
      << r.err;
}

TEST(Launcher, RestartRecoversFromAFailure) {
  auto o = fake(2, {"--fail-first", "1", "--check-env"});
  o.max_restarts = 2;
  auto r = launch(o);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "dtrain run: restarting the group (restart 1 of 2)"), 1) << r.err;
  EXPECT_FALSE(contains(r.err, "restart 2 of 2"));
  // In the first attempt a rank may be stopped before it prints; the second attempt runs to the end on both.
  EXPECT_GE(count_of(r.out, "restart=0"), 1) << r.out;
  EXPECT_EQ(count_of(r.out, "restart=1"), 2) << r.out;
}

TEST(Launcher, RestartsRunOut) {
  auto o = fake(2, {"--fail-first", "5"});
  o.max_restarts = 2;
  auto r = launch(o);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "restart 1 of 2")) << r.err;
  EXPECT_TRUE(contains(r.err, "restart 2 of 2")) << r.err;
  EXPECT_EQ(count_of(r.err, "exited with code 3"), 3) << r.err;
  EXPECT_GE(count_of(r.err, "failing at restart 2"), 1) << r.err;
  EXPECT_FALSE(contains(r.err, "restart 3")) << r.err;
}

TEST(Launcher, SigintStopsAllRanks) {
  auto o = fake(3, {"--hang"});
  o.stop_grace = 10s;
  bool sent = false;
  auto r = launch(o, 20s, [&](const std::string& out, pid_t launcher) {
    if (!sent && count_of(out, "] ready ") == 3) {
      kill(launcher, SIGINT);
      sent = true;
    }
  });
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_TRUE(sent);
  EXPECT_EQ(r.rc, 128 + SIGINT);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_TRUE(contains(r.err, "dtrain run: received SIGINT; forwarded it to all ranks and stopped them"))
      << r.err;
}

TEST(Launcher, SecondSignalKillsRanksThatIgnoreTheFirst) {
  auto o = fake(2, {"--hang", "--ignore-term"});
  o.stop_grace = 60s;
  bool sent = false;
  auto r = launch(o, 20s, [&](const std::string& out, pid_t launcher) {
    if (!sent && count_of(out, "] ready ") == 2) {
      // Two different signals: a second SIGINT sent at once could merge with the first while it is pending.
      kill(launcher, SIGINT);
      kill(launcher, SIGTERM);
      sent = true;
    }
  });
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_TRUE(r.rc == 128 + SIGINT || r.rc == 128 + SIGTERM) << r.rc;
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_TRUE(contains(r.err, "(2 needed SIGKILL at a second signal)")) << r.err;
}

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

TEST(Launcher, TwoNodesShareOneWorld) {
  const int port = free_port();
  setenv("DTRAIN_JOB_SECRET", "two-nodes-share-this", 1);  // several nodes: the user hands out the secret
  std::vector<Launched> nodes;
  for (int node = 0; node < 2; ++node) {
    auto o = fake(2, {"--check-env"});
    o.nnodes = 2;
    o.node_rank = node;
    o.master_port = port;
    nodes.push_back(start_launcher(o));
  }
  std::string all;
  for (int node = 0; node < 2; ++node) {
    auto r = wait_launcher(nodes[node], 20s);
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(count_of(r.out, "world=4 local="), 2) << r.out;
    EXPECT_EQ(count_of(r.out, "master=127.0.0.1:" + std::to_string(port)), 2) << r.out;
    all += r.out;
  }
  unsetenv("DTRAIN_JOB_SECRET");
  for (int rank = 0; rank < 4; ++rank) {
    const std::string s = "[rank " + std::to_string(rank) + "] env rank=" + std::to_string(rank) + " ";
    EXPECT_EQ(count_of(all, s), 1) << all;
  }
}

TEST(Launcher, SingleNodePicksAPort) {
  auto r = launch(fake(2, {"--check-env"}));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(master=127\.0\.0\.1:(\d+))"))) << r.out;
  EXPECT_GT(std::stoi(m[1]), 0);
}

TEST(Launcher, MissingProgramIsAValueError) {
  LaunchOptions o;
  o.command = {"dtrain-no-such-program-xyz", "--flag"};
  try {
    run(o);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_TRUE(contains(e.what(), "'dtrain-no-such-program-xyz'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "PATH")) << e.what();
  }
}

bool have_mpirun() { return system("command -v mpirun >/dev/null 2>&1") == 0; }

TEST(Launcher, MpiBackendRunsMpirun) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun is not on PATH";
  auto o = fake(2, {"--print", "1"});
  o.backend = "mpi";
  auto r = launch(o, 30s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "out 0 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "out 1 0")) << r.out;
}

TEST(Launcher, MpiBackendRelaysFailure) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun is not on PATH";
  auto o = fake(2, {"--exit-code", "7", "--on-rank", "1", "--hang"});
  o.backend = "mpi";
  auto r = launch(o, 30s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(dtrain run: mpirun \(pid \d+\) exited with code \d+)")))
      << r.err;
}

}  // namespace
}  // namespace dtrain::launch

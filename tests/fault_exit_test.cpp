// Fault tier, exit paths (CTest label `fault`): how fast a job ends once a rank is gone. A rank killed
// (SIGKILL) is named as dead by the others in under 2 s, wherever its launcher is; a rank frozen (SIGSTOP) at
// any point of a run ends the job within the timeout + 10 s, every time, since no exit path starts a new
// deadline of its own.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include "tests/process_job.h"

namespace {

using namespace dtrain::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Waits until rank r wrote `ready<r>.txt` ("ready PID") or `deadline`; its pid, 0 where none came.
pid_t await_ready(const fs::path& dir, int r, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    std::string text = read_file(dir / ("ready" + std::to_string(r) + ".txt"));
    if (text.find('\n') != std::string::npos) return std::atoi(text.c_str() + 6);
    std::this_thread::sleep_for(20ms);  // polling for the rank to be in its loop
  }
  return 0;
}

// Waits until `c` exits (and reaps it) or `limit` after now, then kills it; the seconds it took (limit + 1
// when it did not end by itself).
double seconds_until_exit(const Child& c, double limit) {
  const auto t0 = Clock::now();
  int status = 0;
  while (std::chrono::duration<double>(Clock::now() - t0).count() < limit) {
    if (waitpid(c.pid, &status, WNOHANG) == c.pid)
      return std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(10ms);  // polling a child's exit
  }
  ::kill(c.pid, SIGKILL);
  waitpid(c.pid, &status, 0);
  return limit + 1;
}

// Two launchers on one host (`dtrain run -n 1 --nnodes 2`, one rank each, gloo: the ranks check agreement
// through shared memory), a 20 s timeout; rank 1 is killed mid-run. Rank 0 says that its process ended (not
// that it is late) in under 2 s, and its launcher ends.
TEST(FaultDeadPeer, KilledRankOnAnotherLauncherIsNamedDeadWithinTwoSeconds) {
  for (int round = 0; round < 2; ++round) {
    const fs::path dir = temp_dir();
    const std::string port = std::to_string(free_port());
    std::vector<Child> nodes;
    for (int node = 0; node < 2; ++node) {
      nodes.push_back(spawn({DTRAIN_BINARY, "run", "-n", "1", "--nnodes", "2", "--node-rank",
                             std::to_string(node), "--master-addr", "127.0.0.1", "--master-port", port,
                             "--backend", "gloo", "--", DTRAIN_COMM_WORKER, "cut-link", dir.string()},
                            {{"DTRAIN_TIMEOUT", "20"}, {"DTRAIN_JOB_SECRET", "two-launchers"}},
                            dir / ("node" + std::to_string(node) + ".txt")));
    }
    const auto deadline = Clock::now() + 60s;
    const pid_t rank0 = await_ready(dir, 0, deadline), rank1 = await_ready(dir, 1, deadline);
    ASSERT_TRUE(rank0 > 0 && rank1 > 0) << read_file(dir / "node0.txt") << read_file(dir / "node1.txt");
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 70 * round));  // mid-run, at two phases
    ASSERT_EQ(::kill(rank1, SIGKILL), 0);
    const double took = seconds_until_exit(nodes[0], 10);
    EXPECT_LT(took, 2.5) << "node 0's launcher ended " << took << " s after rank 1 was killed";
    const std::string report = read_file(dir / "cut0.txt");
    ASSERT_EQ(report.rfind("elapsed_ms ", 0), 0u) << report << read_file(dir / "node0.txt");
    EXPECT_LT(std::atol(report.c_str() + 11), 2000) << report;
    EXPECT_NE(report.find("rank 1 (pid " + std::to_string(rank1) +
                          ") exited without entering it: its process "
                          "ended while this rank waited for it (it died, was killed"),
              std::string::npos)
        << report;
    std::printf("round %d: node 0 ended %.2f s after the kill; rank 0: %s", round, took, report.c_str());
    EXPECT_FALSE(finish(nodes[1], 10s).timed_out) << "node 1's launcher outlived its rank";
    fs::remove_all(dir);
  }
}

// The same on mpi with one launcher: mpirun sees the death and ends the job, and the launcher says which
// rank died, in under 2 s.
TEST(FaultDeadPeer, KilledRankUnderMpiEndsTheJobWithinTwoSeconds) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun is not on PATH";
  const fs::path dir = temp_dir();
  Child job = spawn({DTRAIN_BINARY, "run", "-n", "2", "--backend", "mpi", "--", DTRAIN_COMM_WORKER,
                     "cut-link", dir.string()},
                    {{"DTRAIN_TIMEOUT", "20"}}, dir / "job.txt");
  const auto deadline = Clock::now() + 60s;
  const pid_t rank0 = await_ready(dir, 0, deadline), rank1 = await_ready(dir, 1, deadline);
  ASSERT_TRUE(rank0 > 0 && rank1 > 0) << read_file(dir / "job.txt");
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const double took = seconds_until_exit(job, 10);
  EXPECT_LT(took, 2.5) << "the job ended " << took << " s after rank 1 was killed";
  const std::string out = read_file(dir / "job.txt");
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find("signal 9"), std::string::npos) << out;
  std::printf("the job ended %.2f s after the kill:\n%s", took, out.c_str());
  fs::remove_all(dir);
}

}  // namespace

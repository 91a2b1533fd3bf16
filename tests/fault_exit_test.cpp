// Fault tier, exit paths (CTest label `fault`): how fast a job ends once a rank is gone. A rank killed
// (SIGKILL) is named as gone by the others in under 2 s, wherever its launcher is; a rank frozen (SIGSTOP) at
// any point of a run (core/fault_injection.h) ends the job within the timeout and a few seconds, every time,
// since no exit path starts a new deadline of its own (comm/detail/failing.h).
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
    // (before entering the op: the agreement board sees it; after: the engine's connection reset, then /proc)
    EXPECT_NE(report.find("rank 1 (pid " + std::to_string(rank1) + ") exited "), std::string::npos) << report;
    EXPECT_NE(report.find("its process is dead, not late (it died while this rank waited for it"),
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

// --- A frozen rank (SIGSTOP) at each point of a run -------------------------------------------------------

constexpr int kFreezeTimeout = 4;  // DTRAIN_TIMEOUT, seconds
constexpr int kFreezeGrace = 1;    // dtrain run --stop-grace, seconds
// The job must end within the timeout + this after the freeze: the survivors' exit (the exit budget of
// comm/detail/failing.h, 2 s at most), the launcher's grace before SIGKILL, and a step of compute after the
// freeze. A path that started a new deadline of its own would take another timeout (4 s) and fail it.
constexpr double kFreezeSlack = kFreezeGrace + 3.0;

// `dtrain train`'s own GPT (its gradients in more than one bucket: a frozen rank leaves the later buckets
// queued behind the first, which an exit path must not start), training until the freeze.
const std::vector<std::string> kTrainArgs{"--log-every", "1000", "--steps", "100000"};

struct FreezeCase {
  int rank;           // the rank that freezes
  std::string point;  // core/fault_injection.h
  int n;
};

std::string freeze_name(const FreezeCase& c) {
  return "rank " + std::to_string(c.rank) + " at " + c.point + " " + std::to_string(c.n);
}

// When the frozen rank stopped, from its own line in `output` (steady-clock ms); -1 when it did not.
double frozen_at_ms(const std::string& output) {
  const auto at = output.find("(monotonic ms ");
  return at == std::string::npos ? -1 : std::atof(output.c_str() + at + 14);
}

double now_ms() { return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(); }

// Checks one run: the freeze happened, the job (the launcher in `out`) ended with an error within the
// timeout + kFreezeSlack of it.
void expect_ended_in_time(const FreezeCase& c, const std::string& what, const std::string& out,
                          double ended_ms) {
  const double frozen = frozen_at_ms(out);
  ASSERT_GE(frozen, 0) << what << ": the rank never froze\n" << out;
  const double took = (ended_ms - frozen) / 1000;
  EXPECT_LT(took, kFreezeTimeout + kFreezeSlack)
      << what << ": the job ended " << took << " s after the freeze\n"
      << out;
  EXPECT_NE(out.find("error"), std::string::npos) << what << "\n" << out;
  std::printf("%s: ended %.1f s after the freeze (timeout %d s, grace %d s)\n", what.c_str(), took,
              kFreezeTimeout, kFreezeGrace);
}

// 3 ranks under one launcher; each case twice, so that an outcome of one run in two cannot pass.
class FreezeOneLauncher : public ::testing::TestWithParam<std::string> {};

TEST_P(FreezeOneLauncher, JobEndsWithinTheTimeoutAtEveryPoint) {
  const std::vector<FreezeCase> cases{
      {0, "collective", 40}, {1, "step", 6}, {0, "store", 40}, {2, "save", 4}, {0, "start", 0}};
  for (const FreezeCase& c : cases) {
    for (int round = 0; round < 2; ++round) {
      const fs::path dir = temp_dir();
      std::vector<std::string> argv{
          DTRAIN_BINARY, "run",         "-n",           "3",
          "--backend",   GetParam(),    "--stop-grace", std::to_string(kFreezeGrace),
          "--",          DTRAIN_BINARY, "train"};
      argv.insert(argv.end(), kTrainArgs.begin(), kTrainArgs.end());
      argv.insert(argv.end(), {"--save-every", "4", "--save", (dir / "ckpt").string()});
      Child job =
          spawn(argv,
                {{"DTRAIN_TIMEOUT", std::to_string(kFreezeTimeout)},
                 {"DTRAIN_TEST_FREEZE", std::to_string(c.rank) + ":" + c.point + ":" + std::to_string(c.n)}},
                dir / "job.txt");
      const double limit = 60;
      const double took = seconds_until_exit(job, limit);
      const double ended = now_ms();
      const std::string what = GetParam() + ", " + freeze_name(c) + ", round " + std::to_string(round);
      EXPECT_LT(took, limit) << what << ": the job did not end\n" << read_file(dir / "job.txt");
      expect_ended_in_time(c, what, read_file(dir / "job.txt"), ended);
      fs::remove_all(dir);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FreezeOneLauncher, ::testing::Values("gloo", "mpi"));

// Two launchers on one host (gloo), one rank each: the survivor's launcher ends within the timeout + slack
// of the other rank's freeze, the store's host frozen or not. A frozen rank on node 1 is stopped by its own
// launcher once rank 0's store is gone; node 0's launcher has nothing to learn the end from (the test ends
// it).
TEST(FreezeTwoLaunchers, SurvivorsLauncherEndsWithinTheTimeout) {
  const std::vector<FreezeCase> cases{{1, "collective", 40}, {0, "step", 6}, {1, "store", 40}};
  for (const FreezeCase& c : cases) {
    for (int round = 0; round < 2; ++round) {
      const fs::path dir = temp_dir();
      const std::string port = std::to_string(free_port());
      std::vector<Child> nodes;
      for (int node = 0; node < 2; ++node) {
        std::vector<std::string> argv{DTRAIN_BINARY,
                                      "run",
                                      "-n",
                                      "1",
                                      "--nnodes",
                                      "2",
                                      "--node-rank",
                                      std::to_string(node),
                                      "--master-addr",
                                      "127.0.0.1",
                                      "--master-port",
                                      port,
                                      "--backend",
                                      "gloo",
                                      "--stop-grace",
                                      std::to_string(kFreezeGrace),
                                      "--",
                                      DTRAIN_BINARY,
                                      "train"};
        argv.insert(argv.end(), kTrainArgs.begin(), kTrainArgs.end());
        nodes.push_back(spawn(
            argv,
            {{"DTRAIN_TIMEOUT", std::to_string(kFreezeTimeout)},
             {"DTRAIN_JOB_SECRET", "two-launchers"},
             {"DTRAIN_TEST_FREEZE", std::to_string(c.rank) + ":" + c.point + ":" + std::to_string(c.n)}},
            dir / ("node" + std::to_string(node) + ".txt")));
      }
      const int survivor = 1 - c.rank;
      const double took = seconds_until_exit(nodes[survivor], 60);
      const double ended = now_ms();
      const std::string what = "two launchers, " + freeze_name(c) + ", round " + std::to_string(round);
      const std::string out = read_file(dir / ("node" + std::to_string(c.rank) + ".txt")) + "\n--- node " +
                              std::to_string(survivor) + ":\n" +
                              read_file(dir / ("node" + std::to_string(survivor) + ".txt"));
      EXPECT_LT(took, 60) << what << ": the survivor's launcher did not end\n" << out;
      expect_ended_in_time(c, what, out, ended);
      if (c.rank != 0) {
        // The frozen rank's own launcher (not the store's host) sees rank 0's store go and stops it: within
        // the timeout + 10 s of the freeze (its 3 s wait for the ranks to end by themselves, the grace).
        seconds_until_exit(nodes[c.rank], 15);
        const double took = (now_ms() - frozen_at_ms(out)) / 1000;
        const std::string own = read_file(dir / ("node" + std::to_string(c.rank) + ".txt"));
        EXPECT_LT(took, kFreezeTimeout + 10) << what << ": the frozen rank's launcher\n" << own;
        EXPECT_NE(own.find("stopped answering: rank 0 exited"), std::string::npos) << own;
        std::printf("%s: the frozen rank's launcher ended %.1f s after the freeze\n", what.c_str(), took);
      }
      ::kill(nodes[c.rank].pid, SIGKILL);  // (node 0's: its rank dies with it, the parent-death signal)
      finish(nodes[c.rank], 10s);
      fs::remove_all(dir);
    }
  }
}

}  // namespace

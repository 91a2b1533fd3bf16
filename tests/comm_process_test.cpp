// Process tier, communication: every collective on real engines (gloo through c10d, OpenMPI), ranks started
// by the launcher exactly as `dtrain run` starts them, world sizes 1 to 4. The ranks check their results
// against plain-libtorch references (tests/comm_worker.cpp); this test checks that every rank reported
// success. Also the groups of a mesh, an error's reach, timeouts that name the missing rank, and `dtrain
// bench comm`.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launch/launcher.h"
#include "tests/process_job.h"

namespace fs = std::filesystem;

namespace {

using namespace dtrain::test;  // (tests/process_job.h: Job, run_worker, ...)

class Collectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Collectives, ExactAgainstSingleProcessReference) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "collectives");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Collectives,
                         ::testing::Combine(::testing::Values("gloo", "mpi"), ::testing::Values(1, 2, 3, 4)),
                         backend_ranks_name);

// One rank raises inside a DTensor op while the others wait in its collective: with a 60 s timeout, every
// rank has the error less than 2 s after the raise.
class FailFast : public ::testing::TestWithParam<std::string> {};

TEST_P(FailFast, OneRanksErrorReachesEveryRankWithinTwoSeconds) {
  const int n = 3;
  Job job = run_worker(GetParam(), n, "failfast", "60");
  EXPECT_LT(job.seconds, 20.0);
  int64_t raised = -1;
  std::map<int, std::pair<int64_t, std::string>> caught;
  for (int r = 0; r < n; ++r) {
    std::istringstream in(read_file(job.dir / ("failfast" + std::to_string(r) + ".txt")));
    std::string kind;
    int64_t ms = 0;
    in >> kind >> ms;
    std::string message;
    std::getline(in, message);
    ASSERT_FALSE(kind.empty()) << "rank " << r << " wrote no report";
    EXPECT_NE(message.find("dtrain-profile-on-this-node-only"), std::string::npos)
        << "rank " << r << " did not get the failing rank's error: " << message;
    if (kind == "raised") raised = ms;
    if (kind == "caught") {
      caught[r] = {ms, message};
      EXPECT_NE(message.find("rank " + std::to_string(n - 1) + " failed"), std::string::npos) << message;
    }
  }
  ASSERT_GE(raised, 0);
  EXPECT_EQ(caught.size(), static_cast<size_t>(n - 1));
  for (const auto& [r, c] : caught) {
    EXPECT_LT(c.first - raised, 2000)
        << "rank " << r << " learned of the error " << c.first - raised << " ms after the raise";
  }
  fs::remove_all(job.dir);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, FailFast, ::testing::Values("gloo", "mpi"));

class Groups : public ::testing::TestWithParam<std::string> {};

TEST_P(Groups, MeshAxisGroupsAndSplitOn2x2) {
  Job job = run_worker(GetParam(), 4, "mesh");
  expect_all_ok(job, 4);
}

// A rank that never enters a collective: the others get a TimeoutError that names it, within the 2 s timeout.
TEST_P(Groups, MissingRankIsNamedWithinTimeout) {
  Job job = run_worker(GetParam(), 3, "missing-rank");
  for (int r = 0; r < 2; ++r) {
    std::string report = read_file(job.dir / ("rank" + std::to_string(r) + ".txt"));
    EXPECT_EQ(report.rfind("elapsed_ms ", 0), 0u) << report;
    long ms = std::atol(report.c_str() + 11);
    EXPECT_GE(ms, 1900) << report;
    EXPECT_LT(ms, 4000) << report;
    EXPECT_NE(report.find("all_reduce (seq 1, " + GetParam()), std::string::npos) << report;
    EXPECT_NE(report.find("[rank " + std::to_string(r) + "/3]"), std::string::npos) << report;
    EXPECT_NE(report.find("Rank 2 has not entered it"), std::string::npos) << report;
    EXPECT_NE(report.find("ok 1"), std::string::npos) << report;
  }
  EXPECT_LT(job.seconds, 30.0);
  fs::remove_all(job.dir);
}

// A wait shorter than the op's timeout runs out: TimeoutError, but the op and the group carry on.
TEST_P(Groups, ShortWaitIsNotFatal) {
  Job job = run_worker(GetParam(), 3, "short-wait");
  expect_all_ok(job, 3);
}

// Ranks late by most of the timeout: the collective still succeeds, and the backend stays usable.
TEST_P(Groups, DelayedRanksWithinTheTimeout) {
  Job job = run_worker(GetParam(), 3, "delayed");
  expect_all_ok(job, 3);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Groups, ::testing::Values("gloo", "mpi"));

// `dtrain bench comm --profile FILE` under the launcher writes the alpha-beta profile the DTensor cost model
// reads.
TEST(BenchProfile, WritesAProfileFile) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::string path = (dir / "profile.json").string();
  dtrain::launch::LaunchOptions o;
  o.nproc = 2;
  o.command = {DTRAIN_BINARY, "bench", "comm",      "--ops", "all_reduce,all_gather", "--max-bytes", "64K",
               "--iters",     "3",     "--profile", path};
  ASSERT_EQ(dtrain::launch::run(o), 0);
  std::string text = read_file(path);
  EXPECT_NE(text.find("\"format\": \"dtrain-comm-profile\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"all_gather\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"beta_s_per_byte\""), std::string::npos) << text;
  fs::remove_all(dir);
}

}  // namespace

// Process tier: every collective on real engines (gloo through c10d, OpenMPI), ranks started by the launcher
// exactly as `dtrain run` starts them, world sizes 1 to 4. The ranks check their results against
// plain-libtorch references (tests/comm_worker.cpp); this test checks that every rank reported success, and
// the fault cases.
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

using dtrain::test::free_port;
using dtrain::test::Job;
using dtrain::test::read_file;
using dtrain::test::run_worker;

void expect_all_ok(const Job& job, int n) {
  EXPECT_EQ(job.rc, 0);
  for (int r = 0; r < n; ++r) {
    std::string report = read_file(job.dir / ("rank" + std::to_string(r) + ".txt"));
    EXPECT_EQ(report.rfind("ok ", 0), 0u) << "rank " << r << " reported:\n" << report;
    EXPECT_GT(std::atoi(report.c_str() + 3), 0) << "rank " << r << " ran no checks";
  }
  fs::remove_all(job.dir);
}

// "gloo_3ranks": the test name suffix of a (backend, ranks) parameter.
std::string backend_ranks_name(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
}

class Collectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Collectives, ExactAgainstSingleProcessReference) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "collectives");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Collectives,
                         ::testing::Combine(::testing::Values("gloo", "mpi"), ::testing::Values(1, 2, 3, 4)),
                         backend_ranks_name);

// DTensor redistribution on real collectives: every source -> target pair on 1-d meshes of 1-4 ranks and on a
// 2x2 mesh, uneven shape (7, 5), values exact, collectives issued as planned.
class Redistribute : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Redistribute, EveryPairExactAndAsPlanned) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "redistribute");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, Redistribute,
                         ::testing::Combine(::testing::Values("gloo", "mpi"), ::testing::Values(1, 2, 3, 4)),
                         backend_ranks_name);

// DTensor creation, pointwise ops, the gather fallback, strict mode, and nn::Linear + AdamW on DTensor
// parameters.
class DTensorE2E : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(DTensorE2E, MatchesPlainLibtorch) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "dtensor");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, DTensorE2E,
                         ::testing::Values(std::make_tuple("gloo", 1), std::make_tuple("gloo", 2),
                                           std::make_tuple("gloo", 3), std::make_tuple("mpi", 2)),
                         backend_ranks_name);

// The validation matrix of the ops with sharding rules (tests/worker_ops.cpp): sampled input placement
// combinations, forward and backward, equal the plain op; no combination gathers; refusals are the listed
// ones. On a line of 2, 3 and 4 ranks and the 2-d meshes 1x3, 3x1 (3 ranks) and 2x2 (4 ranks), on both
// engines. The sample's seed is printed (DTRAIN_MATRIX_SEED replays another).
class OpMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(OpMatrix, EveryPlacementCombinationIsExact) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "ops", "120");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, OpMatrix,
                         ::testing::Combine(::testing::Values("gloo", "mpi"), ::testing::Values(2, 3, 4)),
                         backend_ranks_name);

// Check mode (DTRAIN_DTENSOR_CHECK=1): every op's decision is compared across ranks, so a decision that
// read a rank's own block (uneven at 3 ranks) fails on every rank instead of diverging.
TEST(CheckMode, OpMatrixAtThreeRanks) {
  Job job = run_worker("gloo", 3, "ops", "60", {{"DTRAIN_DTENSOR_CHECK", "1"}});
  expect_all_ok(job, 3);
}

TEST(CheckMode, GPTLayoutsAtThreeRanks) {
  Job job = run_worker("gloo", 3, "gpt", "60", {{"DTRAIN_DTENSOR_CHECK", "1"}});
  expect_all_ok(job, 3);
}

// DTensor hardening: each case once gave a wrong result, diverged or failed on one rank (worker_hardening).
class Hardening : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Hardening, ExactAndAlikeOnEveryRank) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "hardening");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, Hardening,
                         ::testing::Values(std::make_tuple("gloo", 1), std::make_tuple("gloo", 2),
                                           std::make_tuple("gloo", 3), std::make_tuple("gloo", 4),
                                           std::make_tuple("mpi", 3)),
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

// models::GPT on DTensors, one forward + backward + AdamW step, equal to the same model on one process: data
// parallel (even and uneven batch), Megatron tensor parallel and, at 4 ranks, the 2x2 combination.
class GPTEndToEnd : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(GPTEndToEnd, LayoutsMatchOneProcess) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "gpt");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, GPTEndToEnd,
                         ::testing::Values(std::make_tuple("gloo", 1), std::make_tuple("gloo", 2),
                                           std::make_tuple("gloo", 4), std::make_tuple("mpi", 4)),
                         backend_ranks_name);

// The strategies on models::GPT (tests/worker_parallel.cpp): suite "dp", parallel::DataParallel
// (Horovod-style buckets; its errors too), "zero", parallel::Zero stages 1, 2 and 3, and "hsdp" (ZeRO-3 on a
// 2x2 mesh): 20 AdamW steps equal to one process, uneven rows, accumulation, the communication of a step, the
// memory report.
class StrategyParity : public ::testing::TestWithParam<std::tuple<std::string, std::string, int>> {};

TEST_P(StrategyParity, TwentyStepsMatchOneProcess) {
  auto [suite, backend, n] = GetParam();
  Job job = run_worker(backend, n, suite, "60");
  expect_all_ok(job, n);
}

// Each suite on gloo at 1 to 4 ranks and on mpi at 3.
std::vector<std::tuple<std::string, std::string, int>> strategy_cases() {
  std::vector<std::tuple<std::string, std::string, int>> out;
  for (const char* suite : {"dp", "zero"}) {
    for (int n = 1; n <= 4; ++n) out.emplace_back(suite, "gloo", n);
    out.emplace_back(suite, "mpi", 3);
  }
  out.emplace_back("hsdp", "gloo", 4);
  out.emplace_back("hsdp", "mpi", 4);
  for (int n = 2; n <= 4; ++n) out.emplace_back("tp", "gloo", n);  // tensor parallel (tests/worker_tp.cpp)
  out.emplace_back("tp", "mpi", 3);
  out.emplace_back("tp2d", "gloo", 4);
  out.emplace_back("tp2d", "mpi", 4);
  for (int n = 1; n <= 4; ++n) out.emplace_back("clip", "gloo", n);  // tests/worker_numerics.cpp
  out.emplace_back("clip", "mpi", 3);
  for (int n = 2; n <= 4; ++n) out.emplace_back("matrix", "gloo", n);  // 4: the 2-d layouts
  out.emplace_back("matrix", "mpi", 3);
  for (int n = 1; n <= 4; ++n) out.emplace_back("checkpointing", "gloo", n);
  out.emplace_back("checkpointing", "mpi", 3);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Strategies, StrategyParity, ::testing::ValuesIn(strategy_cases()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                                  std::to_string(std::get<2>(info.param)) + "ranks";
                         });

// Deterministic mode (tests/worker_numerics.cpp): at 1, 2 and 4 ranks each run is bitwise equal to plain
// libtorch on one process, and the runs with clipping and 16-bit precision end with the same parameters, bit
// for bit, at every world size and on both backends.
TEST(Deterministic, BitwiseEqualAtOneTwoAndFourRanks) {
  std::string first;
  for (auto [backend, n] :
       std::vector<std::pair<std::string, int>>{{"gloo", 1}, {"gloo", 2}, {"gloo", 4}, {"mpi", 4}}) {
    Job job = run_worker(backend, n, "deterministic");
    const std::string digests = read_file(job.dir / "digests.txt");
    expect_all_ok(job, n);
    EXPECT_EQ(std::count(digests.begin(), digests.end(), '\n'), 10) << digests;
    if (n == 1) {
      first = digests;
    } else {
      EXPECT_EQ(digests, first) << "parameters at " << n << " ranks (" << backend << ") differ from 1 rank's";
    }
  }
}

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

// `dtrain explain` prints the planner's choice for a 2x2-mesh redistribution next to the naive route, reading
// the profile written above when given one; a bad placement is exit code 2 with the reason.
// Bad input to the command: a clear error naming the value and exit code 2, never a crash (SIGFPE), a silent
// acceptance, an overflow or a read without end; a mesh of many axes answers quickly.
TEST(BadInput, ClearErrorsNotCrashes) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::string out = (dir / "out.txt").string();
  const std::vector<std::pair<std::string, std::string>> cases{
      {"explain --mesh 0 --shape 4,4 --from 'S(0)' --to R", "--mesh '0' is not a comma-separated list"},
      {"explain --mesh 1000000000,1000000000 --shape 4,4 --from 'S(0),R' --to R,R",
       "more than 16777216 ranks"},
      {"explain --mesh 2 --shape 0,4 --from 'S(0)' --to R", "--shape '0,4' is not"},
      {"explain --mesh 2 --shape 4611686018427387904,4 --from 'S(0)' --to R", "more than 2^56"},
      {"frobnicate", "'frobnicate' is not a dtrain command"},
      {"run --stop-grace inf -n 1 -- true", "--stop-grace = inf s is not"},
      {"bench comm --min-bytes 1e30", "more than 1 TiB"},
      {"train --log-every 0", "--log-every 0: log.every = 0 is out of range; it must be an integer from 1"},
      {"train --batch 100000000",
       "--batch 100000000: train.batch = 100000000 is out of range; it must be an "
       "integer from 1 to 1048576"},
      {"train --batch 100000 --seq 100000", "more than 2^30 tokens"},
      {"train --data /dev/zero", "'/dev/zero' is not a regular file"},
  };
  for (const auto& [args, needle] : cases) {
    std::string cmd = std::string(DTRAIN_BINARY) + " " + args + " > " + out + " 2>&1";
    int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << args << ": " << read_file(out);
    EXPECT_NE(read_file(out).find(needle), std::string::npos) << args << ": " << read_file(out);
  }
  for (const std::string t : {"1e13", "0.0001"}) {
    std::string cmd =
        "DTRAIN_TIMEOUT=" + t + " " + std::string(DTRAIN_BINARY) + " train --steps 1 > " + out + " 2>&1";
    int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << t << ": " << read_file(out);
    EXPECT_NE(read_file(out).find("DTRAIN_TIMEOUT = " + t.substr(0, 1)), std::string::npos) << read_file(out);
  }
  // 8 axes: the planner's search is bounded (it took minutes), and explain says it took the naive route.
  auto t0 = std::chrono::steady_clock::now();
  std::string cmd = std::string(DTRAIN_BINARY) +
                    " explain --mesh 2,2,2,2,2,2,2,2 --shape 16,16 --from 'S(0),R,R,R,R,R,R,R' "
                    "--to 'R,R,R,R,R,R,R,S(1)' > " +
                    out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(read_file(out).find("the search stopped after"), std::string::npos) << read_file(out);
  fs::remove_all(dir);
}

TEST(Explain, PrintsThePlanFor2x2Mesh) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::string out = (dir / "out.txt").string();
  std::string cmd = std::string(DTRAIN_BINARY) +
                    " explain --mesh 2,2 --shape 1000,999 --from 'S(0),P(sum)' --to 'R,S(1)' > " + out +
                    " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  std::string text = read_file(out);
  EXPECT_NE(text.find("axis 1: P(sum)  -> S(1)    reduce_scatter"), std::string::npos) << text;
  EXPECT_NE(text.find("naive route"), std::string::npos) << text;
  cmd = std::string(DTRAIN_BINARY) + " explain --mesh 2,2 --shape 4,4 --from 'S(0),Q' --to R,R > " + out +
        " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  EXPECT_NE(read_file(out).find("placement \"Q\" is not one of"), std::string::npos) << read_file(out);
  fs::remove_all(dir);
}

// `dtrain train` (the main job) on 1 and 2 ranks: the first step's loss is the same (same weights, same
// batch, split over the ranks), the loss falls, and the run reports its validation loss and communication.
TEST(Train, GPTOnTextAtOneAndTwoRanks) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::map<int, std::string> logs;
  for (int n : {1, 2}) {
    std::string out = (dir / ("train" + std::to_string(n) + ".txt")).string();
    std::string cmd =
        std::string(DTRAIN_BINARY) + " run -n " + std::to_string(n) + " -- " + DTRAIN_BINARY +
        " train --steps 30 --log-every 30 --layers 1 --width 32 --heads 2 --seq 32 --batch 6 > " + out +
        " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
    logs[n] = read_file(out);
  }
  auto loss_at = [](const std::string& log, const std::string& step) {
    auto at = log.find("step " + step + "  loss ");
    return at == std::string::npos ? std::string() : log.substr(at + step.size() + 12, 6);
  };
  std::string first = loss_at(logs[1], "    1");
  ASSERT_FALSE(first.empty()) << logs[1];
  EXPECT_EQ(loss_at(logs[2], "    1"), first) << logs[2];
  for (auto& [n, log] : logs) {
    std::string last = loss_at(log, "   30");
    ASSERT_FALSE(last.empty()) << log;
    EXPECT_LT(std::stod(last), std::stod(first) - 1.0) << log;  // from ln(256) = 5.5 towards byte statistics
    EXPECT_NE(log.find("validation loss"), std::string::npos) << log;
  }
  EXPECT_NE(logs[2].find("all_reduce"), std::string::npos) << logs[2];
  fs::remove_all(dir);
}

// The main job (scripts/main.sh) at reduced size: 2 ranks over OpenMPI with the script's own defaults, but
// 400 steps instead of 5000 (about 30 s): the validation loss falls below the corpus's byte unigram entropy
// (3.32 nats per byte, what a model that uses no context reaches), and the run leaves its metrics, loss
// curve, sample and checkpoint where it says.
TEST(MainJob, AtReducedSizeLearnsPastTheUnigramEntropy) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  const fs::path run = dir / "run", out = dir / "out.txt";
  const std::string bin_dir = fs::path(DTRAIN_BINARY).parent_path().string();
  std::string cmd = "DTRAIN_SKIP_SETUP=1 DTRAIN_BIN_DIR=" + bin_dir + " DTRAIN_RUN_DIR=" + run.string() +
                    " bash " + DTRAIN_SOURCE_DIR +
                    "/scripts/main.sh --steps 400 --warmup 40 --save-every 0 > " + out.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out.string());
  const std::string text = read_file(out.string());
  const auto at = text.find("main job: validation loss ");
  ASSERT_NE(at, std::string::npos) << text;
  const double val = std::stod(text.substr(at + 26, 8));
  EXPECT_LT(val, 3.32) << text;
  EXPECT_GT(val, 0.5) << text;  // a byte-level model of this size on this text cannot do better
  // the metrics: one object per step, with the learning rate of the schedule
  std::ifstream metrics(run / "metrics.jsonl");
  std::string line, last;
  int lines = 0;
  while (std::getline(metrics, line)) {
    if (line.find("\"val_loss\"") != std::string::npos) continue;  // the evaluations' lines
    ++lines, last = line;
  }
  EXPECT_EQ(lines, 400);
  EXPECT_NE(last.find("\"step\":400"), std::string::npos) << last;
  EXPECT_NE(last.find("\"lr\":0.0006"), std::string::npos) << last;  // the cosine's floor, lr / 10
  // the loss curve is a PNG, the sample continues the prompt, the checkpoint is the last step
  const std::string png = read_file((run / "loss.png").string());
  EXPECT_GT(png.size(), 10000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  const std::string sample = read_file((run / "sample.txt").string());
  EXPECT_EQ(sample.rfind("The ", 0), 0u) << sample;
  EXPECT_GE(sample.size(), 400u) << sample;
  EXPECT_EQ(read_file((run / "checkpoints" / "latest").string()).rfind("step-00000400", 0), 0u);
  for (const char* what : {"metrics:", "loss curve:", "checkpoints:", "sample of the trained model:"}) {
    EXPECT_NE(text.find(what), std::string::npos) << what << "\n" << text;
  }
  // a second run into the same folder is refused, and nothing of the first is touched
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_file(out.string()).find("already holds a run"), std::string::npos)
      << read_file(out.string());
  EXPECT_EQ(read_file((run / "sample.txt").string()), sample);
  fs::remove_all(dir);
}

// Two nodes on 127.0.0.1: `dtrain run --nnodes 2 --node-rank 1` as a separate process, node 0 in this one,
// the same flags on both; the 2x2 mesh then spans both nodes (its "dp" groups cross them).
TEST(MultiNode, GlooMeshAcrossTwoLaunchers) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::string port = std::to_string(free_port());
  setenv("DTRAIN_TIMEOUT", "60", 1);
  setenv("DTRAIN_JOB_SECRET", "two-launchers-share-this", 1);  // several nodes: the user hands out the secret
  std::vector<std::string> args{DTRAIN_BINARY,
                                "run",
                                "-n",
                                "2",
                                "--nnodes",
                                "2",
                                "--node-rank",
                                "1",
                                "--master-addr",
                                "127.0.0.1",
                                "--master-port",
                                port,
                                "--",
                                DTRAIN_COMM_WORKER,
                                "mesh",
                                dir.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t node1 = 0;
  ASSERT_EQ(posix_spawn(&node1, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  dtrain::launch::LaunchOptions o;
  o.nproc = 2;
  o.nnodes = 2;
  o.node_rank = 0;
  o.master_addr = "127.0.0.1";
  o.master_port = std::stoi(port);
  o.command = {DTRAIN_COMM_WORKER, "mesh", dir.string()};
  int rc0 = dtrain::launch::run(o);
  int status = 0;
  waitpid(node1, &status, 0);
  unsetenv("DTRAIN_JOB_SECRET");
  EXPECT_EQ(rc0, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "node 1 status " << status;
  expect_all_ok(Job{rc0, dir, 0}, 4);
}

}  // namespace

namespace {

// `dtrain run -n 2 -- dtrain train ARGS` (a small GPT), its output, killed past 180 s.
dtrain::test::Finished train_small(const std::vector<std::string>& args, const fs::path& out) {
  std::vector<std::string> argv{DTRAIN_BINARY, "run", "-n", "2", "--", DTRAIN_BINARY, "train"};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* a : {"--layers", "2", "--width", "32", "--heads", "4", "--seq", "16", "--steps", "12",
                        "--log-every", "1"}) {
    argv.push_back(a);
  }
  return dtrain::test::finish(dtrain::test::spawn(argv, {{"OMP_NUM_THREADS", "1"}}, out),
                              std::chrono::seconds(180));
}

std::vector<std::string> loss_lines(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("step ");
    if (at != std::string::npos && line.find(" loss ", at) != std::string::npos &&
        line.find("validation") == std::string::npos) {
      out.push_back(line.substr(at, line.find("  lr ", at) - at));  // (without the rate, which varies)
    }
  }
  return out;
}

}  // namespace

// The example DeepSpeed config (examples/deepspeed/ds_config.json: DeepSpeed's documented blocks, ZeRO-2,
// fp16 with dynamic loss scaling, Adam, WarmupLR, clipping, micro-batch 4 x accumulation 2 x 2 ranks) runs
// unchanged on 2 ranks, and gives the same losses, step for step, as the same run asked for by dtrain's own
// flags; its effective config is printed and saved beside the checkpoints, and reads back as a TOML config.
TEST(DeepSpeedConfig, TheExampleRunsUnchangedAndEqualsTheSameRunByFlags) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  auto ds = train_small({std::string(DTRAIN_SOURCE_DIR) + "/examples/deepspeed/ds_config.json", "--save",
                         (dir / "ckpt").string()},
                        dir / "ds.txt");
  ASSERT_EQ(ds.exit_code(), 0) << ds.output;
  for (const char* what : {"strategy zero2 (DeepSpeed ZeRO stage 2)", "effective config (saved to",
                           "note: batch 16 = micro-batch 4 x accumulation 2 x 2 data-parallel ranks",
                           "note: strategy deepspeed, ZeRO stage 2: zero2", "mixed precision fp16"}) {
    EXPECT_NE(ds.output.find(what), std::string::npos) << what << "\n" << ds.output;
  }
  auto flags = train_small({"--strategy",
                            "zero2",
                            "--precision",
                            "fp16",
                            "--batch",
                            "16",
                            "--accumulation",
                            "2",
                            "--lr",
                            "1e-3",
                            "--beta1",
                            "0.8",
                            "--eps",
                            "1e-8",
                            "--weight-decay",
                            "3e-7",
                            "--warmup",
                            "1000",
                            "--warmup-type",
                            "log",
                            "--warmup-min-lr",
                            "0",
                            "--clip",
                            "1",
                            "--bucket-bytes",
                            "1000000000"},
                           dir / "flags.txt");
  ASSERT_EQ(flags.exit_code(), 0) << flags.output;
  const auto a = loss_lines(ds.output), b = loss_lines(flags.output);
  ASSERT_EQ(a.size(), 12u) << ds.output;
  EXPECT_EQ(a, b) << ds.output << "\n" << flags.output;
  // the saved effective config runs the same training again
  auto again = train_small({(dir / "ckpt" / "config.toml").string(), "--set", "checkpoint.dir=\"\""},
                           dir / "again.txt");
  ASSERT_EQ(again.exit_code(), 0) << again.output;
  EXPECT_EQ(loss_lines(again.output), a) << again.output;
  fs::remove_all(dir);
}

// --timeline: one Chrome trace of both ranks (a process per rank; forward, backward and optimizer on the
// compute thread, each collective on the communication thread, within the run's time); --metrics: each step's
// resident memory of every rank and the time blocked on communication.
TEST(TrainTimeline, ChromeTraceOfEveryRanksComputeAndCollectivesAndMetricsPerRank) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  const fs::path trace = dir / "trace.json", metrics = dir / "m.jsonl";
  auto f = train_small({"--strategy", "zero2", "--timeline", trace.string(), "--metrics", metrics.string()},
                       dir / "out.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  EXPECT_NE(f.output.find("timeline of "), std::string::npos) << f.output;
  const auto doc = nlohmann::json::parse(read_file(trace.string()));
  std::map<std::pair<int, std::string>, int> count;  // (rank, name) -> events
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<int64_t>(), 0);
    const int rank = e.at("pid").get<int>();
    const std::string name = e.at("name");
    EXPECT_EQ(e.at("tid").get<int>(), e.at("cat") == "comm" ? 1 : 0) << name;
    ++count[{rank, name}];
  }
  for (int rank : {0, 1}) {
    EXPECT_EQ((count[{rank, "step"}]), 12) << rank;
    EXPECT_EQ((count[{rank, "forward"}]), 12) << rank;
    EXPECT_EQ((count[{rank, "backward"}]), 12) << rank;
    EXPECT_EQ((count[{rank, "optimizer"}]), 12) << rank;
    EXPECT_GE((count[{rank, "reduce_scatter"}]), 12) << rank;  // ZeRO-2's gradients
    EXPECT_GE((count[{rank, "all_gather"}]), 12) << rank;      // and its updated shards
  }
  std::ifstream in(metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++lines;
    ASSERT_EQ(j.at("rss_mib").size(), 2u) << line;
    for (const auto& m : j.at("rss_mib")) EXPECT_GT(m.get<double>(), 10) << line;
    EXPECT_GE(j.at("comm_wait_s").get<double>(), 0) << line;
  }
  EXPECT_EQ(lines, 12);
  fs::remove_all(dir);
}

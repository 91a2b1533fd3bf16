// Process tier, DTensor: redistribution, ops with sharding rules (the validation matrix, check mode), the
// hardening cases and models::GPT on DTensors, on real ranks against plain-libtorch references computed in
// one process (tests/worker_dtensor.cpp, worker_ops.cpp, worker_hardening.cpp, worker_gpt.cpp); `dtrain
// explain`.
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

// A solved step (tests/worker_solved.cpp): an MLP and models::GPT recorded on one rank, solved for the mesh
// under a memory budget, and trained by the plan (tensor::FollowPlan) equal to one process, on 1-4 ranks.
class SolvedStep : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(SolvedStep, RunsByThePlanAndMatchesOneProcess) {
  auto [backend, n] = GetParam();
  Job job = run_worker(backend, n, "solved");
  expect_all_ok(job, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, SolvedStep,
                         ::testing::Values(std::make_tuple("gloo", 1), std::make_tuple("gloo", 2),
                                           std::make_tuple("gloo", 3), std::make_tuple("gloo", 4),
                                           std::make_tuple("mpi", 2)),
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

// `dtrain explain` prints the planner's choice for a 2x2-mesh redistribution next to the naive route, reading
// the profile written above when given one; a bad placement is exit code 2 with the reason.
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
  cmd = std::string(DTRAIN_BINARY) + " explain --mesh 2 --shape 4,4 > " + out + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  EXPECT_NE(read_file(out).find("--from and --to are required"), std::string::npos) << read_file(out);
  fs::remove_all(dir);
}

// `dtrain explain solve` records the GPT's step, solves its layout for a 2-rank mesh and explains it: each
// parameter's placements, each redistribution with the op that needs it, the predicted step and memory; a
// second budget shows what differs; a budget nothing fits is exit code 2 naming it and the least needed.
TEST(Explain, SolvesTheGptsLayoutAndExplainsIt) {
  char tmpl[] = "/tmp/dtrain_solve_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  const std::string out = (dir / "out.txt").string();
  const std::string model = " explain solve --mesh 2 --layers 2 --width 64 --heads 4 --seq 32 --batch 8";
  std::string cmd = std::string(DTRAIN_BINARY) + model + " > " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  std::string text = read_file(out);
  for (const char* want : {"predicted step:", "memory at the step's peak:", "h0.mlp.fc.weight [256, 64]",
                           "wte.weight [256, 64]", "redistributions, in step order", "no memory budget"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  // The replicated peak, from the first line of figures; then 70% of it as a budget beside no budget.
  const size_t at = text.find("everything replicated: ");
  ASSERT_NE(at, std::string::npos) << text;
  const double replicated_mib = std::stod(text.substr(at + 23));
  const std::string budget = std::to_string(static_cast<int64_t>(replicated_mib * 1048576 * 0.7));
  cmd = std::string(DTRAIN_BINARY) + model + " --compare-budget " + budget + " > " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  text = read_file(out);
  EXPECT_NE(text.find("placements that differ (no budget -> budget "), std::string::npos) << text;
  // Constraints: a parameter's placements, and the batch sharded over mesh axis 0.
  cmd = std::string(DTRAIN_BINARY) + model + " --pin h0.mlp.fc.weight=R --pin 'h1.attn.q.weight=S(1)'" +
        " --batch-axis 0 > " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  text = read_file(out);
  for (const char* want : {"h0.mlp.fc.weight [256, 64]  (R)", "h1.attn.q.weight [64, 64]  (S(1))",
                           "tokens [8, 32]  (S(0))", "targets [8, 32]  (S(0))"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  cmd = std::string(DTRAIN_BINARY) + model + " --pin nosuch.weight=R > " + out + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  EXPECT_NE(read_file(out).find("no value named nosuch.weight to pin"), std::string::npos) << read_file(out);
  cmd = std::string(DTRAIN_BINARY) + model + " --budget 1K > " + out + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  EXPECT_NE(read_file(out).find("no plan fits the memory budget of 1024 bytes"), std::string::npos)
      << read_file(out);
  fs::remove_all(dir);
}

}  // namespace

// Process tier, strategies: data parallel, ZeRO 1-3, hsdp, tensor parallel, clipping, the 2-d layouts and
// activation checkpointing on models::GPT against one process (tests/worker_parallel.cpp, worker_tp.cpp,
// worker_numerics.cpp), and deterministic mode bit for bit across world sizes.
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
}  // namespace

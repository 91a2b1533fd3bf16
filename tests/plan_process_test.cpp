// Process tier, the planner through the `dtrain` command (docs/planning.md): `dtrain plan --json` at 2 ranks
// measures its profiles, caches them and lists every candidate with the fields the issue names; `dtrain
// train --strategy auto` under a budget that rules dp and zero1 out trains another layout and stays within
// the budget by its own tensor_peak_mib; missing or bad profiles and impossible budgets are errors naming
// them; a 1024-rank cluster plans from a profile alone; a module written in C++ plans through plan_module and
// trains its choice with the Trainer (tests/worker_plan.cpp) at 1 to 4 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/process_job.h"

namespace fs = std::filesystem;

namespace {

using namespace dtrain::test;

const std::vector<std::string> kModel{"--layers", "2",     "--width", "32",      "--heads",
                                      "2",        "--seq", "16",      "--batch", "8"};
// model state well above the activations (and the corpus), so that the strategies' memory differs
const std::vector<std::string> kWide{"--layers", "2",     "--width", "256",     "--heads",
                                     "2",        "--seq", "8",       "--batch", "4"};

struct Outcome {
  int code = -1;
  std::string output;
};

Outcome run_cmd(const fs::path& dir, const std::vector<std::string>& args, const std::string& cache) {
  static int n = 0;
  const fs::path out = dir / ("out" + std::to_string(n++) + ".txt");
  Finished f = finish(spawn(args, {{"DTRAIN_CACHE_DIR", cache}, {"OMP_NUM_THREADS", "1"}}, out),
                      std::chrono::minutes(3));
  EXPECT_FALSE(f.timed_out) << f.output;
  return {f.exit_code(), f.output};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<nlohmann::json> candidates(const std::string& output) {
  std::vector<nlohmann::json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const auto brace = line.find('{');
    if (brace != std::string::npos) out.push_back(nlohmann::json::parse(line.substr(brace)));
  }
  return out;
}

class Plan : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dtrain_plan_test_XXXXXX";
    dir = mkdtemp(tmpl);
    cache = (dir / "cache").string();
  }
  void TearDown() override { fs::remove_all(dir); }
  std::vector<std::string> run2(const std::vector<std::string>& cmd) {
    return with({DTRAIN_BINARY, "run", "-n", "2", "--", DTRAIN_BINARY}, cmd);
  }
  fs::path dir;
  std::string cache;
};

TEST_F(Plan, JsonListsEveryCandidateAndAutoTrainsWithinTheBudget) {
  Outcome r = run_cmd(dir, run2(with(with({"plan"}, kWide), {"--json"})), cache);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto all = candidates(r.output);
  ASSERT_GT(all.size(), 10u) << r.output;
  int chosen = 0;
  double dp_zero1 = 1e30, others = 1e30;
  for (const auto& c : all) {
    for (const char* k : {"strategy", "tp", "sequence_parallel", "checkpoint_activations", "micro_batch",
                          "accumulation", "bucket_bytes", "shard_size", "predicted_step_s",
                          "predicted_peak_mib", "fits", "chosen", "rank", "reason", "flags"}) {
      EXPECT_TRUE(c.contains(k)) << k << " missing in " << c.dump();
    }
    chosen += c["chosen"].get<bool>();
    const auto flags = c["flags"].get<std::vector<std::string>>();
    EXPECT_NE(std::find(flags.begin(), flags.end(), c["strategy"].get<std::string>()), flags.end())
        << c.dump();
    const double peak = c["predicted_peak_mib"].get<double>();
    const std::string s = c["strategy"];
    double& least = (s == "dp" || s == "zero1") && c["tp"] == 1 ? dp_zero1 : others;
    least = std::min(least, peak);
  }
  EXPECT_EQ(chosen, 1);
  // the profiles are cached: a second plan measures nothing
  r = run_cmd(dir, run2(with({"plan"}, kWide)), cache);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("cached in"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("measured now"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("chosen:"), std::string::npos) << r.output;

  // a budget below every dp and zero1 candidate's (tp 1), above the smallest other one's
  ASSERT_LT(others * 1.05, dp_zero1) << "no layout needs less than dp and zero1";
  const double budget_mib = (others * 1.05 + dp_zero1) / 2;
  const int64_t budget = static_cast<int64_t>(budget_mib * (1 << 20));
  const std::string metrics = (dir / "m.jsonl").string();
  r = run_cmd(
      dir,
      run2(with(with({"train"}, kWide), {"--strategy", "auto", "--memory-budget", std::to_string(budget),
                                         "--steps", "12", "--metrics", metrics})),
      cache);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto at = r.output.find("strategy auto chose ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string choice = r.output.substr(at + 20, r.output.find(' ', at + 20) - at - 20);
  EXPECT_TRUE((choice != "dp" && choice != "zero1") || r.output.find(choice + " tp") != std::string::npos)
      << r.output;
  double peak = 0;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("tensor_peak_mib")) {
      for (double v : j["tensor_peak_mib"]) peak = std::max(peak, v);
    }
  }
  EXPECT_GT(peak, 0) << read_file(metrics);
  EXPECT_LE(peak, budget_mib) << r.output;
}

TEST_F(Plan, MissingOrBadProfilesAndImpossibleBudgetsAreNamed) {
  // no ranks and nothing cached: the links cannot be measured here
  Outcome r = run_cmd(dir, with(with({DTRAIN_BINARY, "plan"}, kModel), {"--world", "2"}), cache);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no profile of the gloo links at 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dtrain bench comm --profile"), std::string::npos) << r.output;
  const std::string missing = (dir / "missing.json").string();
  r = run_cmd(dir, with(with({DTRAIN_BINARY, "plan"}, kModel), {"--world", "2", "--profile", missing}),
              cache);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(missing), std::string::npos) << r.output;
  const fs::path bad = dir / "bad.json";
  { std::ofstream(bad) << "{\"format\": \"dtrain-comm-profile\", \"ranks\": 2, \"collectives\": 7}"; }
  r = run_cmd(dir, with(with({DTRAIN_BINARY, "plan"}, kModel), {"--world", "2", "--profile", bad.string()}),
              cache);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(bad.string()), std::string::npos) << r.output;
  // built-in figures only when asked for, and said so; a budget nothing fits names the smallest candidate
  r = run_cmd(dir,
              with(with({DTRAIN_BINARY, "plan"}, kModel),
                   {"--world", "2", "--profile", "builtin", "--memory-budget", "1K"}),
              cache);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no candidate fits the memory budget of 0.0 MiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("The smallest, "), std::string::npos) << r.output;
  r = run_cmd(dir, with(with({DTRAIN_BINARY, "plan"}, kModel), {"--world", "2", "--profile", "builtin"}),
              cache);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("built-in defaults"), std::string::npos) << r.output;
  // strategy auto chooses the micro-batch itself
  r = run_cmd(dir, {DTRAIN_BINARY, "train", "--strategy", "auto", "--micro-batch", "2", "--steps", "1"},
              cache);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("leave out --micro-batch 2"), std::string::npos) << r.output;
}

TEST_F(Plan, AClusterThatIsNotHerePlansFromItsProfile) {
  const std::string profile = std::string(DTRAIN_SOURCE_DIR) + "/examples/plan/h100_cluster.json";
  Outcome r = run_cmd(
      dir,
      {DTRAIN_BINARY, "plan", "--world", "1024", "--ranks-per-host", "8", "--profile", profile, "--layers",
       "48", "--width", "1600", "--heads", "25", "--seq", "1024", "--batch", "2048", "--json"},
      cache);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto all = candidates(r.output);
  ASSERT_FALSE(all.empty()) << r.output;
  bool hsdp = false, twin = false;
  for (const auto& c : all) {
    hsdp |= c["strategy"] == "hsdp";
    twin |= c["mesh_order"] == "shard,replicate";  // (128 hosts: each 2-axis layout in both orders)
    // the chosen layout keeps its heavy axis inside a host, where NVLink is ~20x the network (the profile)
    if (c["chosen"] == true) {
      EXPECT_EQ(c["mesh_order"], "") << c.dump();
    }
  }
  EXPECT_TRUE(hsdp) << r.output;
  EXPECT_TRUE(twin) << r.output;
  EXPECT_NE(r.output.find("counted from the shape"), std::string::npos) << r.output;
}

// A module written in C++ (tests/worker_plan.cpp): plan::plan_module plans it on the live ranks and the
// Trainer trains its choice (and at 2 and 4 ranks the fastest tensor-parallel candidate), each step's loss
// equal to one process's.
TEST(PlanModule, AUserModulePlansAndTrainsItsChoiceAtOneToFourRanks) {
  for (int n = 1; n <= 4; ++n) {
    Job job = run_worker("gloo", n, "plan-module", "60");
    expect_all_ok(job, n);
  }
}

}  // namespace

// Unit tier: plan/'s pieces against their formulas: the memory model against the bytes counted one tensor at
// a time (fp32 AdamW: weights, gradients and two moments, each sharded or not by the strategy); buckets, the
// step model and the planner's choice on synthetic profiles whose answer is known; the profiles' files and
// their errors; the in-step costs' line; the rehearsal group; a compute profile of a small module.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdio>

#include "comm/rehearsal.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "plan/cluster_profile.h"
#include "plan/in_step_costs.h"
#include "plan/measure_compute.h"
#include "plan/memory_model.h"
#include "plan/planner.h"

namespace {

using dtrain::parallel::Strategy;

// Bytes of model state on rank r of n: each of the four fp32 tensors whole (4 bytes an element) or this
// rank's part of a balanced split.
double counted_bytes(Strategy s, int64_t params, int64_t r, int64_t n) {
  const double part = static_cast<double>(dtrain::balanced_part(params, n, r).count);
  const double whole = static_cast<double>(params);
  const bool shard_state = s != Strategy::kDataParallel;
  const bool shard_grads = s == Strategy::kZero2 || s == Strategy::kZero3;
  const bool shard_weights = s == Strategy::kZero3;
  return 4 * (shard_weights ? part : whole) + 4 * (shard_grads ? part : whole) +
         8 * (shard_state ? part : whole);
}

TEST(MemoryModel, MatchesTheCountedBytesOnAverageOverTheRanks) {
  for (Strategy s : {Strategy::kDataParallel, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    for (int64_t n = 1; n <= 4; ++n) {
      for (int64_t params : {int64_t{12}, int64_t{1001}, int64_t{7}}) {
        double total = 0;
        for (int64_t r = 0; r < n; ++r) total += counted_bytes(s, params, r, n);
        const double model = dtrain::plan::model_state_bytes_per_param(s, static_cast<double>(n)) *
                             static_cast<double>(params);
        EXPECT_NEAR(model, total / static_cast<double>(n), 1e-9)
            << dtrain::parallel::to_string(s) << " n " << n << " params " << params;
      }
    }
    EXPECT_FALSE(dtrain::plan::model_state_formula(s).empty());
  }
}

// A compute model whose answers are known: forward f0 + f1 * micro_batch seconds, backward twice that
// (checkpointing adds a forward), activations a1 bytes a sample (a tenth with checkpointing), no tp
// collectives, the optimizer o seconds a parameter.
class KnownCompute : public dtrain::plan::ComputeModel {
 public:
  double f0 = 1e-3, f1 = 1e-3, a1 = 1e6, o = 1e-9;
  std::vector<dtrain::plan::MeasuredComm> tp_comm;  // with tp > 1, per micro-batch
  double forward_s(double mb, const dtrain::plan::ComputeSetting& s) const override {
    return (f0 + f1 * mb) / static_cast<double>(s.tp);
  }
  double backward_s(double mb, const dtrain::plan::ComputeSetting& s) const override {
    return (2 + (s.checkpoint ? 1 : 0)) * forward_s(mb, s);
  }
  double activation_bytes(double mb, const dtrain::plan::ComputeSetting& s) const override {
    return a1 * mb * (s.checkpoint ? 0.1 : 1.0) / static_cast<double>(s.tp);
  }
  std::vector<dtrain::plan::MeasuredComm> tp_collectives(
      double, const dtrain::plan::ComputeSetting& s) const override {
    return s.tp > 1 ? tp_comm : std::vector<dtrain::plan::MeasuredComm>{};
  }
  double optimizer_s(double params) const override { return o * params; }
  bool has(const dtrain::plan::ComputeSetting&) const override { return true; }
  std::string source() const override { return "known"; }
};

dtrain::plan::ClusterProfile links(double alpha, double beta) {
  dtrain::plan::ClusterProfile p;
  p.path = "synthetic";
  p.intra_host.ranks = 2;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"})
    p.intra_host.collectives[op] = {alpha, beta};
  return p;
}

dtrain::plan::ModelFacts facts(int64_t params_each, int64_t count) {
  dtrain::plan::ModelFacts f;
  f.description = "synthetic";
  for (int64_t i = 0; i < count; ++i)
    f.params.push_back({dtrain::str_cat("p", i), params_each, "Replicate()"});
  return f;
}

dtrain::plan::PlanRequest request(int64_t world, int64_t batch, double budget) {
  dtrain::plan::PlanRequest r;
  r.topo = {world, world};
  r.batch = batch;
  r.memory_budget = budget;
  r.budget_source = "test";
  r.overlap_source = "test";
  return r;
}

TEST(StepModel, BucketsPackInOrderUpToTheirLimits) {
  for (int64_t first : {int64_t{1}, int64_t{100}, int64_t{1000}}) {
    for (int64_t cap : {int64_t{50}, int64_t{300}}) {
      const std::vector<int64_t> sizes{40, 70, 10, 200, 5, 5, 90, 400, 1};
      const auto b = dtrain::plan::pack_buckets(sizes, first, cap);
      int64_t total = 0;
      for (size_t k = 0; k < b.size(); ++k) total += b[k];
      EXPECT_EQ(total, 821);
      // walking the sizes again: a bucket closes exactly when the next size would pass its limit
      size_t k = 0;
      int64_t cur = 0;
      for (int64_t x : sizes) {
        const int64_t limit = k == 0 ? first : cap;
        if (cur > 0 && cur + x > limit) {
          EXPECT_EQ(b[k], cur);
          ++k;
          cur = 0;
        }
        cur += x;
      }
      EXPECT_EQ(b.back(), cur);
      EXPECT_EQ(b.size(), k + 1);
    }
  }
}

TEST(StepModel, TimeIsComputePlusOptimizerPlusExposedCommunication) {
  const KnownCompute compute;
  const auto f = facts(1 << 18, 4);  // 4 parameters of 1 MiB each
  for (int64_t n = 2; n <= 4; ++n) {
    for (double overlap : {0.0, 1.0}) {
      dtrain::plan::Candidate c;
      c.strategy = "dp";
      c.micro_batch = 3;
      c.accumulation = 2;
      c.bucket_bytes = 2 << 20;
      dtrain::plan::predict(c, f, compute, links(1e-3, 1e-9), {n, n}, overlap);
      const double fwd = compute.forward_s(3, {}), bwd = compute.backward_s(3, {});
      EXPECT_NEAR(c.compute_s, 2 * (fwd + bwd), 1e-12);
      EXPECT_NEAR(c.optimizer_s, 1e-9 * 4 * (1 << 18), 1e-15);
      // buckets: 1 MiB (the first), then 2 MiB, then 1 MiB; each all-reduce alpha + beta * 2(n-1)/n * bytes
      const double bus = 2.0 * static_cast<double>(n - 1) / static_cast<double>(n);
      auto ar = [&](double mib) { return 1e-3 * (n - 1) + 1e-9 * bus * mib * (1 << 20); };
      const double all = ar(1) + ar(2) + ar(1);
      EXPECT_NEAR(c.comm_s, all, 1e-12);
      // all but the last bucket run under the last backward, `overlap` x the shorter of the two hidden
      const double rest = ar(1) + ar(2);
      EXPECT_NEAR(c.exposed_comm_s, ar(1) + rest - overlap * std::min(rest, bwd), 1e-12) << "n " << n;
      EXPECT_NEAR(c.predicted_step_s, c.compute_s + c.optimizer_s + c.exposed_comm_s, 1e-12);
      // memory: 16 bytes a parameter, a second gradient copy under accumulation, one micro-batch's
      // activations
      EXPECT_NEAR(c.predicted_peak_bytes, 16.0 * 4 * (1 << 18) + 4.0 * 4 * (1 << 18) + 3e6, 1);
    }
  }
}

// Tensor parallel alone (one data-parallel rank): a plain optimizer whose gradients are set to none after
// each step and accumulate in place. Without accumulation the passes hold parameters and AdamW's two moments
// (12 bytes a parameter) and the activations; with it, the gradients too, once. The optimizer's step holds
// all 16 bytes and no activations: the peak is the larger moment.
TEST(StepModel, OneDataParallelRankHoldsItsGradientsOnlyWhenAccumulating) {
  KnownCompute compute;
  const auto f = facts(1 << 18, 4);
  const double P = 4.0 * (1 << 18);
  for (double a1 : {1e6, 1e7}) {  // activations 1.5e6 (below 4 bytes a parameter) or 1.5e7 bytes a rank
    compute.a1 = a1;
    const double act = a1 * 3 / 2;
    for (int64_t acc : {1, 2, 8}) {
      dtrain::plan::Candidate c;
      c.tp = 2;  // (every parameter whole here: each rank holds them all)
      c.micro_batch = 3;
      c.accumulation = acc;
      dtrain::plan::predict(c, f, compute, links(1e-3, 1e-9), {2, 2}, 0.0);
      const double passes = (acc == 1 ? 12.0 : 16.0) * P + act, step = 16.0 * P;
      EXPECT_NEAR(c.predicted_peak_bytes, std::max(passes, step), 1)
          << "accumulation " << acc << " a1 " << a1;
      EXPECT_EQ(c.memory.count("activations"), passes >= step ? 1u : 0u);
      EXPECT_EQ(c.memory.count("accumulated gradients"), 0u);
    }
  }
}

// In-step costs: a line between the measured micro-batch sizes, the nearest end's figure beyond them, the
// unit size nearest by ratio; the files round-trip and a bad one is named.
TEST(InStepCosts, ALineBetweenTheMeasuredSizesOfTheNearestUnit) {
  dtrain::plan::InStepCosts c;
  c.key = "k";
  c.points = {{"zero3", 256 << 10, 1, 1, 63, 1e-3},
              {"zero3", 256 << 10, 8, 1, 63, 8e-3},
              {"zero3", 256 << 10, 1, 2, 105, 2e-3},
              {"zero3", 25 << 20, 1, 1, 3, 5e-3},
              {"tp", 0, 2, 1, 20, 2e-3}};
  for (double mb : {1.0, 2.0, 4.5, 8.0}) EXPECT_NEAR(*c.per_call("zero3", 300 << 10, mb), mb * 1e-3, 1e-12);
  EXPECT_NEAR(*c.per_call("zero3", 256 << 10, 16), 8e-3, 1e-12);
  EXPECT_NEAR(*c.per_call("zero3", 256 << 10, 0.5), 1e-3, 1e-12);
  EXPECT_NEAR(*c.per_call("zero3", 20 << 20, 4), 5e-3, 1e-12);  // one point: its figure
  EXPECT_NEAR(*c.per_call("tp", 0, 7), 2e-3, 1e-12);
  EXPECT_FALSE(c.per_call("dp", 1 << 20, 4).has_value());
  // each micro-batch beyond the first: the step at accumulation 2 less the step at 1, at the same size
  EXPECT_NEAR(*c.per_micro_batch("zero3", 200 << 10), 105 * 2e-3 - 63 * 1e-3, 1e-12);
  EXPECT_FALSE(c.per_micro_batch("zero3", 25 << 20).has_value());
  EXPECT_FALSE(c.per_micro_batch("tp", 0).has_value());
  const std::string path = testing::TempDir() + "in_step_test.json";
  dtrain::plan::write_in_step_costs(path, c);
  const auto back = dtrain::plan::read_in_step_costs(path);
  EXPECT_EQ(back.key, "k");
  ASSERT_EQ(back.points.size(), c.points.size());
  EXPECT_NEAR(*back.per_call("zero3", 256 << 10, 4.5), 4.5e-3, 1e-12);
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"format\": \"dtrain-in-step-costs\", \"key\": 3}", f);
  std::fclose(f);
  try {
    dtrain::plan::read_in_step_costs(path);
    ADD_FAILURE() << "a bad file was read";
  } catch (const dtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

// Each family's in-step cost per call adds to the exposed communication over that family's calls: dp's
// gradient buckets (zero1 and zero2 too, not their all-gather), zero3's gathers in every micro-batch's
// forward and backward and its reduce-scatters, tp's calls in place of the profile's blocking penalty.
TEST(StepModel, InStepCostsAddPerCallOverTheirFamilysCalls) {
  KnownCompute compute;
  compute.tp_comm = {{"all_reduce", 6, 6 << 10}};
  const auto f = facts(1 << 18, 4);  // 4 parameters of 1 MiB: dp buckets of 1 MiB, 2 MiB, 1 MiB
  for (const char* strategy : {"dp", "zero1", "zero2", "zero3"}) {
    for (int64_t acc : {1, 3}) {
      for (double per : {2e-4, -1e-2}) {
        dtrain::plan::Candidate a;
        a.strategy = strategy;
        a.micro_batch = 2;
        a.accumulation = acc;
        a.bucket_bytes = 2 << 20;  // (zero3: units of 2 MiB: 2 of them)
        dtrain::plan::Candidate b = a;
        auto with = links(1e-3, 1e-9);
        dtrain::plan::predict(a, f, compute, with, {2, 2}, 0.0);
        const std::string family = std::string(strategy) == "zero3" ? "zero3" : "dp";
        const int64_t calls_one =
            family == "zero3" ? 6 : 3;  // (a step of one micro-batch: the measured calls)
        with.in_step.points = {{family, 2 << 20, 1, 1, calls_one, per}};
        dtrain::plan::predict(b, f, compute, with, {2, 2}, 0.0);
        const int64_t calls = family == "zero3" ? acc * 2 * 2 + 2 : 3;
        EXPECT_EQ(b.comm_calls, calls) << strategy;
        EXPECT_NEAR(b.in_step_s, per * static_cast<double>(calls), 1e-12) << strategy;
        EXPECT_NEAR(b.exposed_comm_s, std::max(0.0, a.exposed_comm_s + b.in_step_s), 1e-12) << strategy;
        EXPECT_NEAR(b.predicted_step_s - a.predicted_step_s, b.exposed_comm_s - a.exposed_comm_s, 1e-12);
        // measured at accumulation 2 as well: a step of one micro-batch's calls, plus what each further
        // micro-batch adds
        const int64_t calls_two = family == "zero3" ? 2 * 2 * 2 + 2 : 3;
        with.in_step.points.push_back({family, 2 << 20, 1, 2, calls_two, 3 * per});
        dtrain::plan::Candidate d = a;
        dtrain::plan::predict(d, f, compute, with, {2, 2}, 0.0);
        const double more = 3 * per * static_cast<double>(calls_two) - per * static_cast<double>(calls_one);
        EXPECT_NEAR(d.in_step_s,
                    per * static_cast<double>(calls_one) + static_cast<double>(acc - 1) * std::max(0.0, more),
                    1e-12)
            << strategy;
      }
    }
  }
  for (int64_t acc : {1, 2}) {  // tp: each call alpha-beta + its in-step cost (or the profile's penalty)
    dtrain::plan::Candidate a;
    a.tp = 2;
    a.micro_batch = 4;
    a.accumulation = acc;
    dtrain::plan::Candidate b = a;
    auto with = links(1e-3, 1e-9);
    with.blocking_penalty_s = 5e-4;
    dtrain::plan::predict(a, f, compute, with, {2, 2}, 0.0);
    with.in_step.points = {{"tp", 0, 4, 1, 6, 3e-3}};
    dtrain::plan::predict(b, f, compute, with, {2, 2}, 0.0);
    const double ab = 1e-3 + 1e-9 * (1 << 10);  // 1 KiB each, bus factor 2 (n - 1) / n = 1
    EXPECT_NEAR(a.comm.at("tp"), static_cast<double>(acc) * 6 * (ab + 5e-4), 1e-12);
    EXPECT_NEAR(b.comm.at("tp"), static_cast<double>(acc) * 6 * (ab + 3e-3), 1e-12);
    EXPECT_EQ(b.comm_calls, acc * 6);
  }
}

TEST(Planner, PicksTheKnownFastestAndRanksTheRest) {
  KnownCompute compute;
  const auto f = facts(1 << 16, 8);
  // links that cost only per call: dp's one all-reduce per bucket beats zero1/2's two and zero3's three
  const auto slow_calls = links(5e-3, 0);
  const auto plan = dtrain::plan::make_plan(f, compute, slow_calls, request(2, 8, 1e12));
  const auto& best = plan.candidates[plan.chosen];
  EXPECT_EQ(best.strategy, "dp");
  EXPECT_FALSE(best.checkpoint_activations);  // (recomputation only costs)
  EXPECT_EQ(best.accumulation, 1);            // (each micro-batch pays f0)
  EXPECT_TRUE(best.chosen);
  EXPECT_EQ(best.rank, 1);
  for (size_t i = 1; i < plan.candidates.size(); ++i) {
    EXPECT_GE(plan.candidates[i].predicted_step_s, plan.candidates[i - 1].predicted_step_s);
    EXPECT_EQ(plan.candidates[i].rank, static_cast<int>(i + 1));
    EXPECT_NE(plan.candidates[i].reason.find("slower"), std::string::npos) << plan.candidates[i].reason;
  }
  // free links and a costly optimizer: sharding the optimizer wins, and the least memory breaks the tie
  compute.o = 1e-6;
  const auto free = dtrain::plan::make_plan(f, compute, links(0, 0), request(2, 8, 1e12));
  EXPECT_EQ(free.candidates[free.chosen].strategy, "zero3")
      << free.candidates[0].name() << " " << free.candidates[0].predicted_step_s << " "
      << free.candidates[0].predicted_peak_bytes << "; " << free.candidates[1].name() << " "
      << free.candidates[1].predicted_step_s << " " << free.candidates[1].predicted_peak_bytes;
}

TEST(Planner, TheBudgetRulesCandidatesOutAndNoFitIsAnErrorNamingTheSmallest) {
  KnownCompute compute;
  const auto f = facts(1 << 16, 8);  // 2 MiB of fp32 parameters: dp holds 16 bytes each (8 MiB)
  const auto slow_calls = links(5e-3, 0);
  const auto all = dtrain::plan::make_plan(f, compute, slow_calls, request(2, 8, 1e12));
  double dp_peak = 0, least = 1e30;
  for (const auto& c : all.candidates) {
    if (c.strategy == "dp" && !c.checkpoint_activations && c.accumulation == 1)
      dp_peak = c.predicted_peak_bytes;
    least = std::min(least, c.predicted_peak_bytes);
  }
  const double budget = dp_peak * 1.05 - 1;  // (a candidate fits with a 5% margin)
  const auto tight = dtrain::plan::make_plan(f, compute, slow_calls, request(2, 8, budget));
  const auto& best = tight.candidates[tight.chosen];
  EXPECT_FALSE(best.strategy == "dp" && !best.checkpoint_activations && best.accumulation == 1);
  for (const auto& c : tight.candidates) {
    EXPECT_EQ(c.fits, c.predicted_peak_bytes * 1.05 <= budget);
    if (!c.fits) {
      EXPECT_NE(c.reason.find("> budget"), std::string::npos) << c.reason;
    }
  }
  try {
    dtrain::plan::make_plan(f, compute, slow_calls, request(2, 8, least * 1.05 - 1));
    FAIL() << "no error";
  } catch (const dtrain::ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no candidate fits"), std::string::npos) << msg;
    char mib[32];
    std::snprintf(mib, sizeof(mib), "%.1f MiB", least / (1 << 20));
    EXPECT_NE(msg.find(mib), std::string::npos) << msg;
  }
}

TEST(Planner, FlagsRunTheCandidate) {
  dtrain::plan::Candidate c;
  c.strategy = "hsdp";
  c.tp = 2;
  c.sequence_parallel = true;
  c.checkpoint_activations = true;
  c.accumulation = 4;
  c.bucket_bytes = 4 << 20;
  c.shard_size = 2;
  const auto flags = dtrain::plan::candidate_flags(c, 32);
  const std::vector<std::string> want{"--strategy",
                                      "hsdp",
                                      "--tp",
                                      "2",
                                      "--batch",
                                      "32",
                                      "--accumulation",
                                      "4",
                                      "--bucket-bytes",
                                      "4M",
                                      "--shard-size",
                                      "2",
                                      "--sequence-parallel",
                                      "--checkpoint-activations"};
  EXPECT_EQ(flags, want);
}

TEST(ClusterProfile, SecondsFollowAlphaBetaAndMissingLinksAreNamed) {
  auto p = links(2e-4, 1e-9);
  p.intra_host.ranks = 2;
  // alpha scales with (n - 1) from the measured 2 ranks; beta per bus byte
  EXPECT_NEAR(p.seconds("all_reduce", 4, 1e6, false), 2e-4 * 3 + 1e-9 * 1e6 * 2 * 3 / 4, 1e-15);
  EXPECT_NEAR(p.seconds("all_gather", 3, 9e5, false), 2e-4 * 2 + 1e-9 * 9e5 * 2 / 3, 1e-15);
  EXPECT_EQ(p.seconds("all_reduce", 1, 1e9, false), 0);
  try {
    p.seconds("all_reduce", 4, 1e6, true);
    FAIL() << "no error";
  } catch (const dtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("inter_host"), std::string::npos) << e.what();
  }
}

TEST(ClusterProfile, FilesRoundTripAndBadFilesAreNamed) {
  const std::string dir = testing::TempDir();
  auto p = links(2e-4, 1e-9);
  p.backend = "gloo";
  p.overlap = 0.25;
  p.inter_host.ranks = 4;
  p.inter_host.collectives["all_reduce"] = {1e-3, 1e-8};
  const std::string path = dir + "/cluster.json";
  dtrain::plan::write_cluster_profile(path, p);
  const auto q = dtrain::plan::read_cluster_profile(path);
  EXPECT_EQ(q.backend, "gloo");
  EXPECT_DOUBLE_EQ(q.overlap, 0.25);
  EXPECT_DOUBLE_EQ(q.inter_host.collectives.at("all_reduce").beta, 1e-8);
  EXPECT_DOUBLE_EQ(q.intra_host.collectives.at("all_gather").alpha, 2e-4);
  for (const std::string& bad : {std::string("{not json"), std::string(R"({"format": "other"})"),
                                 std::string(R"({"format": "dtrain-comm-profile", "ranks": 2,
                                     "collectives": {"all_reduce": {"alpha_s": -1, "beta_s_per_byte": 0}}})")}) {
    const std::string file = dir + "/bad.json";
    FILE* out = std::fopen(file.c_str(), "w");
    std::fputs(bad.c_str(), out);
    std::fclose(out);
    try {
      dtrain::plan::read_cluster_profile(file);
      FAIL() << "no error for " << bad;
    } catch (const dtrain::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(dtrain::plan::read_cluster_profile(dir + "/missing.json"), dtrain::ValueError);
}

TEST(ComputeProfile, LinesThroughThePointsAndFilesRoundTrip) {
  dtrain::plan::ComputeProfile p;
  p.signature = "s";
  p.optimizer_s_per_param = 1e-9;
  for (int64_t mb : {2, 4, 8}) {
    dtrain::plan::ComputePoint q;
    q.micro_batch = mb;
    q.forward_s = 0.001 + 0.002 * static_cast<double>(mb);
    q.backward_s = 2 * q.forward_s;
    q.activation_bytes = 1000 * mb;
    p.points.push_back(q);
  }
  EXPECT_NEAR(p.forward_seconds(16, {}), 0.001 + 0.032, 1e-12);
  EXPECT_NEAR(p.backward_seconds(3, {}), 2 * 0.007, 1e-12);
  EXPECT_NEAR(p.activation_bytes(5, {}), 5000, 1e-6);
  EXPECT_THROW(p.forward_seconds(1, {2, false, false}), dtrain::ValueError);  // not measured
  p.unsteady = 1.25;
  const std::string path = testing::TempDir() + "/compute.json";
  dtrain::plan::write_compute_profile(path, p);
  const auto q = dtrain::plan::read_compute_profile(path);
  EXPECT_NEAR(q.forward_seconds(16, {}), 0.033, 1e-12);
  EXPECT_EQ(q.points.size(), 3u);
  EXPECT_DOUBLE_EQ(q.unsteady, 1.25);
  // the plan's compute line says how unsteady the machine was, and how to measure again
  const std::string line = dtrain::plan::measured_compute(q, "cached")->source();
  EXPECT_NE(line.find("25% slower"), std::string::npos) << line;
  EXPECT_NE(line.find("delete the file"), std::string::npos) << line;
}

TEST(Rehearsal, EachCollectiveDoesThisRanksShare) {
  auto g = dtrain::comm::rehearsal_group(3, 1);
  EXPECT_EQ(g->group_size(), 3);
  EXPECT_EQ(g->group_rank(), 1);
  at::Tensor in = at::arange(4, at::kFloat), out = at::zeros({12});
  g->all_gather(out, in)->wait();
  EXPECT_TRUE(out.equal(at::cat({in, in, in})));
  at::Tensor whole = at::arange(6, at::kFloat), mine = at::zeros({2});
  g->reduce_scatter(mine, whole)->wait();
  EXPECT_TRUE(mine.equal(whole.narrow(0, 2, 2)));
  at::Tensor same = at::arange(5, at::kFloat);
  g->all_reduce(same)->wait();
  EXPECT_TRUE(same.equal(at::arange(5, at::kFloat)));
  at::Tensor t = at::zeros({1});
  EXPECT_THROW(g->send(t, 0)->wait(), dtrain::NotSupportedError);
  EXPECT_THROW(dtrain::comm::rehearsal_group(2, 2), dtrain::ValueError);
}

TEST(MeasureCompute, ALinearModulesProfileGrowsWithTheMicroBatch) {
  dtrain::plan::ProfileTarget t;
  t.description = "linear 64";
  t.build = [] { return std::static_pointer_cast<torch::nn::Module>(torch::nn::Linear(64, 64).ptr()); };
  t.loss = [](torch::nn::Module& m, int64_t mb) {
    return dynamic_cast<torch::nn::LinearImpl&>(m).forward(at::randn({mb * 16, 64})).square().mean();
  };
  dtrain::plan::MeasureOptions o;
  o.largest_micro_batch = {{1, 8}};
  o.smallest_micro_batch = 2;
  o.repeats = 1;
  const auto p = dtrain::plan::measure_compute(t, o);
  ASSERT_EQ(p.points.size(), 3u);  // 8, 4 and 2
  EXPECT_EQ(p.points[0].micro_batch, 8);
  EXPECT_GT(p.points[0].activation_bytes, p.points[2].activation_bytes);
  EXPECT_GE(p.points[2].activation_bytes, 2 * 16 * 64 * 4);  // at least the output
  EXPECT_EQ(p.params, 64 * 64 + 64);
  EXPECT_GT(p.optimizer_s_per_param, 0);
}

}  // namespace

TEST(Topology, AnAxisSpansHostsWhenItsGroupsDo) {
  const dtrain::plan::Topology two_hosts{4, 2}, one_host{4, 4};
  EXPECT_FALSE(two_hosts.across(true, 2, 4));   // inner groups {0,1}, {2,3}
  EXPECT_TRUE(two_hosts.across(false, 2, 4));   // outer groups {0,2}, {1,3}
  EXPECT_TRUE(two_hosts.across(true, 4, 4));    // one group of all four
  EXPECT_FALSE(two_hosts.across(false, 1, 4));  // (a group of one spans nothing)
  EXPECT_FALSE(one_host.across(false, 2, 4));
  EXPECT_FALSE(one_host.across(true, 4, 4));
  EXPECT_TRUE((dtrain::plan::Topology{6, 3}.across(true, 2, 6)));  // {2,3} straddles hosts {0,1,2}, {3,4,5}
}

// Two hosts of 2 ranks, links across them 100 times slower: each 2-axis layout comes in both mesh orders,
// and the one whose heavier axis stays inside a host is predicted faster, whichever axis that is.
TEST(Planner, KeepsTheHeavierAxisInsideAHost) {
  auto f = facts(1 << 16, 8);
  for (size_t i = 0; i < f.params.size(); i += 2) f.params[i].tp_placement = "Shard(0)";
  f.tp_degrees = {2};
  auto two = links(1e-5, 1e-10);
  two.inter_host.ranks = 4;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"})
    two.inter_host.collectives[op] = {1e-3, 1e-8};
  auto req = request(4, 8, 1e12);
  req.topo = {4, 2};
  for (bool heavy_tp : {true, false}) {
    KnownCompute compute;
    compute.f1 = 0.1;  // (compute dominates: tp halves it)
    // tp's collectives per micro-batch: many large ones, or one small one
    compute.tp_comm = {{"all_reduce", heavy_tp ? 64 : 1, heavy_tp ? int64_t{64} << 20 : 1024}};
    const auto plan = dtrain::plan::make_plan(f, compute, two, req);
    int pairs = 0;
    for (const auto& c : plan.candidates) {
      if (c.mesh_order.empty()) continue;
      EXPECT_TRUE(c.mesh_order == "tp,dp" ? c.tp > 1 : c.strategy == "hsdp") << c.name();
      const auto it = std::find(c.flags.begin(), c.flags.end(), "--mesh-order");
      ASSERT_NE(it, c.flags.end());
      EXPECT_EQ(*(it + 1), c.mesh_order);
      for (const auto& d : plan.candidates) {  // its twin, tp (or shard) groups on consecutive ranks
        if (d.mesh_order.empty() && d.name() + " mesh " + c.mesh_order == c.name()) {
          ++pairs;
          if (c.tp > 1) {  // heavy tp: tp inside a host wins; light tp: dp's gradients inside win
            EXPECT_EQ(d.predicted_step_s < c.predicted_step_s, heavy_tp) << d.name();
          } else {  // hsdp: the shard groups carry 3 collectives of the units, the replicas 1 of a shard
            EXPECT_LT(d.predicted_step_s, c.predicted_step_s) << d.name();
          }
        }
      }
    }
    EXPECT_GT(pairs, 8);
    // the fastest with tp 2 (the candidates are ranked): tp inside a host when its collectives are heavy
    const auto best = std::find_if(plan.candidates.begin(), plan.candidates.end(),
                                   [](const dtrain::plan::Candidate& c) { return c.tp == 2; });
    ASSERT_NE(best, plan.candidates.end());
    EXPECT_EQ(best->mesh_order, heavy_tp ? "" : "tp,dp") << best->name();
  }
  // one host: nothing to lay out, no twins
  req.topo = {4, 4};
  KnownCompute compute;
  for (const auto& c : dtrain::plan::make_plan(f, compute, two, req).candidates) EXPECT_EQ(c.mesh_order, "");
}

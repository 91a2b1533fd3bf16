// Pure tier: the redistribution planner. Every source -> target pair on 1-d and 2x2 meshes with an uneven
// shape: a plan exists, each step is legal from the state it starts in, the steps end at the target, and the
// plan never costs more than the naive route (gather everything, then re-shard).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "core/error.h"

#include "tensor/redistribute_plan.h"
#include "tensor/shard_math.h"

using namespace dtrain;
using namespace dtrain::tensor;
using namespace dtrain::comm;  // the cost model (comm/cost_model.h)

namespace {

std::vector<Placements> all_placements(int axes) {
  return tensor::all_placements({Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum),
                                 Partial(ReduceOp::kAvg), Partial(ReduceOp::kMax)},
                                axes);
}

std::vector<StepKind> kinds(const RedistributePlan& plan) {
  std::vector<StepKind> out;
  for (auto& s : plan.steps) out.push_back(s.kind);
  return out;
}

RedistributeProblem problem(std::vector<int64_t> mesh_shape, Placements from, Placements to) {
  return RedistributeProblem{{7, 5}, 4, std::move(mesh_shape), std::move(from), std::move(to)};
}

TEST(RedistributePlan, EveryPairIsLegalReachesTheTargetAndBeatsNaive) {
  for (auto mesh_shape : std::vector<std::vector<int64_t>>{{2}, {3}, {4}, {2, 2}}) {
    CostModel model = CostModel::defaults(static_cast<int>(mesh_shape.size()));
    auto all = all_placements(static_cast<int>(mesh_shape.size()));
    int pairs = 0;
    for (const Placements& from : all) {
      for (const Placements& to : all) {
        RedistributeProblem p = problem(mesh_shape, from, to);
        RedistributePlan plan = plan_redistribute(p, model);
        Placements state = from;
        for (const auto& step : plan.steps) {
          auto legal = next_steps(p, state, model);
          bool found = std::any_of(legal.begin(), legal.end(), [&](const RedistributeStep& s) {
            return s.axis == step.axis && s.to == step.to && s.kind == step.kind;
          });
          ASSERT_TRUE(found) << "illegal step from " << to_string(state) << "\n" << plan.explain();
          state = step.after;
        }
        ASSERT_EQ(state, to) << plan.explain();
        RedistributePlan naive = naive_plan(p, model);
        EXPECT_LE(plan.cost, naive.cost + 1e-15) << plan.explain() << naive.explain();
        ++pairs;
      }
    }
    EXPECT_EQ(pairs, static_cast<int>(all.size() * all.size()));
  }
}

TEST(RedistributePlan, SingleAxisChoosesTheDirectCollective) {
  CostModel m = CostModel::defaults(1);
  auto plan = [&](Placement from, Placement to) { return plan_redistribute(problem({3}, {from}, {to}), m); };
  EXPECT_EQ(kinds(plan(Shard(0), Replicate())), std::vector<StepKind>{StepKind::kAllGather});
  EXPECT_EQ(kinds(plan(Partial(), Replicate())), std::vector<StepKind>{StepKind::kAllReduce});
  EXPECT_EQ(kinds(plan(Partial(), Shard(1))), std::vector<StepKind>{StepKind::kReduceScatter});
  EXPECT_EQ(kinds(plan(Shard(0), Shard(1))), std::vector<StepKind>{StepKind::kAllToAll});
  EXPECT_EQ(kinds(plan(Replicate(), Shard(1))), std::vector<StepKind>{StepKind::kLocalSlice});
  EXPECT_EQ(kinds(plan(Partial(ReduceOp::kAvg), Partial(ReduceOp::kSum))),
            std::vector<StepKind>{StepKind::kLocalScale});
  EXPECT_EQ(plan(Replicate(), Shard(1)).collectives(), 0);
  EXPECT_TRUE(plan(Shard(0), Shard(0)).steps.empty());
  // max partials cannot become sums locally: through Replicate.
  EXPECT_EQ(kinds(plan(Partial(ReduceOp::kMax), Partial(ReduceOp::kSum))),
            (std::vector<StepKind>{StepKind::kAllReduce, StepKind::kLocalPartial}));
}

TEST(RedistributePlan, TwoByTwoMeshUsesReduceScatterNotAllReduceThenSlice) {
  CostModel m = CostModel::defaults(2);
  RedistributePlan plan =
      plan_redistribute(problem({2, 2}, {Shard(0), Partial()}, {Replicate(), Shard(1)}), m);
  EXPECT_EQ(plan.collectives(), 2);
  EXPECT_EQ(kinds(plan), (std::vector<StepKind>{StepKind::kReduceScatter, StepKind::kAllGather}));
  std::string text = plan.explain();
  std::cout << text;  // the explain() output, kept in the test log
  EXPECT_NE(text.find("redistribute (S(0), P(sum)) -> (R, S(1)) on mesh (2, 2), global shape (7, 5)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("reduce_scatter"), std::string::npos) << text;
  EXPECT_NE(text.find("total: 2 collective(s)"), std::string::npos) << text;
  // Nested shards of one dim: gathering the outer axis first is illegal, so the inner one goes first.
  RedistributePlan nested =
      plan_redistribute(problem({2, 2}, {Shard(0), Shard(0)}, {Replicate(), Replicate()}), m);
  ASSERT_EQ(nested.steps.size(), 2u);
  EXPECT_EQ(nested.steps[0].axis, 1);
  EXPECT_EQ(nested.steps[1].axis, 0);
}

TEST(RedistributePlan, CheaperAxisIsPreferredWhenTheModelSaysSo) {
  // P on both axes -> R: two all_reduces either way, but the bytes of the second depend on the first only
  // through the shape; with axis 1 ten times slower per byte, P->S on axis 0 first shrinks what axis 1 must
  // move.
  CostModel m = CostModel::defaults(2);
  m.set(StepKind::kAllReduce, 1, {200e-6, 10.0 / 1e9});
  m.set(StepKind::kReduceScatter, 1, {200e-6, 10.0 / 1e9});
  RedistributeProblem p{{1024, 1024}, 4, {2, 2}, {Partial(), Partial()}, {Replicate(), Replicate()}};
  RedistributePlan plan = plan_redistribute(p, m);
  EXPECT_LE(plan.cost, naive_plan(p, m).cost);
  EXPECT_LT(plan.seconds, naive_plan(p, m).seconds) << plan.explain();
}

// A placement given as S(-1) means the last dim, as in Python.
TEST(RedistributePlan, NegativeShardDimIsTheLastDim) {
  Placements p = check_placements("test", parse_placements("S(-1)"), 3, 1);
  EXPECT_EQ(p[0], Shard(2));
}

// Problems given by hand are checked: meshes without ranks or with more ranks than a job, byte counts that
// would overflow.
TEST(RedistributePlan, ProblemsOutOfRangeAreRefused) {
  RedistributeProblem p = problem({2}, {Shard(0)}, {Replicate()});
  EXPECT_NO_THROW(check_problem(p));
  for (auto mesh : {std::vector<int64_t>{0}, std::vector<int64_t>{1000000000, 1000000000}}) {
    RedistributeProblem q = p;
    q.mesh_shape = mesh;
    EXPECT_THROW(check_problem(q), ValueError);
  }
  RedistributeProblem big = p;
  big.shape = {int64_t{1} << 62, 4};
  EXPECT_THROW(check_problem(big), ValueError);
}

TEST(RedistributePlan, CacheReturnsTheSamePlan) {
  PlanCache cache(CostModel::defaults(1));
  PlanPtr a = cache.get(problem({3}, {Shard(0)}, {Replicate()}));
  PlanPtr b = cache.get(problem({3}, {Shard(0)}, {Replicate()}));
  EXPECT_EQ(a.get(), b.get());
  cache.get(problem({3}, {Shard(1)}, {Replicate()}));
  EXPECT_EQ(cache.size(), 2u);
}

// Dynamic shapes: the cache keeps at most its capacity, dropping the least recently used plan; a plan still
// held stays valid after it was dropped.
TEST(RedistributePlan, CacheIsBoundedLeastRecentlyUsedFirst) {
  PlanCache cache(CostModel::defaults(1), 8);
  RedistributeProblem first = problem({3}, {Shard(0)}, {Replicate()});
  PlanPtr held = cache.get(first);
  for (int64_t rows = 10; rows < 200; ++rows) {
    RedistributeProblem p = first;
    p.shape[0] = rows;
    cache.get(p);
    EXPECT_LE(cache.size(), 8u);
  }
  EXPECT_EQ(cache.size(), 8u);
  EXPECT_EQ(held->problem.shape, first.shape);    // still readable
  EXPECT_NE(cache.get(first).get(), held.get());  // dropped and planned afresh
  // The most recently used plan survives new entries.
  PlanPtr recent = cache.get(first);
  for (int64_t rows = 300; rows < 306; ++rows) {
    RedistributeProblem p = first;
    p.shape[0] = rows;
    cache.get(p);
    cache.get(first);
  }
  EXPECT_EQ(cache.get(first).get(), recent.get());
}

}  // namespace

namespace {

TEST(CostProfile, FitRecoversAlphaAndBeta) {
  std::vector<std::pair<double, double>> pts;
  for (double b : {1e3, 1e4, 1e5, 1e6, 1e7}) pts.emplace_back(b, 2e-4 + 1e-9 * b);
  AlphaBeta ab = fit_alpha_beta(pts);
  EXPECT_NEAR(ab.alpha, 2e-4, 1e-9);
  EXPECT_NEAR(ab.beta, 1e-9, 1e-15);
  EXPECT_THROW(fit_alpha_beta({{1e3, 1.0}}), ValueError);
  // Relative errors count alike: 30% noise on the largest size leaves the latency within 10%.
  pts.back().second *= 1.3;
  EXPECT_NEAR(fit_alpha_beta(pts).alpha, 2e-4, 2e-5);
  // Negative slopes from noise become pure latency.
  AlphaBeta flat = fit_alpha_beta({{1e3, 2e-3}, {1e6, 1e-3}});
  EXPECT_EQ(flat.beta, 0);
  EXPECT_NEAR(flat.alpha, 1.5e-3, 1e-12);
}

TEST(CostProfile, RoundTripAndErrors) {
  std::string path = ::testing::TempDir() + "/dtrain_profile_test.json";
  CommProfile p{"gloo", 2, {{"all_reduce", {3e-4, 2e-9}}, {"all_gather", {1e-4, 1e-9}}}};
  write_profile(path, p);
  CommProfile q = read_profile(path);
  EXPECT_EQ(q.backend, "gloo");
  EXPECT_EQ(q.ranks, 2);
  EXPECT_DOUBLE_EQ(q.collectives.at("all_reduce").beta, 2e-9);
  CostModel m = CostModel::from_profile(q, 2);
  EXPECT_DOUBLE_EQ(m.get(StepKind::kAllReduce, 1).alpha, 3e-4);
  EXPECT_DOUBLE_EQ(m.get(StepKind::kAllToAll, 0).alpha,
                   CostModel::defaults(1).get(StepKind::kAllToAll, 0).alpha);
  auto message = [](const std::string& file) {
    try {
      read_profile(file);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message(path + ".missing").find("cannot open"), std::string::npos);
  { std::ofstream(path) << "{not json"; }
  EXPECT_NE(message(path).find("is not JSON"), std::string::npos);
  {
    std::ofstream(path)
        << R"({"format": "dtrain-comm-profile", "version": 1, "collectives": {"all_reduce": {"alpha_s": -1, "beta_s_per_byte": 0}}})";
  }
  EXPECT_NE(message(path).find("collectives.all_reduce has alpha_s=-1"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace

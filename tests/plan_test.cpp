// Unit tier: plan/'s memory model and the strategy `auto` picks, against the bytes counted one tensor at a
// time (fp32 AdamW: weights, gradients and two moments, each sharded or not by the strategy).
#include <gtest/gtest.h>

#include "core/balanced_split.h"
#include "core/error.h"
#include "plan/memory_model.h"
#include "plan/strategy_choice.h"

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

TEST(StrategyChoice, TheFirstOfDpZero2Zero3ThatFitsHalfTheMemoryPerRank) {
  for (int64_t n = 1; n <= 4; ++n) {
    for (int64_t local = 1; local <= n; ++local) {
      const int64_t params = 1000003;
      // budgets around each strategy's bytes (per rank: available / local / 2)
      for (double per_rank :
           {16.0 * params, 16.0 * params - 1, (4 + 12.0 / n) * params, 16.0 / n * params - 1}) {
        dtrain::plan::StrategyInputs in;
        in.params = params;
        in.data_parallel = n;
        in.ranks_on_node = local;
        in.available_bytes = per_rank * 2 * static_cast<double>(local);
        const auto c = dtrain::plan::choose_strategy(in);
        Strategy want = Strategy::kZero3;  // (when nothing fits: the least memory there is)
        for (Strategy s : {Strategy::kZero3, Strategy::kZero2, Strategy::kDataParallel}) {
          if (dtrain::plan::model_state_bytes_per_param(s, static_cast<double>(n)) * params <= per_rank) {
            want = s;
          }
        }
        EXPECT_EQ(c.strategy, want) << "n " << n << " local " << local << " per rank " << per_rank;
        EXPECT_NE(c.reason.find(dtrain::parallel::to_string(want)), std::string::npos) << c.reason;
      }
    }
  }
}

TEST(StrategyChoice, TensorParallelDividesTheParameters) {
  dtrain::plan::StrategyInputs in;
  in.params = 1600;
  in.tp = 2;
  in.available_bytes = 2 * 16 * 800;  // exactly dp for half the parameters
  EXPECT_EQ(dtrain::plan::choose_strategy(in).strategy, Strategy::kDataParallel);
  in.tp = 1;
  EXPECT_EQ(dtrain::plan::choose_strategy(in).strategy, Strategy::kZero3);
}

TEST(StrategyChoice, UnknownMemoryIsAnErrorNamingTheFix) {
  dtrain::plan::StrategyInputs in;
  in.params = 10;
  in.available_bytes = 0;
  try {
    dtrain::plan::choose_strategy(in);
    FAIL() << "no error";
  } catch (const dtrain::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("--strategy dp, zero2 or zero3"), std::string::npos) << e.what();
  }
}

}  // namespace

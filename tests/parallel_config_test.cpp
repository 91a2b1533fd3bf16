// Pure tests of the strategies' names, configuration checks and row split (parallel/): one process, no
// communication.
#include <gtest/gtest.h>

#include "core/balanced_split.h"
#include "core/error.h"
#include "parallel/parallelize.h"

namespace {

using namespace dtrain;
using namespace dtrain::parallel;

TEST(StrategyNames, CanonicalNamesAndAliases) {
  EXPECT_EQ(parse_strategy("dp"), Strategy::kDataParallel);
  EXPECT_EQ(parse_strategy("DDP"), Strategy::kDataParallel);
  EXPECT_EQ(parse_strategy("horovod"), Strategy::kDataParallel);
  EXPECT_EQ(parse_strategy("deepspeed2"), Strategy::kZero2);
  EXPECT_EQ(parse_strategy("shard_grad_op"), Strategy::kZero2);
  EXPECT_EQ(parse_strategy("fsdp"), Strategy::kZero3);
  EXPECT_EQ(parse_strategy("full_shard"), Strategy::kZero3);
  EXPECT_EQ(parse_strategy("hybrid_shard"), Strategy::kHybridShard);
  EXPECT_EQ(strategy_names(), (std::vector<std::string>{"dp", "zero1", "zero2", "zero3", "hsdp"}));
  for (const auto& name : strategy_names()) EXPECT_EQ(to_string(parse_strategy(name)), name);
  try {
    parse_strategy("deepspeed");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a stage"), std::string::npos) << e.what();
  }
  try {
    parse_strategy("zero4");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'zero4' is not a strategy"), std::string::npos) << e.what();
  }
}

// --mesh-order's comma-separated form: its axes in order, and whether tp's (or hsdp's shard) groups are the
// strided, outermost axis.
TEST(MeshOrder, ParsedInOrderAndStridedOnlyWhenTpOrShardComesFirst) {
  EXPECT_TRUE(dtrain::parallel::parse_mesh_order("").empty());
  EXPECT_EQ(dtrain::parallel::parse_mesh_order("tp,dp"), (std::vector<std::string>{"tp", "dp"}));
  EXPECT_EQ(dtrain::parallel::parse_mesh_order("replicate,shard"),
            (std::vector<std::string>{"replicate", "shard"}));
  for (const char* strided : {dtrain::parallel::kTpGroupsStrided, dtrain::parallel::kShardGroupsStrided})
    EXPECT_TRUE(dtrain::parallel::groups_strided(strided)) << strided;
  for (const char* inner : {"", "dp,tp", "replicate,shard"})
    EXPECT_FALSE(dtrain::parallel::groups_strided(inner)) << inner;
}

TEST(ParallelConfig, DegreesAreCheckedUpFront) {
  ParallelConfig c;
  EXPECT_EQ(validate_parallel_config(c, 3), Strategy::kDataParallel);
  c.strategy = "zero2";
  EXPECT_EQ(validate_parallel_config(c, 4), Strategy::kZero2);
  auto message = [](const ParallelConfig& c, int64_t n) -> std::string {
    try {
      validate_parallel_config(c, n);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  ParallelConfig tp;
  tp.tp = 3;
  EXPECT_NE(message(tp, 4).find("tp 3 does not divide the world size 4"), std::string::npos)
      << message(tp, 4);
  ParallelConfig stray;
  stray.shard_size = 2;
  EXPECT_NE(message(stray, 4).find("shard_size 2 is for hsdp only"), std::string::npos) << message(stray, 4);
  ParallelConfig hsdp;
  hsdp.strategy = "hsdp";
  hsdp.shard_size = 3;
  EXPECT_NE(message(hsdp, 4).find("(got 3)"), std::string::npos) << message(hsdp, 4);
  hsdp.shard_size = 4;  // one group: that is zero3
  EXPECT_NE(message(hsdp, 4).find("(got 4)"), std::string::npos) << message(hsdp, 4);
  hsdp.shard_size = 2;
  EXPECT_EQ(validate_parallel_config(hsdp, 4), Strategy::kHybridShard);
  ParallelConfig z3;
  z3.strategy = "fsdp";
  EXPECT_EQ(validate_parallel_config(z3, 3), Strategy::kZero3);
  ParallelConfig two_d;
  two_d.tp = 2;
  EXPECT_NE(message(two_d, 4).find("tp 2 needs a plan"), std::string::npos) << message(two_d, 4);
  two_d.tp_plan.styles = {{"fc", ColwiseParallel()}};
  EXPECT_EQ(validate_parallel_config(two_d, 4), Strategy::kDataParallel);
  two_d.strategy = "zero3";
  EXPECT_EQ(validate_parallel_config(two_d, 4), Strategy::kZero3);
  two_d.tp_plan.sequence_parallel = true;  // its whole gradients are summed after backward: dp only
  EXPECT_THROW(validate_parallel_config(two_d, 4), NotSupportedError);
  two_d.tp_plan.sequence_parallel = false;
  two_d.strategy = "hsdp";
  two_d.shard_size = 1;
  EXPECT_THROW(validate_parallel_config(two_d, 4), NotSupportedError);
  two_d.tp = 3;
  EXPECT_NE(message(two_d, 4).find("tp 3 does not divide the world size 4"), std::string::npos);
}

TEST(BalancedSplit, EvenAsPossibleAndCovering) {
  for (int64_t rows : {0, 1, 5, 16, 17}) {
    for (int64_t parts = 1; parts <= 4; ++parts) {
      int64_t next = 0;
      for (int64_t i = 0; i < parts; ++i) {
        Range r = balanced_part(rows, parts, i);
        EXPECT_EQ(r.start, next) << rows << " rows, part " << i << " of " << parts;
        EXPECT_GE(r.count, rows / parts);
        EXPECT_LE(r.count, rows / parts + 1);
        next += r.count;
      }
      EXPECT_EQ(next, rows);
    }
  }
  EXPECT_EQ(balanced_part(16, 3, 0).count, 6);
  EXPECT_EQ(balanced_part(16, 3, 2).count, 5);
  EXPECT_EQ(balanced_counts(16, 3), (std::vector<int64_t>{6, 5, 5}));
  EXPECT_EQ(balanced_counts(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
}

}  // namespace

TEST(TensorParallelPlan, PatternsMatchWithinOneNameComponent) {
  EXPECT_TRUE(tp_pattern_matches("h*.attn.q", "h0.attn.q"));
  EXPECT_TRUE(tp_pattern_matches("h*.attn.q", "h12.attn.q"));
  EXPECT_FALSE(tp_pattern_matches("h*.attn.q", "h0.attn.qk"));
  EXPECT_FALSE(tp_pattern_matches("h*.q", "h0.attn.q"));  // '*' does not cross a '.'
  EXPECT_TRUE(tp_pattern_matches("*", "wte"));
  EXPECT_FALSE(tp_pattern_matches("*", "h0.mlp"));
  EXPECT_TRUE(tp_pattern_matches("layers.*.mlp.*", "layers.3.mlp.fc"));
  EXPECT_FALSE(tp_pattern_matches("wte", "wpe"));
}

// Pure tier: environment parsing for every launcher dtrain recognises, and its error messages.
#include <gtest/gtest.h>

#include <malloc.h>

#include <cstdlib>
#include <limits>

#include "core/env.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"

using namespace dtrain;

namespace {

std::string error_of(const EnvMap& env) {
  try {
    parse_rank_env(env);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Env, NoLauncherIsASingleProcess) {
  RankInfo i = parse_rank_env({});
  EXPECT_EQ(i.launcher, Launcher::kNone);
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world_size, 1);
}

TEST(Env, Torchrun) {
  RankInfo i = parse_rank_env({{"RANK", "5"},
                               {"WORLD_SIZE", "8"},
                               {"LOCAL_RANK", "1"},
                               {"LOCAL_WORLD_SIZE", "4"},
                               {"MASTER_ADDR", "node0"},
                               {"MASTER_PORT", "29500"}});
  EXPECT_EQ(i.launcher, Launcher::kTorchrun);
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 4);
  EXPECT_EQ(i.master_addr, "node0");
  EXPECT_EQ(i.master_port, 29500);
}

TEST(Env, Mpirun) {
  RankInfo i = parse_rank_env({{"OMPI_COMM_WORLD_RANK", "2"},
                               {"OMPI_COMM_WORLD_SIZE", "3"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(i.launcher, Launcher::kMpirun);
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.world_size, 3);
  EXPECT_TRUE(i.master_addr.empty());
}

TEST(Env, Slurm) {
  RankInfo i = parse_rank_env(
      {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(i.launcher, Launcher::kSlurm);
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 2);
}

TEST(Env, TorchrunWinsOverMpirun) {
  RankInfo i = parse_rank_env(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(i.launcher, Launcher::kTorchrun);
}

TEST(Env, Errors) {
  EXPECT_NE(error_of({{"RANK", "1"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 is out of range [0, 3]"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}}).find("RANK='x' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("MASTER_PORT=70000 is out of range [0, 65535]"),
            std::string::npos);
}

TEST(Env, Timeout) {
  EXPECT_EQ(default_timeout({}).count(), 300000);
  EXPECT_EQ(default_timeout({{"DTRAIN_TIMEOUT", "2.5"}}).count(), 2500);
  EXPECT_THROW(default_timeout({{"DTRAIN_TIMEOUT", "-1"}}), ValueError);
  EXPECT_THROW(default_timeout({{"DTRAIN_TIMEOUT", "abc"}}), ValueError);
}

// Yes/no variables (DTRAIN_DTENSOR_STRICT, DTRAIN_DTENSOR_CHECK): the usual spellings, and a clear error for
// the rest instead of a silent "no".
TEST(Env, Bool) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "On"})
    EXPECT_TRUE(env_bool({{"X", yes}}, "X", false)) << yes;
  for (const char* no : {"0", "false", "no", "off", ""}) EXPECT_FALSE(env_bool({{"X", no}}, "X", true)) << no;
  EXPECT_TRUE(env_bool({}, "X", true));
  try {
    env_bool({{"DTRAIN_DTENSOR_CHECK", "maybe"}}, "DTRAIN_DTENSOR_CHECK", false);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_DTENSOR_CHECK='maybe' is not a yes/no value"),
              std::string::npos)
        << e.what();
  }
}

// DTRAIN_LOG_LEVEL: a bad value is an error naming the allowed ones (it once silently became info).
TEST(Env, LogLevel) {
  EXPECT_EQ(log_level_from_env({}), LogLevel::kInfo);
  EXPECT_EQ(log_level_from_env({{"DTRAIN_LOG_LEVEL", "debug"}}), LogLevel::kDebug);
  EXPECT_EQ(log_level_from_env({{"DTRAIN_LOG_LEVEL", "error"}}), LogLevel::kError);
  try {
    log_level_from_env({{"DTRAIN_LOG_LEVEL", "verbose"}});
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'verbose' is not one of debug, info, warn, error"),
              std::string::npos)
        << e.what();
  }
}

// Durations: not finite, too long for a deadline, or rounding to 0 ms are errors (1e13 s once overflowed, and
// 0.0001 s became a 0 ms timeout).
TEST(Env, SecondsAreBounded) {
  EXPECT_EQ(env_seconds({{"DTRAIN_TIMEOUT", "2.5"}}, "DTRAIN_TIMEOUT", std::chrono::milliseconds(1)).count(),
            2500);
  for (const char* bad : {"1e13", "0.0001", "inf", "nan", "-3", "0", "ten"}) {
    EXPECT_THROW(env_seconds({{"DTRAIN_TIMEOUT", bad}}, "DTRAIN_TIMEOUT", std::chrono::milliseconds(1)),
                 ValueError)
        << bad;
  }
  EXPECT_EQ(checked_seconds("--stop-grace", 0, true).count(), 0);
  EXPECT_THROW(checked_seconds("--stop-grace", std::numeric_limits<double>::infinity(), true), ValueError);
}

}  // namespace

namespace {

// Blocks glibc holds in mmap'd chunks while a `bytes` block is live, beyond those held before.
int mmapped_blocks_while_live(size_t bytes) {
  const size_t before = mallinfo2().hblks;
  void* p = std::malloc(bytes);
  asm volatile("" : : "g"(p) : "memory");  // (the compiler may not drop the block)
  const size_t during = mallinfo2().hblks;
  std::free(p);
  return static_cast<int>(during - before);
}

}  // namespace

TEST(Env, KeepFreedHeapTakesLargeBlocksFromTheHeapUnlessTheUserChoseOtherwise) {
  try {
    keep_freed_heap({{"DTRAIN_MALLOC", "jemalloc"}});
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_MALLOC='jemalloc'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'system'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(keep_freed_heap({{"DTRAIN_MALLOC", "system"}}));
  EXPECT_FALSE(keep_freed_heap({{"MALLOC_TRIM_THRESHOLD_", "0"}}));
  // glibc as it starts: a 16 MiB block is its own mapping (its threshold starts at 128 KiB)
  EXPECT_EQ(mmapped_blocks_while_live(16 << 20), 1);
  EXPECT_FALSE(freed_heap_kept());
  EXPECT_TRUE(keep_freed_heap({}));
  EXPECT_TRUE(freed_heap_kept());
  EXPECT_EQ(mmapped_blocks_while_live(16 << 20), 0);
  // (above 32 MiB and beyond the heap's free top: still its own mapping, given back when freed)
  EXPECT_EQ(mmapped_blocks_while_live(size_t{256} << 20), 1);
}

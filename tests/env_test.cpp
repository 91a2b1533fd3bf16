// Pure tier: environment parsing for every launcher dtrain recognises, and its error messages.
#include <gtest/gtest.h>

#include "core/env.h"
#include "core/error.h"

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

}  // namespace

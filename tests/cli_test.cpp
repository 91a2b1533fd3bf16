// Pure tier: parsing of `dtrain run` and `dtrain bench comm` command lines.
#include <gtest/gtest.h>

#include "apps/dtrain/cmd_bench.h"
#include "apps/dtrain/cmd_run.h"
#include "core/error.h"
#include "core/units.h"

using namespace dtrain;

namespace {

struct Cli {
  CLI::App app{"dtrain"};
  launch::LaunchOptions run;
  apps::BenchCommOptions bench;
  CLI::App* run_cmd;
  CLI::App* bench_cmd;
  Cli() {
    app.require_subcommand(1);
    run_cmd = apps::add_run_command(app, run);
    bench_cmd = apps::add_bench_command(app, bench);
  }
  void parse(std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());  // CLI11 takes the vector form reversed
    app.parse(args);
  }
};

TEST(Cli, RunTakesTheCommandVerbatim) {
  Cli c;
  c.parse({"run", "-n", "3", "--backend", "mpi", "--max-restarts", "2", "--", "prog", "-n", "5", "--lr=3"});
  EXPECT_TRUE(c.run_cmd->parsed());
  EXPECT_EQ(c.run.nproc, 3);
  EXPECT_EQ(c.run.backend, "mpi");
  EXPECT_EQ(c.run.max_restarts, 2);
  EXPECT_EQ(c.run.command, (std::vector<std::string>{"prog", "-n", "5", "--lr=3"}));
}

TEST(Cli, RunWithoutDoubleDashAndMultiNodeFlags) {
  Cli c;
  c.parse({"run", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
           "--master-port", "29500", "prog", "arg"});
  EXPECT_EQ(c.run.nnodes, 2);
  EXPECT_EQ(c.run.node_rank, 1);
  EXPECT_EQ(c.run.master_addr, "10.1.2.3");
  EXPECT_EQ(c.run.master_port, 29500);
  EXPECT_EQ(c.run.command, (std::vector<std::string>{"prog", "arg"}));
}

TEST(Cli, RunRejectsAnUnknownBackend) {
  Cli c;
  EXPECT_THROW(c.parse({"run", "--backend", "tcp", "--", "prog"}), CLI::ValidationError);
}

TEST(Cli, BenchComm) {
  Cli c;
  c.parse({"bench", "comm", "--ops", "all_reduce,broadcast", "--min-bytes", "4K", "--max-bytes", "1M",
           "--json", "--dtype", "bfloat16"});
  EXPECT_TRUE(c.bench_cmd->parsed());
  EXPECT_EQ(c.bench.sweep.ops, (std::vector<std::string>{"all_reduce", "broadcast"}));
  EXPECT_EQ(c.bench.sweep.min_bytes, 4096);
  EXPECT_EQ(c.bench.sweep.max_bytes, 1 << 20);
  EXPECT_TRUE(c.bench.json);
  EXPECT_EQ(c.bench.sweep.dtype, "bfloat16");
}

TEST(Cli, BenchSizesAreChecked) {
  EXPECT_EQ(parse_bytes("bench comm: size", "64M"), 64 << 20);
  EXPECT_EQ(parse_bytes("bench comm: size", "4096"), 4096);
  try {
    parse_bytes("bench comm: size", "12X");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("bench comm: size: '12X' is not a size"), std::string::npos);
  }
  EXPECT_THROW(parse_bytes("bench comm: size", "-5"), ValueError);
}

}  // namespace

// Process tier, the `dtrain` command: bad input, `dtrain train` at 1 and 2 ranks, the main job at reduced
// size, two launchers, the example DeepSpeed config and the timeline.
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

// Bad input to the command: a clear error naming the value and exit code 2, never a crash (SIGFPE), a silent
// acceptance, an overflow or a read without end; a mesh of many axes answers quickly.
TEST(BadInput, ClearErrorsNotCrashes) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::string out = (dir / "out.txt").string();
  const std::vector<std::pair<std::string, std::string>> cases{
      {"explain --mesh 0 --shape 4,4 --from 'S(0)' --to R", "--mesh '0' is not a comma-separated list"},
      {"explain --mesh 1000000000,1000000000 --shape 4,4 --from 'S(0),R' --to R,R",
       "more than 16777216 ranks"},
      {"explain --mesh 2 --shape 0,4 --from 'S(0)' --to R", "--shape '0,4' is not"},
      {"explain --mesh 2 --shape 4611686018427387904,4 --from 'S(0)' --to R", "more than 2^56"},
      {"frobnicate", "'frobnicate' is not a dtrain command"},
      {"run --stop-grace inf -n 1 -- true", "--stop-grace = inf s is not"},
      {"bench comm --min-bytes 1e30", "more than 1 TiB"},
      {"train --log-every 0", "--log-every 0: log.every = 0 is out of range; it must be an integer from 1"},
      {"train --batch 100000000",
       "--batch 100000000: train.batch = 100000000 is out of range; it must be an "
       "integer from 1 to 1048576"},
      {"train --batch 100000 --seq 100000", "more than 2^30 tokens"},
      {"train --data /dev/zero", "'/dev/zero' is not a regular file"},
  };
  for (const auto& [args, needle] : cases) {
    std::string cmd = std::string(DTRAIN_BINARY) + " " + args + " > " + out + " 2>&1";
    int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << args << ": " << read_file(out);
    EXPECT_NE(read_file(out).find(needle), std::string::npos) << args << ": " << read_file(out);
  }
  for (const std::string t : {"1e13", "0.0001"}) {
    std::string cmd =
        "DTRAIN_TIMEOUT=" + t + " " + std::string(DTRAIN_BINARY) + " train --steps 1 > " + out + " 2>&1";
    int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << t << ": " << read_file(out);
    EXPECT_NE(read_file(out).find("DTRAIN_TIMEOUT = " + t.substr(0, 1)), std::string::npos) << read_file(out);
  }
  // 8 axes: the planner's search is bounded (it took minutes), and explain says it took the naive route.
  auto t0 = std::chrono::steady_clock::now();
  std::string cmd = std::string(DTRAIN_BINARY) +
                    " explain --mesh 2,2,2,2,2,2,2,2 --shape 16,16 --from 'S(0),R,R,R,R,R,R,R' "
                    "--to 'R,R,R,R,R,R,R,S(1)' > " +
                    out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(read_file(out).find("the search stopped after"), std::string::npos) << read_file(out);
  fs::remove_all(dir);
}

// `dtrain train` (the main job) on 1 and 2 ranks: the first step's loss is the same (same weights, same
// batch, split over the ranks), the loss falls, and the run reports its validation loss and communication.
TEST(Train, GPTOnTextAtOneAndTwoRanks) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::map<int, std::string> logs;
  for (int n : {1, 2}) {
    std::string out = (dir / ("train" + std::to_string(n) + ".txt")).string();
    std::string cmd =
        std::string(DTRAIN_BINARY) + " run -n " + std::to_string(n) + " -- " + DTRAIN_BINARY +
        " train --steps 30 --log-every 30 --layers 1 --width 32 --heads 2 --seq 32 --batch 6 > " + out +
        " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
    logs[n] = read_file(out);
  }
  auto loss_at = [](const std::string& log, const std::string& step) {
    auto at = log.find("step " + step + "  loss ");
    return at == std::string::npos ? std::string() : log.substr(at + step.size() + 12, 6);
  };
  std::string first = loss_at(logs[1], "    1");
  ASSERT_FALSE(first.empty()) << logs[1];
  EXPECT_EQ(loss_at(logs[2], "    1"), first) << logs[2];
  for (auto& [n, log] : logs) {
    std::string last = loss_at(log, "   30");
    ASSERT_FALSE(last.empty()) << log;
    EXPECT_LT(std::stod(last), std::stod(first) - 1.0) << log;  // from ln(256) = 5.5 towards byte statistics
    EXPECT_NE(log.find("validation loss"), std::string::npos) << log;
  }
  EXPECT_NE(logs[2].find("all_reduce"), std::string::npos) << logs[2];
  fs::remove_all(dir);
}

// The main job (scripts/main.sh) at reduced size: 2 ranks over OpenMPI with the script's own defaults, but
// 400 steps instead of 5000 (about 30 s): the validation loss falls below the corpus's byte unigram entropy
// (3.32 nats per byte, what a model that uses no context reaches), and the run leaves its metrics, loss
// curve, sample and checkpoint where it says.
TEST(MainJob, AtReducedSizeLearnsPastTheUnigramEntropy) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  const fs::path run = dir / "run", out = dir / "out.txt";
  const std::string bin_dir = fs::path(DTRAIN_BINARY).parent_path().string();
  std::string cmd = "DTRAIN_SKIP_SETUP=1 DTRAIN_BIN_DIR=" + bin_dir + " DTRAIN_RUN_DIR=" + run.string() +
                    " bash " + DTRAIN_SOURCE_DIR +
                    "/scripts/main.sh --steps 400 --warmup 40 --save-every 0 > " + out.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out.string());
  const std::string text = read_file(out.string());
  const auto at = text.find("main job: validation loss ");
  ASSERT_NE(at, std::string::npos) << text;
  const double val = std::stod(text.substr(at + 26, 8));
  EXPECT_LT(val, 3.32) << text;
  EXPECT_GT(val, 0.5) << text;  // a byte-level model of this size on this text cannot do better
  // the metrics: one object per step, with the learning rate of the schedule
  std::ifstream metrics(run / "metrics.jsonl");
  std::string line, last;
  int lines = 0;
  while (std::getline(metrics, line)) {
    if (line.find("\"val_loss\"") != std::string::npos) continue;  // the evaluations' lines
    ++lines, last = line;
  }
  EXPECT_EQ(lines, 400);
  EXPECT_NE(last.find("\"step\":400"), std::string::npos) << last;
  EXPECT_NE(last.find("\"lr\":0.0006"), std::string::npos) << last;  // the cosine's floor, lr / 10
  // the loss curve is a PNG, the sample continues the prompt, the checkpoint is the last step
  const std::string png = read_file((run / "loss.png").string());
  EXPECT_GT(png.size(), 10000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  const std::string sample = read_file((run / "sample.txt").string());
  EXPECT_EQ(sample.rfind("The ", 0), 0u) << sample;
  EXPECT_GE(sample.size(), 400u) << sample;
  EXPECT_EQ(read_file((run / "checkpoints" / "latest").string()).rfind("step-00000400", 0), 0u);
  for (const char* what : {"metrics:", "loss curve:", "checkpoints:", "sample of the trained model:"}) {
    EXPECT_NE(text.find(what), std::string::npos) << what << "\n" << text;
  }
  // a second run into the same folder is refused, and nothing of the first is touched
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_file(out.string()).find("already holds a run"), std::string::npos)
      << read_file(out.string());
  EXPECT_EQ(read_file((run / "sample.txt").string()), sample);
  fs::remove_all(dir);
}

// Two nodes on 127.0.0.1: `dtrain run --nnodes 2 --node-rank 1` as a separate process, node 0 in this one,
// the same flags on both; the 2x2 mesh then spans both nodes (its "dp" groups cross them).
TEST(MultiNode, GlooMeshAcrossTwoLaunchers) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  std::string port = std::to_string(free_port());
  setenv("DTRAIN_TIMEOUT", "60", 1);
  setenv("DTRAIN_JOB_SECRET", "two-launchers-share-this", 1);  // several nodes: the user hands out the secret
  std::vector<std::string> args{DTRAIN_BINARY,
                                "run",
                                "-n",
                                "2",
                                "--nnodes",
                                "2",
                                "--node-rank",
                                "1",
                                "--master-addr",
                                "127.0.0.1",
                                "--master-port",
                                port,
                                "--",
                                DTRAIN_COMM_WORKER,
                                "mesh",
                                dir.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t node1 = 0;
  ASSERT_EQ(posix_spawn(&node1, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  dtrain::launch::LaunchOptions o;
  o.nproc = 2;
  o.nnodes = 2;
  o.node_rank = 0;
  o.master_addr = "127.0.0.1";
  o.master_port = std::stoi(port);
  o.command = {DTRAIN_COMM_WORKER, "mesh", dir.string()};
  int rc0 = dtrain::launch::run(o);
  int status = 0;
  waitpid(node1, &status, 0);
  unsetenv("DTRAIN_JOB_SECRET");
  EXPECT_EQ(rc0, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "node 1 status " << status;
  expect_all_ok(Job{rc0, dir, 0}, 4);
}

}  // namespace

namespace {

// `dtrain run -n 2 -- dtrain train ARGS` (a small GPT), its output, killed past 180 s.
dtrain::test::Finished train_small(const std::vector<std::string>& args, const fs::path& out) {
  std::vector<std::string> argv{DTRAIN_BINARY, "run", "-n", "2", "--", DTRAIN_BINARY, "train"};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* a : {"--layers", "2", "--width", "32", "--heads", "4", "--seq", "16", "--steps", "12",
                        "--log-every", "1"}) {
    argv.push_back(a);
  }
  return dtrain::test::finish(dtrain::test::spawn(argv, {{"OMP_NUM_THREADS", "1"}}, out),
                              std::chrono::seconds(180));
}

std::vector<std::string> loss_lines(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("step ");
    if (at != std::string::npos && line.find(" loss ", at) != std::string::npos &&
        line.find("validation") == std::string::npos) {
      out.push_back(line.substr(at, line.find("  lr ", at) - at));  // (without the rate, which varies)
    }
  }
  return out;
}

}  // namespace

// The example DeepSpeed config (examples/deepspeed/ds_config.json: DeepSpeed's documented blocks, ZeRO-2,
// fp16 with dynamic loss scaling, Adam, WarmupLR, clipping, micro-batch 4 x accumulation 2 x 2 ranks) runs
// unchanged on 2 ranks, and gives the same losses, step for step, as the same run asked for by dtrain's own
// flags; its effective config is printed and saved beside the checkpoints, and reads back as a TOML config.
TEST(DeepSpeedConfig, TheExampleRunsUnchangedAndEqualsTheSameRunByFlags) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  auto ds = train_small({std::string(DTRAIN_SOURCE_DIR) + "/examples/deepspeed/ds_config.json", "--save",
                         (dir / "ckpt").string()},
                        dir / "ds.txt");
  ASSERT_EQ(ds.exit_code(), 0) << ds.output;
  for (const char* what : {"strategy zero2 (DeepSpeed ZeRO stage 2)", "effective config (saved to",
                           "note: batch 16 = micro-batch 4 x accumulation 2 x 2 data-parallel ranks",
                           "note: strategy deepspeed, ZeRO stage 2: zero2", "mixed precision fp16"}) {
    EXPECT_NE(ds.output.find(what), std::string::npos) << what << "\n" << ds.output;
  }
  auto flags = train_small({"--strategy",
                            "zero2",
                            "--precision",
                            "fp16",
                            "--batch",
                            "16",
                            "--accumulation",
                            "2",
                            "--lr",
                            "1e-3",
                            "--beta1",
                            "0.8",
                            "--eps",
                            "1e-8",
                            "--weight-decay",
                            "3e-7",
                            "--warmup",
                            "1000",
                            "--warmup-type",
                            "log",
                            "--warmup-min-lr",
                            "0",
                            "--clip",
                            "1",
                            "--bucket-bytes",
                            "1000000000"},
                           dir / "flags.txt");
  ASSERT_EQ(flags.exit_code(), 0) << flags.output;
  const auto a = loss_lines(ds.output), b = loss_lines(flags.output);
  ASSERT_EQ(a.size(), 12u) << ds.output;
  EXPECT_EQ(a, b) << ds.output << "\n" << flags.output;
  // the saved effective config runs the same training again
  auto again = train_small({(dir / "ckpt" / "config.toml").string(), "--set", "checkpoint.dir=\"\""},
                           dir / "again.txt");
  ASSERT_EQ(again.exit_code(), 0) << again.output;
  EXPECT_EQ(loss_lines(again.output), a) << again.output;
  fs::remove_all(dir);
}

// --timeline: one Chrome trace of both ranks (a process per rank; forward, backward and optimizer on the
// compute thread, each collective on the communication thread, within the run's time); --metrics: each step's
// resident memory of every rank and the time blocked on communication.
TEST(TrainTimeline, ChromeTraceOfEveryRanksComputeAndCollectivesAndMetricsPerRank) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  const fs::path trace = dir / "trace.json", metrics = dir / "m.jsonl";
  auto f = train_small({"--strategy", "zero2", "--timeline", trace.string(), "--metrics", metrics.string()},
                       dir / "out.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  EXPECT_NE(f.output.find("timeline of "), std::string::npos) << f.output;
  const auto doc = nlohmann::json::parse(read_file(trace.string()));
  std::map<std::pair<int, std::string>, int> count;  // (rank, name) -> events
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<int64_t>(), 0);
    const int rank = e.at("pid").get<int>();
    const std::string name = e.at("name");
    EXPECT_EQ(e.at("tid").get<int>(), e.at("cat") == "comm" ? 1 : 0) << name;
    ++count[{rank, name}];
  }
  for (int rank : {0, 1}) {
    EXPECT_EQ((count[{rank, "step"}]), 12) << rank;
    EXPECT_EQ((count[{rank, "forward"}]), 12) << rank;
    EXPECT_EQ((count[{rank, "backward"}]), 12) << rank;
    EXPECT_EQ((count[{rank, "optimizer"}]), 12) << rank;
    EXPECT_GE((count[{rank, "reduce_scatter"}]), 12) << rank;  // ZeRO-2's gradients
    EXPECT_GE((count[{rank, "all_gather"}]), 12) << rank;      // and its updated shards
  }
  std::ifstream in(metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++lines;
    ASSERT_EQ(j.at("rss_mib").size(), 2u) << line;
    for (const auto& m : j.at("rss_mib")) EXPECT_GT(m.get<double>(), 10) << line;
    EXPECT_GE(j.at("comm_wait_s").get<double>(), 0) << line;
  }
  EXPECT_EQ(lines, 12);
  fs::remove_all(dir);
}

namespace {

// `dtrain run -n N -- dtrain train ARGS` with one intra-op thread a rank, killed past 300 s.
dtrain::test::Finished train_ranks(int n, const std::vector<std::string>& args, const fs::path& out) {
  std::vector<std::string> argv{DTRAIN_BINARY, "run", "-n", std::to_string(n), "--", DTRAIN_BINARY, "train"};
  argv.insert(argv.end(), args.begin(), args.end());
  return dtrain::test::finish(dtrain::test::spawn(argv, {{"OMP_NUM_THREADS", "1"}}, out),
                              std::chrono::seconds(300));
}

// Each step's loss from a --metrics file.
std::vector<double> metric_losses(const fs::path& file) {
  std::vector<double> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace

// --strategy solve: the GPT's step recorded, solved and followed op by op on 2 and 3 ranks, with clipping;
// every step's loss equal to the same run on one process (plain data parallel of one rank). Under a budget
// below the replicated step's peak the plan shards and still matches; a budget no plan fits is an error
// naming it, and accumulation (not built yet) is refused.
TEST(SolveStrategy, TrainsTheGptByTheSolvedPlanAsOneProcessDoes) {
  char tmpl[] = "/tmp/dtrain_comm_test_XXXXXX";
  fs::path dir = mkdtemp(tmpl);
  const std::vector<std::string> common{"--layers", "1",  "--width",     "32", "--heads",        "2",
                                        "--seq",    "16", "--batch",     "6",  "--clip",         "0.5",
                                        "--steps",  "8",  "--log-every", "1",  "--eval-batches", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  auto ref =
      train_ranks(1, with({"--strategy", "dp", "--metrics", (dir / "ref.jsonl").string()}), dir / "ref.txt");
  ASSERT_EQ(ref.exit_code(), 0) << ref.output;
  const std::vector<double> want = metric_losses(dir / "ref.jsonl");
  ASSERT_EQ(want.size(), 8u) << ref.output;
  auto expect_same = [&](const fs::path& metrics, const std::string& output) {
    const std::vector<double> got = metric_losses(metrics);
    ASSERT_EQ(got.size(), want.size()) << output;
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(got[s], want[s], 2e-5) << "step " << s + 1 << "\n" << output;
  };
  double replicated_mib = 0;
  for (int n : {2, 3}) {
    const fs::path m = dir / ("solve" + std::to_string(n) + ".jsonl");
    auto run = train_ranks(n, with({"--strategy", "solve", "--metrics", m.string()}), dir / "solve.txt");
    ASSERT_EQ(run.exit_code(), 0) << run.output;
    EXPECT_NE(run.output.find("strategy solve on a " + std::to_string(n) + " mesh"), std::string::npos)
        << run.output;
    expect_same(m, run.output);
    const auto at = run.output.find("(replicated: ");
    ASSERT_NE(at, std::string::npos) << run.output;
    replicated_mib = std::stod(run.output.substr(at + 13));
  }
  // Under 70% of the replicated peak: the plan must shard.
  const fs::path m = dir / "budget.jsonl";
  auto tight = train_ranks(
      2,
      with({"--strategy", "solve", "--solve-budget",
            std::to_string(static_cast<int64_t>(0.7 * replicated_mib * 1048576)), "--metrics", m.string()}),
      dir / "budget.txt");
  ASSERT_EQ(tight.exit_code(), 0) << tight.output;
  expect_same(m, tight.output);
  auto none = train_ranks(2, with({"--strategy", "solve", "--solve-budget", "1000"}), dir / "none.txt");
  EXPECT_NE(none.exit_code(), 0) << none.output;
  EXPECT_NE(none.output.find("budget"), std::string::npos) << none.output;
  auto acc = train_ranks(2, with({"--strategy", "solve", "--accumulation", "2"}), dir / "acc.txt");
  EXPECT_NE(acc.exit_code(), 0) << acc.output;
  EXPECT_NE(acc.output.find("--accumulation 2 under --strategy solve is not built yet"), std::string::npos)
      << acc.output;
  fs::remove_all(dir);
}

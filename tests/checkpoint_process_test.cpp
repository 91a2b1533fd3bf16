// Checkpoints on real ranks (issue 13), through `dtrain train` as a user runs it: exact resume, the reshard
// matrix (save at 1, 2, 4 ranks under one strategy, load at 1-4 under another), a rank killed at scripted
// points of a save, damaged checkpoints failing on every rank, and the export round trip through Python.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "tests/process_job.h"

using namespace dtrain;
using namespace dtrain::test;

namespace {

// A small GPT every layout can take: 4 heads (tp up to 4, uneven at 3), batch 12 (any data-parallel degree).
const std::vector<std::string> kModel{"--layers", "2",  "--width", "32", "--heads",     "4",
                                      "--seq",    "16", "--batch", "12", "--log-every", "1"};

// `dtrain run -n n -- dtrain train <model> args`, killed past 180 s (a hang fails the test, never the suite).
// `launch` adds flags of `dtrain run`.
Finished train(int n, const std::vector<std::string>& args, const fs::path& out,
               const std::vector<std::pair<std::string, std::string>>& env = {},
               const std::vector<std::string>& launch = {}) {
  std::vector<std::string> argv{DTRAIN_BINARY, "run", "-n", std::to_string(n)};
  argv.insert(argv.end(), launch.begin(), launch.end());
  for (const char* a : {"--", DTRAIN_BINARY, "train"}) argv.push_back(a);
  for (size_t i = 0; i + 1 < kModel.size(); i += 2) {  // (a flag in `args` replaces the model's)
    if (std::find(args.begin(), args.end(), kModel[i]) != args.end()) continue;
    argv.push_back(kModel[i]);
    argv.push_back(kModel[i + 1]);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  // (OMP_NUM_THREADS alone, as users set it: the launcher gives MKL cores / ranks threads)
  std::vector<std::pair<std::string, std::string>> all{{"OMP_NUM_THREADS", "1"}};
  all.insert(all.end(), env.begin(), env.end());
  return finish(spawn(argv, all, out), std::chrono::seconds(180));
}

Finished run(const std::vector<std::string>& argv, const fs::path& out) {
  return finish(spawn(argv, {}, out), std::chrono::seconds(120));
}

// "strategy" or "strategy xK" (tensor parallel K) as `dtrain train` flags.
std::vector<std::string> layout_flags(const std::string& layout) {
  if (layout == "hsdp") return {"--strategy", "hsdp", "--shard-size", "2"};
  const auto x = layout.find('x');
  if (x == std::string::npos) return {"--strategy", layout};
  const std::string strategy = layout.substr(0, x);
  return {"--strategy", strategy.empty() ? "dp" : strategy, "--tp", layout.substr(x + 1)};
}

std::map<int64_t, double> losses(const fs::path& metrics) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;  // a validation line
    out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// Every tensor of two checkpoints (keys starting with one of `prefixes`), read whole: equal bit for bit, or
// within `rel` of each other by the norm of the difference.
void expect_same_state(const std::string& a, const std::string& b, const std::vector<std::string>& prefixes,
                       double rel, const std::string& what) {
  const auto ma = checkpoint::read_manifest(a), mb = checkpoint::read_manifest(b);
  int compared = 0;
  for (const auto& [key, t] : ma.tensors) {
    if (std::none_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return key.rfind(p, 0) == 0; })) {
      continue;
    }
    ASSERT_TRUE(mb.tensors.count(key)) << what << ": " << b << " lacks " << key;
    const checkpoint::Piece p{key, at::empty({0}), checkpoint::Region::whole(t.shape), "", false, true};
    const at::Tensor x = checkpoint::read_pieces(a, ma, {p})[0];
    const at::Tensor y = checkpoint::read_pieces(b, mb, {p})[0];
    if (rel == 0) {
      EXPECT_TRUE(at::equal(x, y)) << what << ": " << key << " differs, largest difference "
                                   << (x.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>();
    } else {
      const double diff = (x.to(at::kDouble) - y.to(at::kDouble)).norm().item<double>();
      const double norm = x.to(at::kDouble).norm().item<double>();
      EXPECT_LE(diff, rel * norm + 1e-12) << what << ": " << key;
    }
    ++compared;
  }
  EXPECT_GT(compared, 20) << what;
}

std::string read(const fs::path& p) { return read_file(p); }

}  // namespace

// 2N steps uninterrupted against N steps, a save, new processes, a load and N steps: the same losses and the
// same final state, bit for bit (under fp16, the masters and the loss scaler's state too).
TEST(CheckpointResume, ExactUnderDpZero3AndTensorParallel) {
  const fs::path dir = temp_dir();
  // (zero2 under fp16: the fp32 masters and the loss scaler resume too)
  for (const std::string layout : {"dp", "zero3", "x2", "zero2"}) {
    const fs::path u = dir / (layout + "_u"), r = dir / (layout + "_r");
    auto flags = layout_flags(layout);
    if (layout == "zero2") flags.insert(flags.end(), {"--precision", "fp16"});
    auto args = flags;
    for (auto s : {"--steps", "6", "--save-every", "3", "--save"}) args.push_back(s);
    args.push_back(u.string());
    args.push_back("--metrics");
    args.push_back((dir / (layout + "_u.jsonl")).string());
    Finished f = train(2, args, dir / "u.txt");
    ASSERT_EQ(f.exit_code(), 0) << f.output;
    args = flags;
    for (auto s : {"--steps", "6", "--resume"}) args.push_back(s);
    args.push_back((u / "step-00000003").string());
    args.push_back("--save");
    args.push_back(r.string());
    args.push_back("--metrics");
    args.push_back((dir / (layout + "_r.jsonl")).string());
    f = train(2, args, dir / "r.txt");
    ASSERT_EQ(f.exit_code(), 0) << f.output;
    EXPECT_NE(f.output.find("resumed from"), std::string::npos) << f.output;
    EXPECT_NE(f.output.find("random state restored"), std::string::npos) << f.output;
    const auto lu = losses(dir / (layout + "_u.jsonl")), lr = losses(dir / (layout + "_r.jsonl"));
    ASSERT_EQ(lr.size(), 3u) << layout;
    for (int64_t s = 4; s <= 6; ++s) EXPECT_EQ(lr.at(s), lu.at(s)) << layout << " step " << s;
    expect_same_state((u / "step-00000006").string(), (r / "step-00000006").string(),
                      {"model/", "master/", "optim/", "buffer/", "rng/"}, 0, layout + " resumed");
    if (layout == "zero2") {
      const auto m = checkpoint::read_manifest((r / "step-00000006").string());
      EXPECT_EQ(m.meta["scaler"]["steps"], 6) << m.meta.dump();
      EXPECT_TRUE(m.tensors.count("master/wte.weight"));
    }
  }
  fs::remove_all(dir);
}

// The reshard matrix: a run saved at `n` ranks under each layout is loaded at 1, 2, 3 and 4 ranks under
// another layout. Loaded and saved again at once (a conversion), every parameter and optimizer state equals
// the saved one bit for bit; its next step's loss equals the saving run's own next step within 1e-6.
class CheckpointReshard : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointReshard, LoadsUnderEveryWorldSizeAndAnotherStrategy) {
  const int n = GetParam();
  const std::map<int, std::vector<std::string>> saves{{1, {"dp", "zero3"}},
                                                      {2, {"dp", "zero1", "zero3", "x2"}},
                                                      {4, {"dp", "zero1", "zero3", "x4", "zero3x2", "hsdp"}}};
  // the layouts a load may use at each world size, tried in turn (another than the saving one)
  const std::map<int, std::vector<std::string>> loads{{1, {"dp", "zero3"}},
                                                      {2, {"zero3", "x2", "dp", "zero1"}},
                                                      {3, {"zero1", "x3", "zero3", "dp"}},
                                                      {4, {"zero3x2", "x4", "zero1", "hsdp", "dp", "zero3"}}};
  const fs::path dir = temp_dir();
  int turn = 0;
  for (const auto& saved : saves.at(n)) {
    const fs::path s = dir / ("save_" + saved);
    auto args = layout_flags(saved);
    for (auto a : {"--steps", "4", "--save-every", "3", "--save"}) args.push_back(a);
    args.push_back(s.string());
    args.push_back("--metrics");
    args.push_back((s.string() + ".jsonl"));
    Finished f = train(n, args, dir / "save.txt");
    ASSERT_EQ(f.exit_code(), 0) << f.output;
    const double next_loss = losses(s.string() + ".jsonl").at(4);
    for (int m = 1; m <= 4; ++m) {
      const auto& options = loads.at(m);
      std::string layout = options[turn++ % options.size()];
      if (layout == saved && m == n) layout = options[turn++ % options.size()];
      const std::string what =
          saved + " at " + std::to_string(n) + " -> " + layout + " at " + std::to_string(m);
      const fs::path c = dir / ("conv_" + saved + "_" + std::to_string(m));
      auto conv = layout_flags(layout);
      for (auto a : {"--steps", "3", "--resume"}) conv.push_back(a);
      conv.push_back((s / "step-00000003").string());
      conv.push_back("--save");
      conv.push_back(c.string());
      f = train(m, conv, dir / "conv.txt");
      ASSERT_EQ(f.exit_code(), 0) << what << "\n" << f.output;
      expect_same_state((s / "step-00000003").string(), (c / "step-00000003").string(), {"model/", "optim/"},
                        0, what);
      auto step = layout_flags(layout);
      for (auto a : {"--steps", "4", "--resume"}) step.push_back(a);
      step.push_back((s / "step-00000003").string());
      step.push_back("--metrics");
      step.push_back((dir / "next.jsonl").string());
      f = train(m, step, dir / "next.txt");
      ASSERT_EQ(f.exit_code(), 0) << what << "\n" << f.output;
      const double loss = losses(dir / "next.jsonl").at(4);
      EXPECT_NEAR(loss, next_loss, 1e-6 * std::abs(next_loss)) << what;
      fs::remove_all(c);
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(SavedAt, CheckpointReshard, ::testing::Values(1, 2, 4));

// Under the deterministic mode a reshard is bit for bit: saved at 2 ranks under dp, resumed at 1 rank under
// dp and at 4 under zero3 and dp, the next step's loss and the parameters after it equal the uninterrupted
// run's.
TEST(CheckpointDeterministic, ResumedAtOtherWorldSizesBitForBit) {
  const fs::path dir = temp_dir(), s = dir / "save";
  const std::vector<std::string> det{"--deterministic", "--accumulation", "4", "--batch", "16"};
  auto args = det;
  for (auto a : {"--steps", "4", "--save-every", "3", "--save"}) args.push_back(a);
  args.push_back(s.string());
  args.push_back("--metrics");
  args.push_back((dir / "u.jsonl").string());
  Finished f = train(2, args, dir / "save.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  const double next = losses(dir / "u.jsonl").at(4);
  for (const auto& [n, strategy] :
       std::vector<std::pair<int, std::string>>{{1, "dp"}, {4, "zero3"}, {4, "dp"}}) {
    const fs::path r = dir / ("r" + std::to_string(n) + strategy);
    auto resume = det;
    for (auto a : {"--steps", "4", "--strategy"}) resume.push_back(a);
    resume.push_back(strategy);
    resume.push_back("--resume");
    resume.push_back((s / "step-00000003").string());
    resume.push_back("--save");
    resume.push_back(r.string());
    resume.push_back("--metrics");
    resume.push_back((dir / "r.jsonl").string());
    f = train(n, resume, dir / "resume.txt");
    ASSERT_EQ(f.exit_code(), 0) << f.output;
    EXPECT_EQ(losses(dir / "r.jsonl").at(4), next) << strategy << " at " << n;
    expect_same_state((s / "step-00000004").string(), (r / "step-00000004").string(), {"model/"}, 0,
                      strategy + " at " + std::to_string(n));
  }
  fs::remove_all(dir);
}

// `dtrain train --deterministic --steps 12` and no other flag (but --save, to read the parameters) gives the
// same parameters bit for bit at 1, 2 and 4 ranks, with no thread variable set: the mode chooses the
// micro-batch count itself and pins the threads (the launcher would give 2 threads at 1 rank, 1 at 2).
TEST(CheckpointDeterministic, DefaultCommandGivesTheSameBitsAtOneTwoAndFourRanks) {
  for (const char* v : {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) unsetenv(v);
  const fs::path dir = temp_dir();
  std::string first, first_digest;
  for (int n : {1, 2, 4}) {
    const fs::path s = dir / ("n" + std::to_string(n));
    Finished f = finish(spawn({DTRAIN_BINARY, "run", "-n", std::to_string(n), "--", DTRAIN_BINARY, "train",
                               "--deterministic", "--steps", "12", "--save", s.string()},
                              {}, dir / "out.txt"),
                        std::chrono::seconds(300));
    ASSERT_EQ(f.exit_code(), 0) << f.output;
    EXPECT_NE(f.output.find("deterministic: accumulation 8 (8 micro-batches of 2 sequences"),
              std::string::npos)
        << f.output;
    const auto at = f.output.find("parameter digest ");
    ASSERT_NE(at, std::string::npos) << f.output;
    const std::string digest = f.output.substr(at + 17, 16);
    if (n == 1) {
      EXPECT_NE(f.output.find("intra-op threads pinned to 1 (were 2)"), std::string::npos) << f.output;
      first = (s / "step-00000012").string();
      first_digest = digest;
      continue;
    }
    EXPECT_EQ(digest, first_digest) << "the digest at " << n << " ranks against 1 rank's";
    expect_same_state(first, (s / "step-00000012").string(), {"model/"}, 0,
                      "parameters at " + std::to_string(n) + " ranks against 1 rank's");
  }
  // A batch the mode cannot cut for 1, 2, 4 and 8 ranks is refused with the sizes that would do.
  Finished f = finish(spawn({DTRAIN_BINARY, "run", "-n", "2", "--", DTRAIN_BINARY, "train", "--deterministic",
                             "--batch", "12", "--steps", "1"},
                            {}, dir / "bad.txt"),
                      std::chrono::seconds(60));
  EXPECT_NE(f.exit_code(), 0);
  EXPECT_NE(
      f.output.find("--batch 12 is not a multiple of 8. Use --batch 8, 16, 24, ... (the nearest: 8 or 16)"),
      std::string::npos)
      << f.output;
  fs::remove_all(dir);
}

// DTRAIN_OP_PROFILE (train/op_profile.h): the ops of steps 3 to the last, not the evaluation after it. One
// layer's six linear layers run as one addmm each (at::linear), so 3 profiled steps hold exactly 18.
TEST(OpProfile, CountsTheStepsAfterTheSecondAndNotTheEvaluation) {
  const fs::path dir = temp_dir();
  const fs::path profile = dir / "ops.json";
  Finished f = finish(spawn({DTRAIN_BINARY, "run", "-n", "1", "--", DTRAIN_BINARY, "train", "--steps", "5",
                             "--layers", "1", "--width", "32", "--heads", "2", "--seq", "16", "--batch", "4"},
                            {{"DTRAIN_OP_PROFILE", profile.string()}}, dir / "out.txt"),
                      std::chrono::seconds(120));
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  auto j = nlohmann::json::parse(read(profile));
  EXPECT_EQ(j["tool"], "dtrain");
  EXPECT_EQ(j["steps"].get<int>(), 3);
  ASSERT_TRUE(j["ops"].contains("aten::addmm")) << j.dump(1);
  EXPECT_EQ(j["ops"]["aten::addmm"]["calls"].get<int>(), 18);
  EXPECT_GT(j["ops"]["aten::addmm"]["self_us"].get<double>(), 0);
  fs::remove_all(dir);
}

// SIGKILL of a rank at scripted points of a save (half-way through its shard file; rank 0 after the manifest,
// before the rename; after the rename, before `latest` moves): the previous checkpoint is `latest`, verifies
// and resumes.
TEST(CheckpointFaults, KillDuringSaveLeavesThePreviousCheckpointLatest) {
  const fs::path dir = temp_dir();
  for (const std::string point : {"1:write", "0:commit", "0:latest"}) {
    const fs::path root = dir / ("kill_" + point.substr(2));
    Finished f = train(2, {"--steps", "4", "--save-every", "2", "--save", root.string()}, dir / "kill.txt",
                       {{"DTRAIN_TEST_KILL_DURING_SAVE", point + ":4"}});
    EXPECT_NE(f.exit_code(), 0) << point << "\n" << f.output;
    EXPECT_FALSE(f.timed_out) << point;
    EXPECT_EQ(read(root / "latest"), "step-00000002\n") << point;
    const std::string latest = checkpoint::resolve(root.string());
    EXPECT_NO_THROW(checkpoint::verify_files(latest, checkpoint::read_manifest(latest))) << point;
    f = train(2, {"--steps", "4", "--resume", root.string(), "--save", root.string()}, dir / "resume.txt");
    EXPECT_EQ(f.exit_code(), 0) << point << "\n" << f.output;
    EXPECT_NE(f.output.find("resumed from " + (root / "step-00000002").string()), std::string::npos)
        << f.output;
    EXPECT_EQ(read(root / "latest"), "step-00000004\n") << point;
    for (const auto& e : fs::directory_iterator(root)) {
      EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
    }
  }
  fs::remove_all(dir);
}

// A damaged checkpoint or another model's: every rank fails with the message naming the file or the tensor,
// promptly (no rank waits for a timeout), and nothing trains.
TEST(CheckpointFaults, DamagedCheckpointsFailOnEveryRank) {
  const fs::path dir = temp_dir(), root = dir / "good";
  Finished f = train(2, {"--steps", "2", "--save", root.string()}, dir / "save.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  const fs::path good = root / "step-00000002";
  struct Case {
    std::string name;
    std::function<void(const fs::path&)> damage;
    std::vector<std::string> flags;
    std::string message;
  };
  const std::string shard = "rank-00001.safetensors";
  auto flip = [&](const fs::path& d, int64_t at) {
    std::fstream s(d / shard, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(at);
    char c;
    s.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    s.seekp(at);
    s.write(&c, 1);
  };
  const std::vector<Case> cases{
      {"flipped",
       [&](const fs::path& d) { flip(d, static_cast<int64_t>(fs::file_size(d / shard)) - 10); },
       {},
       "fail their CRC-32 check"},
      {"truncated",
       [&](const fs::path& d) { fs::resize_file(d / shard, fs::file_size(d / shard) - 7); },
       {},
       "(truncated)"},
      {"missing", [&](const fs::path& d) { fs::remove(d / shard); }, {}, "is missing"},
      {"newer",
       [&](const fs::path& d) {
         std::string m = read(d / "manifest.json");
         m.replace(m.find("\"version\": 1"), 12, "\"version\": 7");
         std::ofstream(d / "manifest.json") << m;
       },
       {},
       "format version 7, newer than the version 1"},
      {"wider",
       [](const fs::path&) {},
       {"--width", "40"},
       "tensor 'model/wte.weight' has shape [256, 32] in"},
      {"deeper", [](const fs::path&) {}, {"--layers", "3"}, "it lacks the model's parameters 'h2."},
  };
  for (const auto& c : cases) {
    const fs::path copy = dir / c.name;
    fs::copy(good, copy, fs::copy_options::recursive);
    c.damage(copy);
    std::vector<std::string> args{"--steps", "4", "--resume", copy.string()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    f = train(2, args, dir / "load.txt");
    EXPECT_NE(f.exit_code(), 0) << c.name << "\n" << f.output;
    EXPECT_LT(f.seconds, 30.0) << c.name;
    // both ranks report it: one as its own error, the other as the first failing rank's
    for (const std::string rank : {"[rank 0]", "[rank 1]"}) {
      bool found = false;
      std::istringstream lines(f.output);
      for (std::string line; std::getline(lines, line);) {
        found |= line.rfind(rank, 0) == 0 && line.find(c.message) != std::string::npos;
      }
      EXPECT_TRUE(found) << c.name << ": " << rank << " does not say '" << c.message << "'\n" << f.output;
    }
    EXPECT_EQ(f.output.find("step     3"), std::string::npos) << c.name << ": trained anyway\n" << f.output;
  }
  fs::remove_all(dir);
}

// Export, read by Python's safetensors and compared with the shard files assembled in numpy; Python's halved
// copy imported at 3 ranks under ZeRO-3 (learning rate 0), saved, exported, and equal to what Python wrote.
TEST(CheckpointExport, RoundTripThroughPython) {
  const fs::path dir = temp_dir(), root = dir / "ckpt";
  Finished f = train(2, {"--steps", "2", "--save", root.string(), "--tp", "2"}, dir / "save.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  f = run({DTRAIN_BINARY, "ckpt", "inspect", root.string()}, dir / "inspect.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  EXPECT_NE(f.output.find("checksums: all 2 files verified"), std::string::npos) << f.output;
  EXPECT_NE(f.output.find("Shard(0) over tp 2"), std::string::npos) << f.output;
  const std::string exported = (dir / "model.safetensors").string(),
                    half = (dir / "half.safetensors").string();
  f = run({DTRAIN_BINARY, "ckpt", "export", root.string(), exported}, dir / "export.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  f = run({DTRAIN_PYTHON, DTRAIN_EXPORT_SCRIPT, "check", (root / "step-00000002").string(), exported, half},
          dir / "py.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  const fs::path again = dir / "again";
  f = train(3,
            {"--strategy", "zero3", "--init-from", half, "--steps", "1", "--lr", "0", "--weight-decay", "0",
             "--save", again.string()},
            dir / "import.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  EXPECT_NE(f.output.find("weights imported from"), std::string::npos) << f.output;
  const std::string exported_again = (dir / "again.safetensors").string();
  f = run({DTRAIN_BINARY, "ckpt", "export", again.string(), exported_again}, dir / "export2.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  f = run({DTRAIN_PYTHON, DTRAIN_EXPORT_SCRIPT, "same", half, exported_again}, dir / "py2.txt");
  EXPECT_EQ(f.exit_code(), 0) << f.output;
  fs::remove_all(dir);
}

// Elastic resume: a rank SIGKILLed mid-run under `dtrain run --max-restarts 1` makes the group restart; the
// restarted ranks resume from the latest checkpoint under --save by themselves and end with the parameters,
// optimizer state and random state of an uninterrupted run, bit for bit, on both backends. `--resume auto`
// with nothing saved yet starts afresh.
TEST(Elastic, RankKilledMidRunRestartsFromTheLatestCheckpointAndEndsAsAnUninterruptedRun) {
  const fs::path dir = temp_dir();
  const std::vector<std::string> common{"--steps", "8", "--save-every", "2", "--strategy", "zero3"};
  auto with_save = [&](const fs::path& root) {
    auto a = common;
    a.push_back("--save");
    a.push_back(root.string());
    return a;
  };
  Finished f = train(2, with_save(dir / "whole"), dir / "whole.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  for (const std::string backend : {"gloo", "mpi"}) {
    const fs::path root = dir / ("killed_" + backend);
    const auto t0 = std::chrono::steady_clock::now();
    f = train(2, with_save(root), dir / "killed.txt", {{"DTRAIN_TEST_KILL_AT_STEP", "1:5"}},
              {"--backend", backend, "--max-restarts", "1"});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(f.exit_code(), 0) << backend << "\n" << f.output;
    EXPECT_LT(secs, 60) << backend << ": the lost rank was noticed late\n" << f.output;
    EXPECT_NE(f.output.find("restarting the group (restart 1 of 1)"), std::string::npos) << f.output;
    EXPECT_NE(
        f.output.find("restart 1 of the group: resuming from the latest checkpoint under " + root.string()),
        std::string::npos)
        << f.output;
    EXPECT_NE(f.output.find("resumed from " + (root / "step-00000004").string()), std::string::npos)
        << f.output;
    expect_same_state((dir / "whole" / "step-00000008").string(), (root / "step-00000008").string(),
                      {"model/", "optim/", "buffer/", "rng/"}, 0, backend + " elastic");
  }
  f = train(2, {"--steps", "2", "--resume", "auto", "--save", (dir / "fresh").string()}, dir / "fresh.txt");
  ASSERT_EQ(f.exit_code(), 0) << f.output;
  EXPECT_NE(f.output.find("--resume auto: no checkpoint under " + (dir / "fresh").string() +
                          " yet, starting at step 1"),
            std::string::npos)
      << f.output;
  f = train(2, {"--steps", "2", "--resume", "auto"}, dir / "nosave.txt");
  EXPECT_NE(f.exit_code(), 0);
  EXPECT_NE(f.output.find("--resume auto continues from the latest checkpoint under --save; add --save DIR"),
            std::string::npos)
      << f.output;
  fs::remove_all(dir);
}

// dtrain train's configuration (apps/dtrain/gpt/config.h, apps/dtrain/gpt/deepspeed_config.h), pure: the TOML
// schema's round trip, every kind of rejection with its message (unknown key and its nearest valid key, wrong
// type, out of range, not TOML, --set without '='), the order of the sources on `dtrain train`'s command
// line, and a DeepSpeed JSON config mapped field by field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "apps/dtrain/cmd_train.h"
#include "apps/dtrain/gpt/config.h"
#include "apps/dtrain/gpt/deepspeed_config.h"
#include "core/error.h"
#include "tests/temp_dir.h"

using namespace dtrain;
using train::TrainOptions;

namespace {

// One folder per test process, removed when it ends: CTest runs the tests of this file in parallel, and a
// shared folder let one test read the other's file.
struct TempDir {
  std::filesystem::path path = test::temp_dir("dtrain_config_test");
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string write_temp(const std::string& name, const std::string& text) {
  static const TempDir tmp;
  const auto& dir = tmp.path;
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string toml_error(const std::string& text) {
  TrainOptions o;
  const std::string path = write_temp("bad.toml", text);
  return error_of([&] { train::apply_config_file(o, path); });
}

}  // namespace

// Every key written by effective_config() and read back gives the same options; a file sets what it names.
TEST(Config, EffectiveConfigRoundTripsAndAFileSetsItsKeys) {
  TrainOptions o;
  const std::string path = write_temp("run.toml", R"(
[model]
layers = 2
width = 64
[optimizer]
lr = 3e-4      # a comment
beta2 = 0.95
[schedule]
name = "cosine"
warmup = 20
[strategy]
name = "zero2"
bucket_bytes = "4M"
deterministic = true
[checkpoint]
dir = "runs/x"
)");
  train::apply_config_file(o, path);
  EXPECT_EQ(o.model.n_layer, 2);
  EXPECT_EQ(o.model.n_embd, 64);
  EXPECT_DOUBLE_EQ(o.lr, 3e-4);
  EXPECT_DOUBLE_EQ(o.beta2, 0.95);
  EXPECT_EQ(o.lr_schedule, "cosine");
  EXPECT_EQ(o.warmup, 20);
  EXPECT_EQ(o.strategy, "zero2");
  EXPECT_EQ(o.bucket_bytes, 4 << 20);
  EXPECT_TRUE(o.deterministic);
  EXPECT_EQ(o.save, "runs/x");
  const std::string text = train::effective_config(o);
  TrainOptions again;
  train::apply_config_file(again, write_temp("again.toml", text));
  EXPECT_EQ(train::effective_config(again), text);
  // every key of the schema is in it, under its section
  for (const auto& k : train::config_schema()) {
    const std::string leaf = k.key.substr(k.key.find('.') + 1);
    EXPECT_NE(text.find("\n" + leaf + " = "), std::string::npos) << k.key;
  }
}

TEST(Config, UnknownKeysNameTheNearestValidKey) {
  struct Case {
    std::string toml, key, nearest;
  } cases[] = {
      {"[optimizer]\nlrr = 1e-3\n", "optimizer.lrr", "optimizer.lr"},
      {"[optimiser]\nlr = 1e-3\n", "optimiser.lr", "optimizer.lr"},
      {"lr = 1e-3\n", "lr", "optimizer.lr"},
      {"[train]\nsteps = 10\nbatchsize = 4\n", "train.batchsize", "train.batch"},
      {"[schedule]\nwarm_up = 5\n", "schedule.warm_up", "schedule.warmup"},
  };
  for (const auto& c : cases) {
    const std::string e = toml_error(c.toml);
    EXPECT_NE(e.find("unknown key '" + c.key + "'. Did you mean '" + c.nearest + "'?"), std::string::npos)
        << e;
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  }
  TrainOptions o;
  const std::string e = error_of([&] { train::apply_set(o, "optimizer.learning_rate=1"); });
  EXPECT_NE(e.find("unknown key 'optimizer.learning_rate'. Did you mean 'optimizer.lr'?"), std::string::npos)
      << e;
}

TEST(Config, WrongTypesAndRangesNameTheKeyTheValueAndWhatIsAllowed) {
  struct Case {
    std::string toml, message;
  } cases[] = {
      {"[optimizer]\nlr = \"fast\"\n",
       "optimizer.lr = \"fast\" is a string; it must be a number from 0 to 100"},
      {"[train]\nsteps = 1.5\n",
       "train.steps = 1.5 is a number with a fraction; it must be an integer from 1 to"},
      {"[train]\nsteps = 0\n", "train.steps = 0 is out of range; it must be an integer from 1 to"},
      {"[precision]\ndtype = \"fp8\"\n",
       "precision.dtype = \"fp8\" is not a value it takes; it must be one of \"fp32\", \"bf16\", \"fp16\""},
      {"[strategy]\ndeterministic = 1\n",
       "strategy.deterministic = 1 is an integer; it must be true or false"},
      {"[sample]\ntop_k = 300\n", "sample.top_k = 300 is out of range; it must be an integer from 1 to 256"},
      {"[optimizer]\nbeta1 = 1.0\n", "optimizer.beta1 = 1.0 is out of range"},
      {"[strategy]\nbucket_bytes = \"25Q\"\n", "strategy.bucket_bytes = \"25Q\" is not a byte count"},
      {"[model]\nlayers = [1, 2]\n", "model.layers is an array; it must be an integer from 1 to 1024"},
      {"[model]\nlayers = 2\n[model\n", "is not valid TOML (line 3"},
  };
  for (const auto& c : cases) {
    const std::string e = toml_error(c.toml);
    EXPECT_NE(e.find(c.message), std::string::npos) << c.toml << "\n" << e;
  }
  TrainOptions o;
  EXPECT_NE(error_of([&] { train::apply_config_file(o, "/nonexistent/run.toml"); }).find("cannot be read"),
            std::string::npos);
  EXPECT_NE(error_of([&] { train::apply_set(o, "optimizer.lr"); }).find("is not key=value"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              train::apply_setting(o, "train.steps", "ten", "--steps ten");
            }).find("--steps ten: train.steps = ten is a string; it must be an integer from 1 to"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { train::apply_setting(o, "optimizer.lr", "inf", "--lr inf"); }).find("is out of range"),
      std::string::npos);
  // text values: quoted or bare strings, booleans, byte counts
  train::apply_set(o, "strategy.name=zero3");
  train::apply_set(o, "sample.prompt=\"Once upon\"");
  train::apply_set(o, "strategy.sequence_parallel=true");
  train::apply_set(o, "strategy.bucket_bytes=25M");
  train::apply_set(o, "optimizer.lr=2");  // an integer where a number is wanted
  EXPECT_EQ(o.strategy, "zero3");
  EXPECT_EQ(o.sample_prompt, "Once upon");
  EXPECT_TRUE(o.sequence_parallel);
  EXPECT_EQ(o.bucket_bytes, 25 << 20);
  EXPECT_DOUBLE_EQ(o.lr, 2.0);
}

// The example config of DeepSpeed's configuration page (examples/deepspeed/ds_config.json: its batch sizes,
// Adam block, WarmupLR, fp16 block, clipping and ZeRO-2 block), field by field.
TEST(DeepSpeedConfig, TheDocumentedExampleMapsFieldByField) {
  TrainOptions o;
  train::apply_deepspeed_config(o, DTRAIN_SOURCE_DIR "/examples/deepspeed/ds_config.json");
  EXPECT_EQ(o.batch, 16);
  EXPECT_TRUE(o.batch_given);
  EXPECT_EQ(o.micro_batch, 4);
  EXPECT_EQ(o.accumulation, 2);
  EXPECT_EQ(o.log_every, 50);
  EXPECT_EQ(o.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(o.lr, 0.001);
  EXPECT_DOUBLE_EQ(o.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.beta2, 0.999);
  EXPECT_DOUBLE_EQ(o.eps, 1e-8);
  EXPECT_DOUBLE_EQ(o.weight_decay, 3e-7);
  EXPECT_EQ(o.lr_schedule, "constant");  // WarmupLR: warmup, then the peak
  EXPECT_EQ(o.warmup, 1000);
  EXPECT_EQ(o.warmup_type, "log");  // DeepSpeed's default
  EXPECT_DOUBLE_EQ(o.warmup_min_lr, 0);
  EXPECT_EQ(o.precision, "fp16");
  EXPECT_DOUBLE_EQ(o.loss_scale, 0);
  EXPECT_DOUBLE_EQ(o.initial_scale_power, 16);
  EXPECT_EQ(o.scaler.window, 1000);
  EXPECT_EQ(o.scaler.hysteresis, 2);
  EXPECT_FALSE(o.scaler.consecutive_hysteresis);
  EXPECT_DOUBLE_EQ(o.scaler.min_scale, 1);
  EXPECT_DOUBLE_EQ(o.clip, 1.0);
  EXPECT_EQ(o.strategy, "deepspeed");
  EXPECT_EQ(o.zero_stage, 2);
  EXPECT_EQ(o.bucket_bytes, int64_t{500000000} * 2);  // 5e8 elements of fp16 gradients
  // the world size resolves the batch and the strategy: 4 x 2 x 2 ranks = 16
  train::resolve_options(o, 2);
  EXPECT_EQ(o.strategy, "zero2");
  EXPECT_EQ(o.batch, 16);
  const std::string e = error_of([&] {
    TrainOptions p;
    train::apply_deepspeed_config(p, DTRAIN_SOURCE_DIR "/examples/deepspeed/ds_config.json");
    train::resolve_options(p, 3);
  });
  EXPECT_NE(
      e.find("--batch 16 (train_batch_size) is not --micro-batch 4 x --accumulation 2 x 3 data-parallel "
             "ranks = 24"),
      std::string::npos)
      << e;
}

TEST(DeepSpeedConfig, WarmupDecayBf16Zero3AndInferredAccumulation) {
  TrainOptions o;
  train::apply_deepspeed_config(o, write_temp("ds3.json", R"({
    "train_batch_size": 24, "train_micro_batch_size_per_gpu": 3,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 6e-4, "warmup_num_steps": 50,
                             "warmup_type": "linear", "total_num_steps": 500}},
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1e6, "overlap_comm": true}
  })"));
  EXPECT_EQ(o.lr_schedule, "linear");
  EXPECT_DOUBLE_EQ(o.lr, 6e-4);  // warmup_max_lr is the peak
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.01);
  EXPECT_EQ(o.steps, 500);
  EXPECT_EQ(o.warmup, 50);
  EXPECT_EQ(o.warmup_type, "linear");
  EXPECT_DOUBLE_EQ(o.min_lr, 1e-5);
  EXPECT_EQ(o.precision, "bf16");
  EXPECT_EQ(o.bucket_bytes, 2000000);  // 1e6 elements of bf16
  train::resolve_options(o, 4);
  EXPECT_EQ(o.strategy, "zero3");
  EXPECT_EQ(o.accumulation, 2);  // 24 / (3 x 4)
}

TEST(DeepSpeedConfig, UnsupportedKeysAreRejectedByName) {
  struct Case {
    std::string json, message;
  } cases[] = {
      {R"({"tensorboard": {"enabled": true}})", "ds.json: tensorboard: not supported by dtrain"},
      {R"({"optimizer": {"type": "Lamb", "params": {}}})",
       "optimizer.type: \"Lamb\" is not an optimizer dtrain has"},
      {R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})",
       "optimizer.params.amsgrad: not supported by dtrain"},
      {R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}})",
       "optimizer.params.adam_w_mode: not supported by dtrain (Adam with L2 regularisation"},
      {R"({"scheduler": {"type": "OneCycle", "params": {}}})",
       "scheduler.type: \"OneCycle\" is not a schedule"},
      {R"({"fp16": {"enabled": true, "auto_cast": true}})", "fp16.auto_cast: not supported by dtrain"},
      {R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9}})",
       "zero_optimization.stage3_max_live_parameters: not supported by dtrain"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})",
       "zero_optimization.offload_optimizer: not supported by dtrain (CPU offload is not built yet)"},
      {R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8}})",
       "differs from reduce_bucket_size"},
      {R"({"zero_optimization": {"stage": 5}})", "zero_optimization.stage (dtrain's strategy.zero_stage)"},
      {R"({"gradient_clipping": -1})",
       "gradient_clipping (dtrain's train.clip): train.clip = -1 is out of range"},
      {R"({"train_batch_size": 8,})", "is not valid JSON"},
  };
  for (const auto& c : cases) {
    TrainOptions o;
    const std::string path = write_temp("ds.json", c.json);
    const std::string e = error_of([&] { train::apply_deepspeed_config(o, path); });
    EXPECT_NE(e.find(c.message), std::string::npos) << c.json << "\n" << e;
  }
  // "auto" keeps dtrain's values
  TrainOptions o;
  train::apply_deepspeed_config(
      o, write_temp("auto.json", R"({"train_batch_size": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})"));
  const TrainOptions d;
  EXPECT_EQ(o.batch, d.batch);
  EXPECT_DOUBLE_EQ(o.lr, d.lr);
  EXPECT_DOUBLE_EQ(o.weight_decay, d.weight_decay);
  EXPECT_EQ(o.precision, d.precision);
}

// `dtrain train CONFIG --flags --set`: the defaults, then the file, then the flags, then --set, each later
// one winning; a .json CONFIG is DeepSpeed's.
TEST(Config, CommandLineOrderIsFileThenFlagsThenSet) {
  const std::string path =
      write_temp("order.toml", "[optimizer]\nlr = 1e-2\nweight_decay = 0.5\n[train]\nsteps = 7\n");
  auto parse = [](std::vector<std::string> args) {
    CLI::App app{"dtrain"};
    apps::TrainCommand cmd;
    apps::add_train_command(app, cmd);
    std::reverse(args.begin(), args.end());  // CLI11 takes the vector form reversed
    app.parse(args);
    return apps::train_options(cmd);
  };
  TrainOptions o = parse({"train", path, "--lr", "2e-2", "--steps", "9", "--steps", "11", "--set",
                          "optimizer.lr=3e-2", "--deterministic"});
  EXPECT_DOUBLE_EQ(o.lr, 3e-2);           // --set over the flag over the file
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.5);  // the file over the default
  EXPECT_EQ(o.steps, 11);                 // a flag given twice: its last value
  EXPECT_TRUE(o.deterministic);
  o = parse({"train", DTRAIN_SOURCE_DIR "/examples/deepspeed/ds_config.json", "--clip", "0.5"});
  EXPECT_EQ(o.precision, "fp16");
  EXPECT_DOUBLE_EQ(o.clip, 0.5);
  EXPECT_NE(error_of([&] {
              parse({"train", "--lr", "abc"});
            }).find("--lr abc: optimizer.lr = abc is a string"),
            std::string::npos);
}

// The training run's parts in one process: the learning-rate schedule against its formula, each bad schedule
// option rejected with a message naming the flag and the value, the distributed sampler's epochs, and the
// Trainer's callbacks on a one-rank world.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "apps/dtrain/gpt/train_gpt.h"
#include "comm/factory.h"
#include "core/error.h"
#include "tests/temp_dir.h"
#include "train/schedule.h"

using namespace dtrain;
using dtrain::train::TrainOptions;

namespace {

TrainOptions cosine(int64_t steps, int64_t warmup, double lr, double min_lr) {
  TrainOptions o;
  o.steps = steps;
  o.warmup = warmup;
  o.lr = lr;
  o.min_lr = min_lr;
  o.lr_schedule = "cosine";
  return o;
}

std::string message_of(const TrainOptions& o) {
  try {
    train::check_trainer_options(o);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Schedule, WarmupThenCosineFollowsItsFormula) {
  for (int64_t steps : {1, 2, 7, 100, 1001}) {
    for (int64_t warmup : {int64_t{0}, int64_t{1}, steps / 3, steps}) {
      const TrainOptions o = cosine(steps, warmup, 3e-3, 2e-4);
      ASSERT_EQ(message_of(o), "");
      double before = 0;
      for (int64_t s = 1; s <= steps; ++s) {
        const double lr = train::scheduled_lr(o, s);
        if (s <= warmup) {
          EXPECT_DOUBLE_EQ(lr, 3e-3 * static_cast<double>(s) / static_cast<double>(warmup)) << s;
          EXPECT_GT(lr, before) << "warmup rises, step " << s;
        } else {
          const int64_t span = steps - warmup;
          const double t =
              span <= 1 ? 1.0 : static_cast<double>(s - warmup - 1) / static_cast<double>(span - 1);
          EXPECT_NEAR(lr, 2e-4 + (3e-3 - 2e-4) * 0.5 * (1 + std::cos(M_PI * t)), 1e-15) << s;
          if (s > warmup + 1) {
            EXPECT_LE(lr, before) << "the cosine falls, step " << s;
          }
        }
        before = lr;
      }
      if (steps > warmup + 1) {
        EXPECT_DOUBLE_EQ(train::scheduled_lr(o, warmup + 1), 3e-3);  // the peak right after the warmup
      }
      EXPECT_NEAR(train::scheduled_lr(o, steps), warmup == steps ? 3e-3 : 2e-4,
                  1e-15);  // the floor at the end
    }
  }
  // a negative floor is lr / 10
  EXPECT_NEAR(train::scheduled_lr(cosine(50, 5, 1e-3, -1), 50), 1e-4, 1e-15);
}

TEST(Schedule, ConstantKeepsTheRateAfterItsWarmup) {
  TrainOptions o;
  o.steps = 20;
  o.lr = 5e-4;
  for (int64_t s = 1; s <= 20; ++s) EXPECT_DOUBLE_EQ(train::scheduled_lr(o, s), 5e-4);
  o.warmup = 4;
  EXPECT_DOUBLE_EQ(train::scheduled_lr(o, 1), 5e-4 / 4);
  EXPECT_DOUBLE_EQ(train::scheduled_lr(o, 4), 5e-4);
  EXPECT_DOUBLE_EQ(train::scheduled_lr(o, 20), 5e-4);
}

TEST(Schedule, BadOptionsAreRejectedNamingTheFlagAndValue) {
  TrainOptions o = cosine(100, 10, 1e-3, -1);
  o.lr_schedule = "step";
  EXPECT_NE(
      message_of(o).find("--lr-schedule 'step' is not a schedule dtrain has. Use constant, cosine or linear"),
      std::string::npos)
      << message_of(o);
  o = cosine(100, 101, 1e-3, -1);
  EXPECT_NE(message_of(o).find("--warmup 101 must be between 0 and --steps (100)"), std::string::npos)
      << message_of(o);
  o = cosine(100, -1, 1e-3, -1);
  EXPECT_NE(message_of(o).find("--warmup -1 must be between 0"), std::string::npos) << message_of(o);
  o = cosine(100, 10, 1e-3, 2e-3);
  EXPECT_NE(message_of(o).find("--min-lr 0.002 must be at most --lr (0.001)"), std::string::npos)
      << message_of(o);
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    o = cosine(100, 10, bad, -1);
    EXPECT_NE(message_of(o).find("must be a learning rate of 0 or more"), std::string::npos) << bad;
  }
  EXPECT_EQ(message_of(cosine(100, 10, 0.0, -1)), "");  // lr 0: the weights stay (an evaluation)
}

// DeepSpeed's WarmupLR and WarmupDecayLR (linear and log warmup) against their formulas: iteration t = step -
// 1, lr = min + (max - min) * gamma(t), gamma = t / N or ln(t + 1) / ln(N) while t < N, then 1 (WarmupLR) or
// max(0, (T - t) / max(1, T - N)) (WarmupDecayLR, T the total steps).
TEST(Schedule, DeepSpeedWarmupLrAndWarmupDecayLrFollowTheirFormulas) {
  for (const std::string type : {"linear", "log"}) {
    for (const std::string schedule : {"constant", "linear"}) {
      TrainOptions o;
      o.steps = 40, o.warmup = 10, o.lr = 2e-3, o.warmup_min_lr = 1e-4, o.min_lr = 1e-4;
      o.warmup_type = type, o.lr_schedule = schedule;
      ASSERT_EQ(message_of(o), "");
      for (int64_t s = 1; s <= o.steps; ++s) {
        const double t = static_cast<double>(s - 1), n = 10, total = 40;
        double gamma =
            t < n ? (type == "log" ? std::log(t + 1) / std::log(n) : t / n)
                  : (schedule == "constant" ? 1.0 : std::max(0.0, (total - t) / std::max(1.0, total - n)));
        const double want = 1e-4 + (2e-3 - 1e-4) * gamma;
        EXPECT_NEAR(train::scheduled_lr(o, s), want, 1e-15) << type << " " << schedule << " step " << s;
      }
    }
  }
  TrainOptions o;  // WarmupLR longer than the run: still warming up at the end
  o.steps = 20, o.warmup = 1000, o.warmup_min_lr = 0, o.warmup_type = "log";
  EXPECT_EQ(message_of(o), "");
  EXPECT_LT(train::scheduled_lr(o, 20), o.lr);
}

// The sampler over sizes that do not divide the batch nor the ranks: at every step the ranks' parts are
// disjoint and together the step's batch; each epoch takes every sample exactly once; epochs and seeds give
// different orders; a sampler made anew (a resumed run) gives every step the same samples.
TEST(DistributedSampler, DisjointCompleteEpochsDeterministicAndResumable) {
  for (int64_t samples : {1, 10, 37, 100}) {
    for (int64_t batch : {1, 4, 7, 150}) {
      const train::DistributedSampler s(samples, batch, 99);
      const int64_t epochs = 3, positions = samples * epochs;
      std::vector<int64_t> seq;
      for (int64_t step = 1; static_cast<int64_t>(seq.size()) < positions; ++step) {
        const at::Tensor all = s.step_indices(step);
        ASSERT_EQ(all.numel(), batch);
        for (int64_t ranks : {1, 2, 3, 4}) {
          if (ranks > batch) continue;
          std::vector<int64_t> joined;
          for (int64_t r = 0; r < ranks; ++r) {
            const at::Tensor part = s.rank_indices(step, r, ranks);
            joined.insert(joined.end(), part.data_ptr<int64_t>(), part.data_ptr<int64_t>() + part.numel());
          }
          // (the parts, in rank order, are the batch: disjoint positions, nothing left out)
          ASSERT_EQ(joined, std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + batch))
              << samples << " samples, batch " << batch << ", " << ranks << " ranks, step " << step;
        }
        seq.insert(seq.end(), all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + batch);
        const train::DistributedSampler again(samples, batch, 99);
        EXPECT_TRUE(at::equal(again.step_indices(step), all)) << "step " << step;
      }
      for (int64_t e = 0; e < epochs; ++e) {
        std::set<int64_t> seen(seq.begin() + e * samples, seq.begin() + (e + 1) * samples);
        EXPECT_EQ(static_cast<int64_t>(seen.size()), samples) << "epoch " << e << ": a sample twice";
        EXPECT_EQ(*seen.begin(), 0);
        EXPECT_EQ(*seen.rbegin(), samples - 1);
      }
      if (samples >= 10) {
        EXPECT_FALSE(std::equal(seq.begin(), seq.begin() + samples, seq.begin() + samples))
            << "epochs 0 and 1 in the same order";
        const train::DistributedSampler other(samples, samples, 100);
        EXPECT_FALSE(
            at::equal(other.step_indices(1), train::DistributedSampler(samples, samples, 99).step_indices(1)))
            << "seeds 99 and 100 in the same order";
      }
    }
  }
  EXPECT_EQ(train::DistributedSampler(10, 4, 1).epoch_of(3), 0);  // positions 8..11: epoch 0 ends inside
  EXPECT_EQ(train::DistributedSampler(10, 4, 1).epoch_of(4), 1);
  EXPECT_THROW(train::DistributedSampler(0, 4, 1), ValueError);
}

namespace {

// Records each callback as a line.
struct Recorder : train::Callback {
  std::vector<std::string> calls;
  std::vector<double> losses, evaluations;
  void on_train_start(train::Trainer&) override { calls.push_back("start"); }
  bool wants_loss(int64_t) override { return true; }
  void on_step_end(train::Trainer&, const train::StepInfo& s) override {
    calls.push_back("step " + std::to_string(s.step));
    losses.push_back(s.loss);
  }
  void on_checkpoint(train::Trainer&, int64_t step, const std::string& dir) override {
    calls.push_back("checkpoint " + std::to_string(step) + " " +
                    std::filesystem::path(dir).filename().string());
  }
  void on_evaluate(train::Trainer&, int64_t step, double loss) override {
    calls.push_back("evaluate " + std::to_string(step));
    evaluations.push_back(loss);
  }
  void on_train_end(train::Trainer&) override { calls.push_back("end"); }
  void on_exception(train::Trainer&, const std::exception& e) override {
    calls.push_back(std::string("exception ") + e.what());
  }
};

}  // namespace

// A user's module (a linear regression) trained by the Trainer on a one-rank world: the callbacks in their
// order (a checkpoint after every save, with its folder; evaluations every 3 steps and at the end), the loss
// falling; an exception from the loss function reaches on_exception, then the caller.
TEST(Trainer, CallbacksInOrderAndAnExceptionReachesOnException) {
  auto world = comm::create_backend("gloo", RankInfo{}, std::chrono::seconds(30));
  const auto root = test::temp_dir("dtrain_trainer_test");
  at::manual_seed(3);
  const at::Tensor x = at::randn({64, 3}), y = x.matmul(at::tensor({1.0f, -2.0f, 0.5f})).unsqueeze(1);
  train::TrainerOptions o;
  o.steps = 40, o.batch = 8, o.lr = 0.1, o.weight_decay = 0, o.log_every = 100;
  o.save = root.string(), o.save_every = 20;
  const train::DistributedSampler sampler(64, o.batch, 1);
  auto batches = [&](int64_t step) -> train::Trainer::Batch {
    const at::Tensor idx = sampler.step_indices(step);
    return {x.index_select(0, idx), y.index_select(0, idx)};
  };
  torch::nn::Linear model(3, 1);
  auto loss = [&](const train::Trainer::Batch& rows) { return (model(rows[0]) - rows[1]).pow(2).mean(); };
  auto rec = std::make_shared<Recorder>();
  const double before = loss({x, y}).item<double>();
  {
    train::Trainer t(*model, loss, batches, o, world);
    t.add_callback(rec);
    t.set_evaluation([&](int64_t) -> train::Trainer::Batch { return {x, y}; }, 1, 20);
    t.fit();
  }
  std::vector<std::string> want{"start"};
  for (int s = 1; s <= 40; ++s) {
    want.push_back("step " + std::to_string(s));
    if (s % 20 == 0) {
      want.push_back(str_cat("checkpoint ", s, " step-000000", s));
      want.push_back("evaluate " + std::to_string(s));
    }
  }
  want.push_back("end");
  EXPECT_EQ(rec->calls, want);
  ASSERT_EQ(rec->losses.size(), 40u);
  ASSERT_EQ(rec->evaluations.size(), 2u);
  EXPECT_LT(rec->evaluations.back(), 0.1 * before) << before;
  EXPECT_TRUE(std::filesystem::exists(root / "step-00000040" / "manifest.json"));

  // a failing loss function: on_exception sees it, then fit() rethrows it
  torch::nn::Linear other(3, 1);
  auto failing = [&](const train::Trainer::Batch& rows) {
    if (rows[0].size(0) > 0 && rec->calls.size() > 1) throw ValueError("the user's loss failed");
    return (other(rows[0]) - rows[1]).pow(2).mean();
  };
  rec->calls.clear();
  o.save.clear(), o.save_every = 0;
  train::Trainer t(*other, failing, batches, o, world);
  t.add_callback(rec);
  EXPECT_THROW(t.fit(), ValueError);
  EXPECT_EQ(rec->calls, (std::vector<std::string>{"start", "step 1", "exception the user's loss failed"}));
  std::filesystem::remove_all(root);
}

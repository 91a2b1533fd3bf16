// The training run's pure parts: the learning-rate schedule against its formula, and each bad schedule option
// rejected with a message naming the flag and the value.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "train/train_gpt.h"

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
    train::check_schedule(o);
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
          if (s > warmup + 1) EXPECT_LE(lr, before) << "the cosine falls, step " << s;
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
  o.lr_schedule = "linear";
  EXPECT_NE(message_of(o).find("--lr-schedule 'linear' is not a schedule dtrain has. Use constant or cosine"),
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

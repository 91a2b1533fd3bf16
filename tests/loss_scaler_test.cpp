// optim::LossScaler driven by scripted overflow sequences, against DeepSpeed's DynamicLossScaler as its
// source defines it (deepspeed/runtime/fp16/loss_scaler.py): hysteresis absorbs overflows before the scale
// halves, the scale doubles on the clean step that follows each full window of clean steps, the minimum scale
// overflowing is an error.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "optim/loss_scaler.h"

using dtrain::ValueError;
using dtrain::optim::LossScaler;
using dtrain::optim::LossScalerOptions;

namespace {

// Runs `overflows` (one entry per step) and returns the scale after each step.
std::vector<double> run(LossScaler& s, const std::vector<bool>& overflows) {
  std::vector<double> out;
  for (bool o : overflows) {
    EXPECT_EQ(s.update(o), o);  // a step is skipped exactly when it overflowed
    out.push_back(s.scale());
  }
  return out;
}

}  // namespace

TEST(LossScaler, DeepSpeedDefaults) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);  // 2^16
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_EQ(s.options().window, 1000);
  EXPECT_EQ(s.options().min_scale, 1.0);
}

TEST(LossScaler, HysteresisAbsorbsOneOverflowThenTheScaleHalves) {
  LossScaler s;
  // overflow, overflow, overflow: the first uses up hysteresis (2 -> 1), the next two halve the scale
  EXPECT_EQ(run(s, {true, true, true}), (std::vector<double>{65536, 32768, 16384}));
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_EQ(s.skipped(), 3);
  // 1000 clean steps after the last overflow (steps 3..1002) change nothing; the next clean step (1003)
  // doubles the scale and refills hysteresis
  std::vector<bool> clean(1000, false);
  auto scales = run(s, clean);
  EXPECT_EQ(scales.back(), 16384);
  EXPECT_EQ(s.hysteresis_left(), 1);
  EXPECT_EQ(run(s, {false}).back(), 32768);
  EXPECT_EQ(s.hysteresis_left(), 2);
  // hysteresis absorbs the next overflow again
  EXPECT_EQ(run(s, {true}).back(), 32768);
  EXPECT_EQ(s.steps(), 1005);
  EXPECT_EQ(s.skipped(), 4);
}

TEST(LossScaler, GrowsEveryWindowWithoutOverflow) {
  LossScalerOptions o;
  o.window = 3;
  o.initial_scale = 8;
  LossScaler s(o);
  // steps 0..9 clean: growth on the steps that follow 3, 6, 9 clean steps (3, 6, 9)
  EXPECT_EQ(run(s, std::vector<bool>(10, false)), (std::vector<double>{8, 8, 8, 16, 16, 16, 32, 32, 32, 64}));
  // an overflow restarts the count: hysteresis 2 -> 1, then 3 clean steps, growth on the fourth
  EXPECT_EQ(run(s, {true, false, false, false, false}), (std::vector<double>{64, 64, 64, 64, 128}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScalerOptions o;
  o.consecutive_hysteresis = true;
  LossScaler s(o);
  // overflow (2 -> 1), clean (refilled to 2), overflow (2 -> 1): the scale never halves
  EXPECT_EQ(run(s, {true, false, true, false, true}), (std::vector<double>(5, 65536)));
  LossScalerOptions plain;
  LossScaler t(plain);
  // without it, hysteresis stays used up: the second overflow halves
  EXPECT_EQ(run(t, {true, false, true}), (std::vector<double>{65536, 65536, 32768}));
}

TEST(LossScaler, OverflowAtTheMinimumIsAnError) {
  LossScalerOptions o;
  o.initial_scale = 4;
  o.hysteresis = 1;
  o.min_scale = 1;
  LossScaler s(o);
  EXPECT_EQ(run(s, {true, true}), (std::vector<double>{2, 1}));
  try {
    s.update(true);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("overflowed at the minimum loss scale 1"), std::string::npos)
        << e.what();
  }
  // a minimum between powers: the scale stops there
  o.min_scale = 3;
  o.initial_scale = 8;
  LossScaler t(o);
  EXPECT_EQ(run(t, {true, true}), (std::vector<double>{4, 3}));
}

TEST(LossScaler, StaticScaleNeverChangesButSkipsOverflows) {
  LossScalerOptions o;
  o.dynamic = false;
  o.initial_scale = 128;
  LossScaler s(o);
  EXPECT_EQ(run(s, {false, true, true, false}), (std::vector<double>(4, 128)));
  EXPECT_EQ(s.skipped(), 2);
}

TEST(LossScaler, BadOptionsNameTheField) {
  auto message = [](LossScalerOptions o) {
    try {
      LossScaler s(o);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LossScalerOptions o;
  o.window = 0;
  EXPECT_NE(message(o).find("window = 0"), std::string::npos) << message(o);
  o = {};
  o.hysteresis = 0;
  EXPECT_NE(message(o).find("hysteresis = 0"), std::string::npos) << message(o);
  o = {};
  o.initial_scale = -1;
  EXPECT_NE(message(o).find("initial_scale = -1"), std::string::npos) << message(o);
  o = {};
  o.min_scale = 1e9;
  EXPECT_NE(message(o).find("min_scale = 1e+09 is above initial_scale"), std::string::npos) << message(o);
  o = {};
  o.factor = 1;
  EXPECT_NE(message(o).find("factor = 1"), std::string::npos) << message(o);
}

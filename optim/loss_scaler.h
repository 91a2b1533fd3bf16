// The fp16 loss scaler (DESIGN §5), with DeepSpeed's semantics so that a DeepSpeed configuration's `fp16`
// block means the same here: the loss is multiplied by the scale before backward; a step whose gradients hold
// an inf or a nan (on any rank: the caller reduces the flag) is skipped, and the scale reacts.
//
// Dynamic scaling (DeepSpeed's DynamicLossScaler, its `fp16` defaults: initial scale 2^16, window 1000,
// hysteresis 2, minimum 1, factor 2):
// - an overflow with hysteresis left above 1 only uses up one unit of it; otherwise the scale halves (not
// below
//   the minimum). An overflow at the minimum scale is an error (the run cannot go on: every step would skip).
// - a clean step (no overflow) that follows `window`, 2·window, ... clean steps since the last overflow (or
// the
//   start) grows the scale by the factor and refills hysteresis; with consecutive_hysteresis every clean step
//   refills it.
// A static scale never changes; an overflowing step is still skipped (its update would put inf into the
// weights).
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::optim {

struct LossScalerOptions {
  bool dynamic = true;
  double initial_scale = 65536.0;  // 2^16 (DeepSpeed's initial_scale_power 16); the static scale if !dynamic
  int64_t window = 1000;           // loss_scale_window
  int64_t hysteresis = 2;          // delayed shift: overflows absorbed before the scale halves
  double min_scale = 1.0;          // min_loss_scale
  double factor = 2.0;
  bool consecutive_hysteresis = false;
  // Checks every field; ValueError naming the field, its value and the allowed range.
  void validate() const;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});
  double scale() const { return scale_; }
  // Records one step's outcome: `overflow` (any inf or nan in any rank's gradients) and returns whether the
  // optimizer step must be skipped. ValueError when a dynamic scale at its minimum overflows again.
  bool update(bool overflow);
  int64_t steps() const { return iter_; }
  int64_t skipped() const { return skipped_; }
  int64_t hysteresis_left() const { return hysteresis_left_; }
  const LossScalerOptions& options() const { return opts_; }
  std::string to_string() const;  // "loss scale 32768 (hysteresis 1 of 2, 3 steps skipped of 1200)"
  // Everything update() depends on, for a checkpoint: a restored scaler goes on exactly as the saved one.
  struct State {
    double scale = 0;
    int64_t steps = 0, last_overflow = -1, hysteresis_left = 0, skipped = 0;
  };
  State state() const { return {scale_, iter_, last_overflow_, hysteresis_left_, skipped_}; }
  // ValueError for a state no scaler of these options can be in (a scale that is not positive and finite).
  void restore(const State& s);

 private:
  LossScalerOptions opts_;
  double scale_;
  int64_t iter_ = 0;
  int64_t last_overflow_ = -1;
  int64_t hysteresis_left_;
  int64_t skipped_ = 0;
};

}  // namespace dtrain::optim

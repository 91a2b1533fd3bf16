// What this model's collectives cost inside a real step on these ranks beyond what the step model prices
// (plan/step_model.h: alpha-beta, and the overlap for the calls that run under compute): the ranks drift
// apart between calls and the faster one waits, and the communication threads take turns with the compute on
// shared cores, both growing with the compute between calls. Measured per call, for each family of calls at
// two micro-batch sizes (plan/measure_in_step.h), and read as a line through them. Cached by the model's
// signature, the backend and the world (in-step-<signature>.json beside the compute profile).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::plan {

struct InStepPoint {
  // "tp" (tensor parallel's blocking calls), "tp sp" (with sequence parallel), "dp" (the gradient buckets of
  // dp, zero1 and zero2, and zero1/2's all-gather), "zero3" (its gathers and reduce-scatters).
  std::string family;
  int64_t unit_bytes = 0;  // zero3: the units' size; dp: the buckets'; tp: 0
  int64_t micro_batch = 1;
  int64_t accumulation = 1;  // dp, zero3: also at 2, at the smaller size (its micro-batches' own cost)
  int64_t calls = 0;         // the calls of the measured step
  double per_call_s =
      0;  // the step's real time less its rehearsal and less the model's communication, per call
};

struct InStepCosts {
  std::string key;  // the model's signature, backend and world it was measured for ("": none)
  std::vector<InStepPoint> points;
  double measured_s = 0;  // the time the measurement took

  bool empty() const { return points.empty(); }
  // Seconds per call of `family` at `micro_batch`, in steps of one micro-batch: the points of the unit size
  // nearest `unit_bytes` (in ratio), a line between the measured micro-batch sizes around `micro_batch`
  // (beyond them, the nearest one's figure). nullopt: no point of that family.
  std::optional<double> per_call(const std::string& family, int64_t unit_bytes, double micro_batch) const;
  // What each micro-batch beyond the first adds, in seconds a step: the step at accumulation 2 less the
  // step at accumulation 1, at the size measured both ways (unit size nearest `unit_bytes`). nullopt: none.
  std::optional<double> per_micro_batch(const std::string& family, int64_t unit_bytes) const;
};

// Written whole to a temporary file and renamed over `path`.
void write_in_step_costs(const std::string& path, const InStepCosts& c);
// ValueError naming the file and what is wrong.
InStepCosts read_in_step_costs(const std::string& path);

}  // namespace dtrain::plan

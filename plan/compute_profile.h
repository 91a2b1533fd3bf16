// What one rank measured of a module's compute (plan/measure_compute.h): forward and backward seconds and the
// activation bytes of one micro-batch, at several micro-batch sizes, with activation checkpointing off and
// on, and the optimizer's seconds per parameter. Kept as JSON, cached by the module's signature, the
// intra-op thread count and the dtype, so that a second plan of the same model measures nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::plan {

// What a point was measured under: the tensor-parallel split (one rank's share of a tp-way split, measured
// on a rehearsal group, comm/rehearsal.h), sequence parallel, and activation checkpointing.
struct ComputeSetting {
  int64_t tp = 1;
  bool sequence_parallel = false;
  bool checkpoint = false;  // activation checkpointing on (backward recomputes the blocks' forward)
  bool operator==(const ComputeSetting& o) const {
    return tp == o.tp && sequence_parallel == o.sequence_parallel && checkpoint == o.checkpoint;
  }
  std::string to_string() const;  // "tp 2, sequence parallel, checkpointing"
};

// The collectives of one kind a forward and backward issued (tensor parallel's, counted on the rehearsal
// group by CommLog): calls and bytes in all, each call's bytes as the cost model takes them (all_reduce's
// buffer, all_gather's output, reduce_scatter's input).
struct MeasuredComm {
  std::string op;
  int64_t count = 0;
  int64_t bytes = 0;
};

struct ComputePoint {
  int64_t micro_batch = 0;
  ComputeSetting setting;
  std::vector<MeasuredComm> comm;  // tp > 1: its collectives in this forward and backward
  double forward_s = 0;            // the median over the timed repeats
  double backward_s = 0;           // (with checkpointing: the recomputation included)
  int64_t activation_bytes = 0;    // peak bytes held by tensors in forward + backward, above the model state
};

// A rehearsed optimizer step of a data-parallel strategy (plan/rehearse_strategy.h): the strategy's own code
// over a rehearsal group of `group` ranks, its collectives instant. What it adds beyond the plain forward,
// backward and optimizer (bucket copies, on-demand gathers' dispatch, buffers) is what the step model takes
// from it.
struct StrategyPoint {
  std::string strategy;  // dp, zero1, zero2, zero3
  int64_t group = 1;
  int64_t bucket_bytes = 0;
  bool checkpoint = false;
  int64_t accumulation = 1;
  int64_t micro_batch = 1;
  double step_s = 0;  // the fastest of its timed steps
  // Tensors at the peak of the step's forward and backward passes, and of its optimizer step, above what was
  // live before the module was built.
  int64_t peak_bytes = 0;
  int64_t step_peak_bytes = 0;
};

struct ComputeProfile {
  std::string signature;  // the module's parameters, the input, the threads and the dtype, hashed
  std::string model;      // the same, readable ("GPT 4x128 seq 64, 1 thread, float32")
  int threads = 1;
  std::string dtype = "float32";
  int64_t params = 0;
  std::vector<ComputePoint> points;
  double optimizer_s_per_param = 0;  // AdamW's step
  std::vector<StrategyPoint> strategies;
  double measured_s = 0;  // the time the measurement took
  // How much slower than its fastest moment the machine ran while the slowest setting kept was timed (1:
  // steady; plan/measure_compute.h). Above 1.1 the plan says the profile may be off.
  double unsteady = 1;

  // Piecewise linear in the micro-batch through the points of that setting, extrapolated beyond the measured
  // sizes along the two nearest. ValueError when the setting has no point.
  double forward_seconds(double micro_batch, const ComputeSetting& s) const;
  double backward_seconds(double micro_batch, const ComputeSetting& s) const;
  double activation_bytes(double micro_batch, const ComputeSetting& s) const;
  bool has(const ComputeSetting& s) const;
  // The rehearsal of `strategy` (zero3's for hsdp) with these buckets and checkpointing, at accumulation 1
  // (accumulation == 1) or 2 (more); nullptr when there is none.
  const StrategyPoint* rehearsal(const std::string& strategy, int64_t bucket_bytes, bool checkpoint,
                                 int64_t accumulation) const;
  // The collectives of the point of this setting nearest in size, their bytes scaled to `micro_batch`.
  std::vector<MeasuredComm> collectives(double micro_batch, const ComputeSetting& s) const;
};

// Written whole to a temporary file and renamed over `path`.
void write_compute_profile(const std::string& path, const ComputeProfile& p);
// ValueError naming the file and what is wrong (missing, not JSON, not a compute profile, bad values).
ComputeProfile read_compute_profile(const std::string& path);

}  // namespace dtrain::plan

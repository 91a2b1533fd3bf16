// What a strategy reports (parallel/parallel_strategy.h): its model-state memory, and when a synchronised
// backward's buckets went out.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::parallel {

// Model-state memory of one rank, in bytes (DESIGN §5).
struct ModelStateMemory {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t buffers = 0;
  int64_t buckets = 0;  // communication buffers beyond the gradients (0 here: gradients live in the buckets)
  int64_t total() const { return parameters + gradients + optimizer_state + buffers + buckets; }
  std::string to_string() const;
};

// Bytes of the tensors an optimizer holds as state (Adam's moments, ...), each counted once.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

// A collective a strategy issues in each optimizer step, as CommLog records it (comm/comm_log.h): what a
// planner counts and the tests compare with the log. Under gradient accumulation the reductions happen once
// per step (the synchronised backward); ZeRO-3's gathers happen in every micro-batch's forward and backward
// (per_micro_batch), and `count` is then an upper bound (a unit still gathered is not gathered again).
struct StepCollective {
  std::string cause;  // CommLog's cause: "data_parallel", "zero", "zero3", "hsdp", "deterministic", ...
  std::string kind;   // "all_reduce", "reduce_scatter", "all_gather", "all_to_all"
  int64_t count = 0;
  int64_t bytes = 0;  // this rank's contribution over the `count` calls
  int64_t group_size = 1;
  bool per_micro_batch = false;
};

// When a synchronised backward's gradients and buckets happened, in seconds since its first gradient arrived:
// each bucket's launch (in launch order), the last gradient's arrival, and the end (every bucket reduced).
// A bucket launched before the last gradient overlapped the rest of backward.
struct PassTimeline {
  std::vector<double> bucket_launch_s;
  double last_gradient_s = 0;
  double end_s = 0;
};

}  // namespace dtrain::parallel

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

// When a synchronised backward's gradients and buckets happened, in seconds since its first gradient arrived:
// each bucket's launch (in launch order), the last gradient's arrival, and the end (every bucket reduced).
// A bucket launched before the last gradient overlapped the rest of backward.
struct PassTimeline {
  std::vector<double> bucket_launch_s;
  double last_gradient_s = 0;
  double end_s = 0;
};

}  // namespace dtrain::parallel

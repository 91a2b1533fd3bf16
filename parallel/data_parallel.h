// Horovod-style data parallel for any torch::nn::Module: the module runs on plain local tensors, each rank on
// its part of the batch. Once a parameter's gradient is accumulated, a hook copies it into a fused bucket; a
// bucket is all-reduced (averaged) asynchronously the moment its last gradient is in, in the same bucket
// order on every rank, so communication overlaps the rest of backward. When backward ends, the reduced
// buckets become the parameters' gradients (views into the buckets), and the user's torch::optim optimizer
// steps unchanged.
//
//   parallel::DataParallel dp(*model, world);  // checks the ranks agree, broadcasts rank 0's weights
//   loss = model->forward(my_rows) ...; loss.backward();  // buckets all-reduced during backward
//   optimizer.step();
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "parallel/grad_reduction_options.h"
#include "parallel/strategy_report.h"

namespace dtrain::parallel {

// Data parallel's options are the gradient-reduction options (parallel/grad_reduction_options.h).
using DataParallelOptions = GradReductionOptions;

// `base` with Horovod's variables applied: HOROVOD_FUSION_THRESHOLD (bytes) sets bucket_bytes.
// HOROVOD_CYCLE_TIME is refused with a message: buckets here go out the moment they are full, there is no
// cycle to tune. ValueError naming the variable for a bad value.
DataParallelOptions with_horovod_env(DataParallelOptions base);

// Thread-safety: construct, step and destroy from one thread; the hooks run on the thread that calls
// backward (CPU autograd).
class DataParallel {
 public:
  // Collective over `group`: every rank must hold the same module structure (parameter and buffer names,
  // dtypes and shapes; else a ValueError on every rank naming the first difference and the ranks), then group
  // rank 0's parameters and buffers are broadcast, the buckets laid out, and the gradient hooks installed.
  DataParallel(torch::nn::Module& module, comm::BackendPtr group, DataParallelOptions opts = {});
  ~DataParallel();  // removes the hooks; parameters and gradients stay as they are
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Gradient accumulation: while off, backward only accumulates into .grad and nothing is communicated; the
  // next backward with it on reduces the accumulated sums (FSDP2's set_requires_gradient_sync, DDP's
  // no_sync).
  void set_requires_gradient_sync(bool sync);
  bool requires_gradient_sync() const;

  // Sums `values` (1-d, contiguous, at most side_values elements) over the group with the gradients of the
  // next synchronised backward, in its last bucket: no collective of its own (a step's loss for the log).
  // `values` holds the sum when that backward returns. Every rank must call it for the same backward.
  void reduce_with_gradients(at::Tensor values);

  // The timeline of the last synchronised backward (empty before the first).
  PassTimeline last_pass() const;
  // The collectives of each optimizer step (strategy_report.h): one bucket all-reduce each, or in
  // deterministic mode an all-to-all and an all-gather each.
  std::vector<StepCollective> step_collectives() const;

  // Parameter names per bucket, in the order the buckets are all-reduced.
  std::vector<std::vector<std::string>> buckets() const;
  ModelStateMemory memory(const torch::optim::Optimizer* optimizer = nullptr) const;
  const comm::BackendPtr& group() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace dtrain::parallel

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

namespace dtrain::parallel {

struct DataParallelOptions {
  // Bucket size in bytes (DDP's bucket_cap_mb, Horovod's HOROVOD_FUSION_THRESHOLD).
  int64_t bucket_bytes = int64_t{25} << 20;
  // The first bucket (the gradients backward produces first: the last layers) is small, so that
  // communication starts early, as DDP does.
  int64_t first_bucket_bytes = int64_t{1} << 20;
  // A parameter that gets no gradient in a backward is an error naming it, unless this is set (DDP's
  // find_unused_parameters): it then contributes zeros.
  bool allow_unused = false;
  // After the first backward, buckets are laid out again in the order the gradients arrived (group rank 0's
  // order, so that every rank agrees), as DDP does.
  bool rebuild_buckets = true;
  // Slots at the end of the last bucket for reduce_with_gradients (0: none; the buckets then hold exactly
  // the gradients).
  int64_t side_values = 0;
  // The dtype gradients are reduced in (FSDP's reduce_dtype): the buckets, ZeRO's shards of them, and the
  // gradients the parameters end up with, e.g. fp32 for bf16 parameters (the sum of the ranks' 16-bit
  // gradients then rounded once, in the optimizer's fp32 master gradients). Unset: the parameters' dtype.
  std::optional<at::ScalarType> reduce_dtype;
  // Deterministic mode: gradients bitwise the same at any power-of-2 group size N. Each backward must be one
  // micro-batch of a fixed size, the same number c of them (a power of 2) on every rank per step, the step's
  // c*N micro-batches spread over the ranks in order (rank r takes micro-batches r*c .. r*c + c - 1), and
  // each micro-batch's loss scaled by 1/(c*N): the gradients are summed, not averaged over the ranks, as one
  // balanced binary tree over the step's micro-batches (each rank's subtree locally, the ranks' in rank
  // order after one all-to-all). ZeRO's shards are cut at 1024-element blocks. Costs: no overlap with
  // backward; one copy of the gradients per tree level held; the same bytes on the wire as a ring
  // all-reduce (all-to-all, then all-gather; ZeRO: the all-to-all alone). Refused with side_values, hsdp,
  // and group sizes that are not powers of 2.
  bool deterministic = false;
  // ZeRO-3 only: gives a parameter or buffer on the meta device (a module built under parallel::OnMetaDevice,
  // never whole in memory) its values: called one tensor at a time, in registration order, on a whole
  // tensor of the entry's shape, dtype and name; group rank 0's values are then broadcast, and a parameter is
  // cut to this rank's shard before the next is made. Unset, a meta tensor is an error.
  std::function<void(const std::string& name, at::Tensor& whole)> materialize;
};

// `base` with Horovod's variables applied: HOROVOD_FUSION_THRESHOLD (bytes) sets bucket_bytes.
// HOROVOD_CYCLE_TIME is refused with a message: buckets here go out the moment they are full, there is no
// cycle to tune. ValueError naming the variable for a bad value.
DataParallelOptions with_horovod_env(DataParallelOptions base);

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

  // Parameter names per bucket, in the order the buckets are all-reduced.
  std::vector<std::vector<std::string>> buckets() const;
  ModelStateMemory memory(const torch::optim::Optimizer* optimizer = nullptr) const;
  const comm::BackendPtr& group() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace dtrain::parallel

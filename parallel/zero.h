// DeepSpeed ZeRO stages 1, 2 and 3 for any torch::nn::Module, on the gradient buckets it shares with data
// parallel (detail/grad_buckets.h):
// each bucket's gradients are reduce-scattered during backward, so that each rank gets the average of its
// shard only; the user's torch::optim optimizer, built by a factory over this rank's shards, keeps state for
// them alone (stage 1: optimizer state sharded); stage 2 also lets each full gradient bucket go once reduced
// (gradients sharded). After the step, every rank's updated shards are all-gathered into the parameters.
//
// Stage 3 (parameters sharded too) keeps only this rank's shard of each bucket; the buckets are then units of
// whole submodules (up to bucket_bytes, as FSDP wraps by size) and each parameter becomes an on-demand tensor
// (dispatch/on_demand.h): an op that reads it all-gathers its unit just in time, forward and again backward,
// the next unit prefetched from the order recorded in the first step, and a unit is let go once the next is
// in use. Module code is unchanged; reading a parameter outside training (printing, comparing) gathers it
// too, a collective every rank must run alike.
//
//   parallel::Zero zero(*model, world, 2, [](std::vector<at::Tensor> shards) {
//     return std::make_unique<torch::optim::AdamW>(shards, torch::optim::AdamWOptions(1e-3));
//   });
//   zero.zero_grad(); loss.backward(); zero.step();
//
// Exact for optimizers that treat every element alone (SGD, Adam, AdamW, RMSprop, Adagrad): a shard is a
// flat range of a bucket, cutting through parameters.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/data_parallel.h"
#include "parallel/meta_device.h"

namespace dtrain::parallel {

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> shards)>;

// ZeRO's options: how gradients are reduced (parallel/grad_reduction_options.h), and ZeRO-3's own.
struct ZeroOptions : GradReductionOptions {
  ZeroOptions() = default;
  // From the reduction options alone (data parallel's): ZeRO-3's own left unset.
  ZeroOptions(const GradReductionOptions& reduction) : GradReductionOptions(reduction) {}  // NOLINT: implicit
  // ZeRO-3 only: gives a parameter or buffer on the meta device (a module built under parallel::OnMetaDevice,
  // never whole in memory) its values: called one tensor at a time, in registration order, on a whole
  // tensor of the entry's shape, dtype and name; group rank 0's values are then broadcast, and a parameter is
  // cut to this rank's shard before the next is made. Unset, a meta tensor is an error.
  MaterializeFn materialize;
};

namespace detail {
struct ZeroState;
}

class Zero {
 public:
  // Collective over `group`, as DataParallel's constructor (module check, rank 0's weights broadcast), then
  // the parameters move into one flat buffer per bucket (each parameter stays the same at::Tensor) and
  // `make` builds the optimizer over this rank's shard of each bucket. stage: 1, 2 or 3 (ValueError
  // otherwise).
  // hsdp: stage 3 over `group` (a shard group), each reduced shard then all-reduced over `replicate` (the
  // ranks holding the same shards in the other shard groups; null or one rank: none).
  Zero(torch::nn::Module& module, comm::BackendPtr group, int stage, const OptimizerFactory& make,
       ZeroOptions opts = {}, comm::BackendPtr replicate = nullptr);
  ~Zero();  // removes the hooks; stage 3's parameters let go of their shards
  Zero(const Zero&) = delete;
  Zero& operator=(const Zero&) = delete;

  int stage() const { return stage_; }
  // The optimizer over this rank's shards (for its learning rate, or a scheduler).
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  // Drops the shards' gradients (the parameters hold none between steps under ZeRO).
  void zero_grad();
  // The optimizer's step on this rank's shards, then `after_optimizer` (if given: mixed precision's masters
  // into the shards), then every rank's shards all-gathered into the parameters.
  void step(const std::function<void()>& after_optimizer = {});
  // Gradient accumulation, as DataParallel::set_requires_gradient_sync.
  void set_requires_gradient_sync(bool sync);
  // Parameters, gradients (stage 1: the full gradient buckets, this rank's shard reduced in them; stage 2:
  // this rank's reduced shards), optimizer state (this rank's shards), buffers, and communication buffers
  // held at the moment (stage 2's full buckets while a backward needs them).
  ModelStateMemory memory() const;
  // Parameter names per bucket, in the order the buckets are reduced.
  std::vector<std::vector<std::string>> buckets() const;
  // Which parameter each run of this rank's shard of each bucket holds (the optimizer's tensors are the
  // buckets' shards, in bucket order).
  struct ShardSegment {
    size_t bucket = 0;
    std::string param;
    int64_t offset = 0, count = 0;  // elements into the bucket's shard
    int64_t param_offset = 0;       // elements into the parameter (row-major) where the run starts
    std::vector<int64_t> sizes;     // the parameter's (this rank's tensor-parallel part's) shape
  };
  std::vector<ShardSegment> shard_segments() const;
  PassTimeline last_pass() const;
  // The collectives of each optimizer step (strategy_report.h): the buckets' reduce-scatters (deterministic
  // mode: all-to-alls), hsdp's all-reduces over the replicas, and the parameters' all-gathers (stages 1 and
  // 2: after the step; stage 3: each unit in forward and again in backward, per micro-batch).
  std::vector<StepCollective> step_collectives() const;
  // Each bucket's shard sizes, per rank of the group.
  std::vector<std::vector<int64_t>> shard_counts() const;
  // This rank's shard of each bucket (the tensors the optimizer factory was given), in bucket order.
  std::vector<at::Tensor> shards() const;
  // After the shards were written other than by step() (a checkpoint loaded into them): stages 1 and 2
  // all-gather them into the parameters, stage 3 lets its gathered units go. Collective over the group.
  void shards_changed();
  // The step's gradients as sums of squares per block of 1024 elements of each bucket (deterministic mode's
  // blocks), every rank's blocks gathered in bucket and block order (one all-gather of doubles over the
  // group): the same tensor at any group size in deterministic mode, whose shards are cut at block edges.
  // optim::clip_grad_norm's norm there.
  at::Tensor gradient_block_squares() const;

 private:
  int stage_;
  std::shared_ptr<detail::ZeroState> state_;  // shared with stage 3's parameters, which gather through it
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace dtrain::parallel

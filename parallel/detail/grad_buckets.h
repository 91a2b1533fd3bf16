// The gradient buckets that data parallel and ZeRO share (parallel/data_parallel.h, parallel/zero.h): a
// module's trainable parameters laid out in fused buckets, a hook per parameter that moves its accumulated
// gradient into its bucket's slice (divided by the ranks on the way), each bucket handed to the strategy the
// moment it is full, strictly in bucket order, and the end of backward (parameters without a gradient, the
// last buckets, the wait). Deterministic mode's tree (parallel/deterministic.cpp) is here too. The engine
// knows no strategy: what a bucket's reduction is and where its result lands is the strategy's
// (BucketReduction). Private to parallel/.
//
// One backward pass ("pass") with gradient sync on:
//   hook(param)   : the param's accumulated .grad is copied into its bucket slice (nothing to copy when .grad
//                   already is that slice); when a bucket's last param is in, launch_ready() hands every
//                   bucket that is complete to the strategy, strictly in bucket order (every rank issues the
//                   same sequence).
//   finish_pass() : queued on the autograd engine by the pass's first hook, runs when backward ends: params
//                   that got no gradient are an error (or zeros, allow_unused); the remaining buckets go out;
//                   every bucket's reduction is waited for; the strategy lands the results.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "parallel/grad_reduction_options.h"
#include "parallel/meta_device.h"
#include "parallel/strategy_report.h"

namespace dtrain::parallel::detail {

using Clock = std::chrono::steady_clock;

uint64_t fnv1a(const std::string& s);
// "parameter 'fc.weight' Float [4, 3]"
std::string describe(const char* kind, const std::string& name, const at::Tensor& t);
int64_t bytes_of(const at::Tensor& t);
// Group rank 0's values of `tensors`, broadcast in one flat buffer per dtype.
void broadcast_coalesced(const comm::BackendPtr& group, const std::vector<at::Tensor>& tensors);
// A plain tensor (not an autograd view) of `sizes` on `flat`'s storage from element `offset`: it can be a
// .grad, whose detach_() (optimizers' zero_grad) views refuse.
at::Tensor alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes);

// Deterministic mode cuts flat buffers in whole blocks of this many elements (ZeRO's shards, data
// parallel's parts), so that a block's sum and the optimizer's vector loops see the same runs at any group
// size.
inline constexpr int64_t kDetBlock = 1024;
// How `numel` elements are cut over `n` ranks, per rank: balanced (core/balanced_split.h); in deterministic
// mode in whole kDetBlock blocks.
std::vector<int64_t> flat_cut(int64_t numel, int64_t n, bool deterministic);

// A parameter as the bucket layout sees it.
struct BucketItem {
  int64_t bytes;
  at::ScalarType dtype;
};
// How parameters fill buckets, visiting `order` (indices into `items`): a new bucket when the dtype changes
// or the bucket would pass its cap, `first_cap` for the first bucket and `cap` after; a parameter larger than
// a cap gets a bucket of its own. Every index lands in exactly one bucket, in `order`'s order.
std::vector<std::vector<int>> bucket_groups(const std::vector<int>& order,
                                            const std::vector<BucketItem>& items, int64_t first_cap,
                                            int64_t cap);

// What a strategy does with the buckets. Called with the engine's lock held.
class BucketReduction {
 public:
  virtual ~BucketReduction() = default;
  // CommLog's cause of the bucket reductions (comm/comm_log.h: the Backend records them as they are issued).
  virtual const char* cause() const = 0;
  // Whether a parameter's own .grad is dropped once its gradient is in the bucket.
  virtual bool drops_param_grads() const = 0;
  // Whether a full bucket lives only while a backward needs it: made by the first gradient, let go once
  // reduced, and at most two awaiting their reduction at once (else the buckets persist).
  virtual bool frees_buckets() const = 0;
  // Starts bucket k's reduction (its flat holds this pass's gradients, divided by the ranks).
  virtual comm::WorkPtr launch(size_t k, comm::AgreementRun run) = 0;
  // Bucket k's reduction was waited for (in bucket order).
  virtual void reduced(size_t k) = 0;
  // Every bucket reduced: the results become what the optimizer steps on.
  virtual void land() = 0;
  // Deterministic mode: this rank's part of bucket k, summed over every rank's micro-batches (counts: the
  // cut of flat_cut), becomes what the optimizer steps on.
  virtual void det_land(size_t k, const at::Tensor& part, const std::vector<int64_t>& counts) = 0;
  // After land() or the det_land()s of a pass.
  virtual void after_pass() = 0;
};

struct GradBuckets {
  struct Param {
    std::string name;
    at::Tensor tensor;  // ZeRO-3: on demand (dispatch/on_demand.h); reset when the strategy goes
    std::vector<int64_t> sizes;
    int bucket = -1;
    int64_t offset = 0;  // elements into the bucket
  };
  struct Bucket {
    at::Tensor flat;  // the gradients (BucketReduction::frees_buckets: only while a pass needs them)
    int64_t numel = 0;
    std::vector<int> params;
    int pending = 0;  // params of this pass not in yet
    comm::WorkPtr work;
    bool reduced = false;  // this pass's reduction waited for (see complete())
    Clock::time_point launched;
  };

  comm::BackendPtr group;
  // The other copies of `group` (hsdp's replica group; null: none): the module check, the first broadcast
  // and the buffers' sync go over it too, and gradients are divided by both sizes.
  comm::BackendPtr replicate;
  GradReductionOptions opts;
  MaterializeFn materialize;             // ZeRO-3: a meta tensor's values (ZeroOptions::materialize)
  BucketReduction* reduction = nullptr;  // the strategy's; outlives the hooks
  std::vector<Param> params;             // registration order
  std::vector<at::Tensor> buffers;
  std::vector<Bucket> buckets;  // launch order
  uint64_t fingerprint = 0;  // of the bucket layout: the agreement check covers a pass's buckets as one run
  at::Tensor side;           // guarded by mu: reduce_with_gradients' values for the next synchronised pass

  mutable std::mutex mu;
  bool sync = true;          // guarded by mu
  bool in_pass = false;      // guarded by mu
  int passes = 0;            // guarded by mu: completed passes with sync on
  size_t next_launch = 0;    // guarded by mu
  std::vector<char> ready;   // guarded by mu: per param, this pass
  std::vector<int> arrival;  // guarded by mu: params in the order their gradients came, this pass
  Clock::time_point pass_start, last_gradient;  // guarded by mu: this pass's first and last gradient
  PassTimeline timeline;                        // guarded by mu: of the last completed pass

  // Checks opts (and the group's size for deterministic mode), `who` naming the strategy in the message.
  void check_options(const char* who) const;
  // Set-up (grad_buckets_setup.cpp), collective over the group (and `replicate`): every rank must hold the
  // same module (a ValueError on every rank naming the first difference and the ranks otherwise), then rank
  // 0's parameters and buffers are broadcast. A tensor on the meta device is an error unless
  // `meta_allowed` (ZeRO-3, which makes them whole one at a time: made_whole()).
  void collect(torch::nn::Module& module, bool meta_allowed, const char* who);
  // A tensor on the meta device made whole: materialize gives its values, group rank 0's are broadcast.
  at::Tensor made_whole(const std::string& name, const at::Tensor& meta);
  // Makes `t` (a module's parameter or buffer, the same tensor the module holds) be `what`. Tensor::set_data
  // refuses a meta tensor becoming another kind, so the implementation is copied over directly then, and
  // the autograd node cached for the old device is dropped.
  static void become(at::Tensor& t, const at::Tensor& what);
  // The gradient hooks (installed last, once the strategy has laid the buckets out); removed by
  // remove_hooks().
  void install_hooks();
  void remove_hooks();

  int64_t replicas() const { return replicate ? replicate->group_size() : 1; }
  // Bytes of bucket k's gradients (in the reduction dtype) and of this rank's part of them (flat_cut).
  int64_t bucket_bytes(size_t k) const;
  int64_t part_bytes(size_t k) const;

  // Options of param p's gradient buckets: its own, in opts.reduce_dtype if set.
  at::TensorOptions grad_options(const Param& p) const {
    at::TensorOptions o = p.tensor.options().requires_grad(false);
    return opts.reduce_dtype ? o.dtype(*opts.reduce_dtype) : o;
  }

  // Buffers (BatchNorm's running statistics) made group rank 0's again after a synchronised backward.
  void sync_buffers();

  // The param's part of its bucket, shaped like the param (the bucket made first if it is not there).
  at::Tensor slice(const Param& p);

  // Buckets in `order` (param indices): a new bucket when the dtype changes or the next param would overflow
  // the cap (the first bucket's cap is first_bucket_bytes).
  void layout(const std::vector<int>& order);
  // Buckets in reverse registration order (roughly the order gradients come in).
  void layout_reversed();

  // One bucket per group (param indices; one dtype each), in launch order. Gradients already present move
  // into the new slices.
  void layout_groups(const std::vector<std::vector<int>>& groups);

  // Every rank must lay out the same buckets: a pass's buckets are checked as one run at the first (see
  // AgreementRun), so the layout itself is compared here, once, naming the ranks whose buckets differ (their
  // options differ: bucket_bytes, first_bucket_bytes, side_values).
  void check_same_layout(const std::string& shape);

  // Puts param i's gradient into its bucket slice, divided by the ranks on the way (the buckets are then
  // summed: the average without a pass of its own after the reduction, as DDP's pre-division).
  void take(int i);

  void on_grad_ready(int i);

  void start_pass();

  void launch_ready();

  // Waits for a bucket's reduction (recording it in CommLog), then tells the strategy. Called in bucket
  // order.
  void complete(size_t k);

  void finish_pass();

  // The first pass's arrival order (group rank 0's, so that every rank lays out the same buckets), the params
  // that got none last.
  void rebuild();

  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_names() const;

  // Model-state memory of the parameters, their gradients outside the buckets and the buffers (what every
  // strategy counts alike); the strategy adds the buckets and its own state.
  ModelStateMemory common_memory(bool count_parameters) const;

  // Deterministic mode (parallel/deterministic.cpp) -------------------------------------------------------
  // Each backward's gradients, flat per bucket, as one leaf of a balanced binary tree: a stack of partial
  // sums over runs of adjacent micro-batches, two equal runs merged at once (left + right).
  struct Partial {
    std::vector<at::Tensor> flats;  // per bucket
    int64_t leaves = 1;
  };
  std::vector<Partial> partials;  // guarded by mu
  // Queued on the autograd engine by a deterministic backward's first gradient: takes the pass's gradients
  // into the tree; on the synchronised pass, reduces the tree over the group in rank order (det_reduce).
  void det_finish_pass();
  void det_reduce();
  // Data parallel's landing of a deterministic part: every rank's part all-gathered into the bucket, whose
  // slices become the parameters' gradients.
  void det_gather_parts(size_t k, const at::Tensor& part, const std::vector<int64_t>& counts);
};

}  // namespace dtrain::parallel::detail

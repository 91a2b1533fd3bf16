// DataParallel's state and passes (parallel/data_parallel.cpp), shared with ZeRO's shards and units
// (parallel/zero_shards.cpp). Private to parallel/.
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
#include "parallel/data_parallel.h"
#include "tensor/cost_model.h"
#include "tensor/on_demand.h"

namespace dtrain::parallel {

namespace detail {

using Clock = std::chrono::steady_clock;

uint64_t fnv1a(const std::string& s);
// "parameter 'fc.weight' Float [4, 3]"
std::string describe(const char* kind, const std::string& name, const at::Tensor& t);
int64_t bytes_of(const at::Tensor& t);
// The cost model's time for a bucket collective over `n` ranks, `bytes` being the whole bucket, counted in
// bus bytes as the DTensor planner counts them; from DTRAIN_COMM_PROFILE when set, else the built-in
// defaults. For CommLog's "predicted" beside the measured time.
double predicted_seconds(tensor::StepKind kind, int64_t bytes, int n);
// Group rank 0's values of `tensors`, broadcast in one flat buffer per dtype.
void broadcast_coalesced(const comm::BackendPtr& group, const std::vector<at::Tensor>& tensors);

}  // namespace detail

struct DataParallel::Impl {
  using Clock = detail::Clock;
  struct Param {
    std::string name;
    at::Tensor tensor;  // ZeRO-3: on demand (tensor/on_demand.h); reset when the strategy goes
    std::vector<int64_t> sizes;
    int bucket = -1;
    int64_t offset = 0;  // elements into the bucket
  };
  struct Bucket {
    at::Tensor flat;  // the gradients (ZeRO-2: only while a pass needs them)
    int64_t numel = 0;
    std::vector<int> params;
    int pending = 0;  // params of this pass not in yet
    comm::WorkPtr work;
    bool reduced = false;  // this pass's reduction waited for (see complete())
    Clock::time_point launched;
    // ZeRO: the parameters live in `params_flat` (the module's parameters are plain tensors on its storage);
    // this rank owns elements [start, start + counts[rank]) of the bucket: their reduced gradient
    // (`shard_grad`) and their optimizer state, through `shard_param` (on params_flat's storage).
    // ZeRO-3: params_flat is only there while gathered (a unit, see acquire()), shard_param has its own
    // storage, and `gather` is the all-gather filling params_flat while in flight.
    at::Tensor params_flat;
    std::vector<int64_t> counts;
    int64_t start = 0;
    at::Tensor shard_grad, shard_param;
    comm::WorkPtr gather;
    Clock::time_point gather_start;
  };

  comm::BackendPtr group;
  // hsdp: the ranks holding the same shards in the other shard groups (null: none); each reduced shard is
  // all-reduced over them.
  comm::BackendPtr replicate;
  DataParallelOptions opts;
  int zero_stage = 0;         // 0: data parallel (all_reduce); 1, 2, 3: ZeRO (reduce_scatter to the owners)
  std::vector<Param> params;  // registration order
  std::vector<at::Tensor> buffers;
  std::vector<Bucket> buckets;  // launch order
  uint64_t fingerprint = 0;  // of the bucket layout: the agreement check covers a pass's buckets as one run
  at::Tensor side;           // guarded by mu: reduce_with_gradients' values for the next synchronised pass

  std::mutex mu;
  bool sync = true;          // guarded by mu
  bool in_pass = false;      // guarded by mu
  int passes = 0;            // guarded by mu: completed passes with sync on
  size_t next_launch = 0;    // guarded by mu
  std::vector<char> ready;   // guarded by mu: per param, this pass
  std::vector<int> arrival;  // guarded by mu: params in the order their gradients came, this pass
  Clock::time_point pass_start, last_gradient;  // guarded by mu: this pass's first and last gradient
  PassTimeline timeline;                        // guarded by mu: of the last completed pass

  // ZeRO-3's units (the buckets, whose parameters are gathered together): which are gathered, and the order
  // they were used in, per phase (0: forward, 1: backward), for prefetching. Guarded by units_mu.
  struct Units {
    int phase = -1;  // of the last use; -1: none since all were released
    int current = -1;
    std::vector<int> seq[2];  // the first pass's uses, a unit once per run of uses
    bool recorded[2] = {false, false};
    int pos[2] = {-1, -1};        // where in seq the last use was
    std::vector<char> pinned[2];  // used more than once in a phase: kept gathered through it
    bool run_started[2] = {false, false};
    uint64_t fingerprint[2] = {0, 0};  // of each phase's gathers, once recorded (an AgreementRun)
  };
  std::mutex units_mu;
  Units units;

  int64_t replicas() const { return replicate ? replicate->group_size() : 1; }

  // Options of param p's gradient buckets and shards: its own, in opts.reduce_dtype if set.
  at::TensorOptions grad_options(const Param& p) const {
    at::TensorOptions o = p.tensor.options().requires_grad(false);
    return opts.reduce_dtype ? o.dtype(*opts.reduce_dtype) : o;
  }

  // Buffers (BatchNorm's running statistics) made group rank 0's again after a synchronised backward.
  void sync_buffers();

  // The param's part of its bucket, shaped like the param. Not an autograd view but a plain tensor on the
  // bucket's storage, so that it can be a .grad: optimizers' zero_grad() calls detach_(), which views refuse.
  at::Tensor slice(const Param& p);

  static at::Tensor alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes);

  // Buckets in `order` (param indices): a new bucket when the dtype changes or the next param would overflow
  // the cap (the first bucket's cap is first_bucket_bytes).
  void layout(const std::vector<int>& order);

  // One bucket per group (param indices; one dtype each), in launch order. Gradients already present move
  // into the new slices.
  void layout_groups(const std::vector<std::vector<int>>& groups);

  // Every rank must lay out the same buckets: a pass's buckets are checked as one run at the first (see
  // AgreementRun), so the layout itself is compared here, once, naming the ranks whose buckets differ (their
  // options differ: bucket_bytes, first_bucket_bytes, side_values).
  void check_same_layout(const std::string& shape);

  // Puts param i's gradient into its bucket slice, divided by the group size on the way (the buckets are then
  // summed: the average without a pass of its own after the reduction, as DDP's pre-division). ZeRO drops the
  // param's own .grad: its shard lives on in the bucket.
  void take(int i);

  void on_grad_ready(int i);

  void start_pass();

  void launch_ready();

  // Waits for a bucket's reduction (recording it in CommLog); ZeRO-2/3 then let the full bucket go; hsdp
  // all-reduces the reduced shard over the replicas. Called in bucket order.
  void complete(Bucket& b);

  void finish_pass();

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
  // How a bucket of `numel` elements is cut over the group (ZeRO's shards; deterministic data parallel's
  // parts): as evenly as possible; in deterministic mode in whole blocks of kDetBlock elements, so that a
  // block's sum (clipping's norm) and the optimizer's vector loops see the same runs at any group size.
  static constexpr int64_t kDetBlock = 1024;
  std::vector<int64_t> shard_counts(int64_t numel) const;

  // The first pass's arrival order (group rank 0's, so that every rank lays out the same buckets), the params
  // that got none last.
  void rebuild();

  // ZeRO (parallel/zero_shards.cpp) -------------------------------------------------------------------------
  // ZeRO-3: the source the parameters gather through (it keeps `self` alive).
  static std::shared_ptr<tensor::OnDemandSource> make_source(std::shared_ptr<Impl> self);
  // ZeRO-3: copies this rank's part of parameter i's whole value `whole` into its bucket's shard.
  void keep_own_part(int i, const at::Tensor& whole);
  // ZeRO-3: lays the buckets out as units of whole submodules (see unit_pieces in zero_shards.cpp).
  void layout_units(const torch::nn::Module& module);

  // ZeRO-1/2: moves the parameters into one flat buffer per bucket and cuts this rank's shard of each.
  void shard_buckets();

  // ZeRO-3: keeps only this rank's shard of each bucket, its values taken one parameter at a time in
  // registration order (a parameter on the meta device made whole by opts.materialize first, group rank 0's
  // values broadcast), and turns each parameter into an on-demand tensor of `source`. Peak: the shards plus
  // one whole parameter.
  void shard_parameters_only(const std::shared_ptr<tensor::OnDemandSource>& source);

  // A tensor on the meta device made whole: opts.materialize gives its values, group rank 0's are broadcast.
  at::Tensor made_whole(const std::string& name, const at::Tensor& meta);

  // Makes `t` (a module's parameter or buffer, the same tensor the module holds) be `what`. Tensor::set_data
  // refuses a meta tensor becoming another kind, so the implementation is copied over directly then, and
  // the autograd node cached for the old device is dropped.
  static void become(at::Tensor& t, const at::Tensor& what);

  // ZeRO-3: ---------------------------------------------------------------------------------------------
  // A parameter's whole value for an op (OnDemandSource::acquire): its unit (bucket) gathered, or being.
  // Policy, the same on every rank (it depends only on the order of uses, which the model code fixes):
  // - forward and backward are phases (backward: inside the autograd engine); at each change of phase every
  //   unit is let go, so that forward gathers each unit once and backward once again;
  // - in the first pass the order of uses is recorded per phase; from then on, using the unit at position k
  //   starts the all-gather of the unit at k+1 (prefetch), and every gathered unit other than these two is
  //   let go, except units used more than once in the phase (a tied embedding, used first and last), which
  //   stay gathered through it.
  at::Tensor acquire(int i);

  // An op wrote parameter i's whole value (`whole`, what acquire gave; its unit may have been let go since,
  // by another parameter the same op read): this rank's part of it goes back into the shard.
  void written(int i, const at::Tensor& whole);

  void use_unit(int u);

  // The end of a phase's first pass: its order of uses is the plan from now on.
  void end_phase(int phase);

  void start_gather(int u, int phase);

  void ensure_gathered(int u, int phase);

  void finish_gather(int u);

  void release_unit(int u);

  void release_units_locked();

  // After a backward's reductions, and after the optimizer changed the shards.
  void release_units();

  // ZeRO: every rank's updated shard of every bucket to every rank (one run of all_gathers). ZeRO-3 gathers
  // nothing here: gathered units (stale now) are let go, to be gathered when next used.
  void gather_params();
};

}  // namespace dtrain::parallel

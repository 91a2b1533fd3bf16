// ZeRO's state (parallel/zero.h): the shared gradient buckets (detail/grad_buckets.h), each cut into one flat
// shard per rank, and ZeRO's reduction of them: each bucket reduce-scattered to its owners, stage 1 keeping
// the reduced shard in its place in the full bucket, stages 2 and 3 keeping only it (the full bucket lives
// while a backward needs it), stage 3 also keeping only this rank's shard of the parameters and gathering
// them by unit when an op reads them (zero3_units.cpp). hsdp: each reduced shard is then summed over the
// replica group. Private to parallel/.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <vector>

#include "dispatch/on_demand.h"
#include "parallel/detail/grad_buckets.h"

namespace dtrain::parallel::detail {

struct ZeroState final : BucketReduction {
  // ZeRO's part of bucket k: this rank owns elements [start, start + counts[rank]) of the bucket: their
  // reduced gradient (`shard_grad`) and their optimizer state, through `shard_param`. Stages 1 and 2: the
  // parameters live in `params_flat` (the module's parameters are plain tensors on its storage) and
  // shard_param is on it. Stage 3: params_flat is only there while gathered (a unit, see acquire()),
  // shard_param has its own storage, and `gather` is the all-gather filling params_flat while in flight.
  struct Shard {
    at::Tensor params_flat;
    std::vector<int64_t> counts;
    int64_t start = 0;
    at::Tensor shard_grad, shard_param;
    comm::WorkPtr gather;
    comm::WorkPtr replica;  // hsdp: the reduced shard's all-reduce over the replicas
  };

  int stage = 1;
  GradBuckets engine;
  std::vector<Shard> shards;  // per bucket

  // BucketReduction (zero.cpp)
  const char* cause() const override { return "zero"; }
  bool drops_param_grads() const override { return true; }
  bool frees_buckets() const override { return stage >= 2; }
  comm::WorkPtr launch(size_t k, comm::AgreementRun run) override;
  void reduced(size_t k) override;
  void land() override;
  void det_land(size_t k, const at::Tensor& part, const std::vector<int64_t>& counts) override;
  void after_pass() override;

  // Shards (zero_shards.cpp) ------------------------------------------------------------------------------
  // Each bucket's cut over the group and this rank's start in it.
  void cut_buckets();
  // Stages 1 and 2: moves the parameters into one flat buffer per bucket and makes this rank's shard of each.
  void shard_buckets();
  // Stage 3: lays the buckets out as units of whole submodules (see unit_pieces in zero_shards.cpp).
  void layout_units(const torch::nn::Module& module);
  // Stage 3: keeps only this rank's shard of each bucket, its values taken one parameter at a time in
  // registration order (a parameter on the meta device made whole by opts.materialize first, group rank 0's
  // values broadcast), and turns each parameter into an on-demand tensor of `source`. Peak: the shards plus
  // one whole parameter.
  void shard_parameters_only(const std::shared_ptr<dispatch::OnDemandSource>& source);
  // Stage 3: copies this rank's part of parameter i's whole value `whole` into its bucket's shard.
  void keep_own_part(int i, const at::Tensor& whole);
  // Every rank's updated shard of every bucket to every rank (one run of all_gathers). Stage 3 gathers
  // nothing here: gathered units (stale now) are let go, to be gathered when next used.
  void gather_params();

  // Stage 3's units (zero3_units.cpp) ---------------------------------------------------------------------
  // The source the parameters gather through (it keeps `self` alive).
  static std::shared_ptr<dispatch::OnDemandSource> make_source(std::shared_ptr<ZeroState> self);
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

  // Which units are gathered, and the order they were used in, per phase (0: forward, 1: backward), for
  // prefetching. Guarded by units_mu.
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
};

}  // namespace dtrain::parallel::detail

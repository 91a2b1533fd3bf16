// The step model: one candidate's step time and peak memory per rank (docs/planning.md, "The step model").
//
// Time = compute + the tensor-parallel collectives (blocking) + the optimizer + the data-parallel
// collectives that do not hide behind compute. Compute and tp collectives come from the compute model per
// micro-batch; the optimizer's time is its rate times the parameters this rank steps; every collective is
// alpha + beta * bus bytes from the links' profile, across hosts where its group spans them. Overlap, as
// each strategy orders its communication:
//   dp, zero1, zero2  the gradient buckets reduce during the last micro-batch's backward: all but the last
//                     bucket run under it; zero1/2's all-gather after the step does not;
//   zero3, hsdp       each micro-batch gathers every unit in forward (prefetched: all but the first run
//                     under it) and again in backward, where the last micro-batch's reduce-scatters join
//                     them (all but the last run under it); prefetched one unit ahead, they pay no
//                     blocking penalty;
//   tp                blocking: never hidden.
// Each call also costs what it costs inside a real step beyond all this (the ranks' drift, the communication
// threads' turns on shared cores): this model's in-step cost per call, measured for each family of calls (tp,
// tp with sequence parallel, dp's buckets, zero3's units) at two micro-batch sizes and read as a line
// through them (links.in_step, plan/in_step_costs.h); without it, tp's calls pay the profile's blocking
// penalty and the others nothing.
// Of communication that runs under compute, `overlap` x the shorter of the two is hidden: `overlap` (0..1)
// is what this machine achieves (plan/overlap_benchmark.h, measured with the links, not fitted to the runs
// it predicts).
//
// Memory = the data + model state (plan/memory_model.h's formulas over this rank's parameters) + the
// gradients accumulated across micro-batches (one more copy, when accumulation > 1) + the largest gathered
// unit (zero3, hsdp) + the activations of one micro-batch (measured, or counted).
//
// Where the compute profile rehearsed the strategy (plan/rehearse_strategy.h: the same buckets and
// checkpointing, at accumulation 1 and 2), what the rehearsal took beyond these formulas is added: in time,
// per micro-batch and per step (bucket copies, ZeRO-3's dispatch), and in bytes (the strategy's buffers).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/candidate.h"
#include "plan/cluster_profile.h"
#include "plan/compute_model.h"
#include "plan/model_facts.h"

namespace dtrain::plan {

struct Topology {
  int64_t world = 1;
  int64_t ranks_per_host = 1;  // consecutive ranks share a host
  int64_t hosts() const { return (world + ranks_per_host - 1) / ranks_per_host; }
  // Whether a mesh axis's groups span hosts, for a 2-axis mesh over `mesh_ranks` consecutive ranks: the
  // inner axis's groups are `size` consecutive ranks, the outer's strided by the inner size (the whole mesh).
  bool across(bool inner, int64_t size, int64_t mesh_ranks) const {
    if (size <= 1) return false;
    return inner ? size > ranks_per_host || ranks_per_host % size != 0 : mesh_ranks > ranks_per_host;
  }
};

// Sizes of the gradient buckets (or zero3's units) over parameters of `bytes` each, packed in the order
// given: the first bucket up to `first` bytes, the others up to `cap`; a parameter larger than its bucket's
// limit gets a bucket of its own.
std::vector<int64_t> pack_buckets(const std::vector<int64_t>& bytes, int64_t first, int64_t cap);

// The gradient bucket size a run gets when it names none: the Trainer's (25 MiB, or HOROVOD_FUSION_THRESHOLD;
// parallel::with_horovod_env).
int64_t default_bucket_bytes();

// zero3's unit sizes the planner tries: the default (whole modules up to 25 MiB) and about an eighth of a
// rank's parameter bytes (a power of two, at least 64 KiB), so that a small model is not one unit.
std::vector<int64_t> zero3_unit_sizes(const ModelFacts& facts, int64_t tp);

// Fills c's predictions (time, its parts, peak memory and its parts). ValueError when the compute model or
// the links cannot cover the candidate.
void predict(Candidate& c, const ModelFacts& facts, const ComputeModel& compute, const ClusterProfile& links,
             const Topology& topo, double overlap);

}  // namespace dtrain::plan

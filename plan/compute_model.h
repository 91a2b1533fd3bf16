// The compute side of the planner's step model: forward and backward seconds, activation bytes and
// tensor-parallel collectives of one micro-batch on one rank, under a setting (tp split, sequence parallel,
// checkpointing), and the optimizer's seconds. Either measured on this machine (a ComputeProfile, the
// default: plan/measure_compute.h) or, for a cluster that is not here, counted from a transformer's shape
// and a compute rate (dtrain plan --world N --profile FILE).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "plan/compute_profile.h"

namespace dtrain::plan {

class ComputeModel {
 public:
  virtual ~ComputeModel() = default;
  virtual double forward_s(double micro_batch, const ComputeSetting& s) const = 0;
  // Backward, with checkpointing its recomputation included.
  virtual double backward_s(double micro_batch, const ComputeSetting& s) const = 0;
  virtual double activation_bytes(double micro_batch, const ComputeSetting& s) const = 0;
  // The tensor-parallel collectives of one forward and backward (tp > 1).
  virtual std::vector<MeasuredComm> tp_collectives(double micro_batch, const ComputeSetting& s) const = 0;
  // The optimizer's step over `params` parameters.
  virtual double optimizer_s(double params) const = 0;
  virtual bool has(const ComputeSetting& s) const = 0;
  // A strategy's rehearsed step (compute_profile.h); nullptr where none was rehearsed (counted compute).
  virtual const StrategyPoint* rehearsal(const std::string& strategy, int64_t bucket_bytes, bool checkpoint,
                                         int64_t accumulation) const {
    return nullptr;
  }
  // Where the figures come from, for reports: "measured: GPT 4x128 ... (compute-<sig>.json)".
  virtual std::string source() const = 0;
};

std::unique_ptr<ComputeModel> measured_compute(ComputeProfile profile, std::string file);

// A decoder-only transformer's shape, for compute counted rather than measured.
struct TransformerShape {
  int64_t layers = 0, width = 0, heads = 0, seq = 0, vocab = 0;
  int64_t element_bytes = 4;  // activations' and parameters' dtype
};

// Megatron's counts (Narayanan et al. 2021; Korthikanti et al. 2022): per layer and token, forward
// 24 h^2 + 4 s h flops (backward twice that; checkpointing adds a forward), activations
// s b h (34 + 5 a s / h) bytes in 16 bits (scaled to element_bytes; under tp the split parts divided by t,
// under sequence parallel all of them; checkpointing keeps each layer's input and one layer whole), two
// all-reduces of s b h elements per layer forward and two backward (sequence parallel: an all-gather and a
// reduce-scatter for each); the output head 2 s h V flops split over tp. `flops_per_s` and
// `optimizer_s_per_param` come from the profile.
std::unique_ptr<ComputeModel> analytic_compute(const TransformerShape& shape, double flops_per_s,
                                               double optimizer_s_per_param);

}  // namespace dtrain::plan

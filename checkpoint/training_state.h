// A training run's whole state as checkpoint pieces (DESIGN §6): under any strategy of parallel::parallelize,
// each rank's parameters, fp32 masters and optimizer state turned into pieces of global tensors, and back.
// Save under one layout, load under any other: world size, strategy, tensor-parallel degree.
//
//   tensors (global, by the module's parameter names)   saved as
//   model/<name>                                         the parameters, in their dtype
//   master/<name>                                        mixed precision's fp32 masters
//   optim/<state>/<name>                                 the optimizer's state (AdamW: exp_avg, exp_avg_sq)
//   buffer/<name>                                        the module's buffers
//   rng/cpu/rank<r>                                      each rank's CPU generator state
//
// The manifest's meta holds the step, the optimizer's step count and learning rates, the loss scaler and
// the caller's own (the data position). RNG states are restored only at the world size that saved them (a
// rank's stream has no meaning at another); everything else loads anywhere.
#pragma once

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "optim/mixed_precision.h"
#include "parallel/parallelize.h"

namespace dtrain::checkpoint {

struct Resumed {
  std::string dir;  // the step folder loaded
  int64_t step = 0;
  nlohmann::json meta;  // the caller's, as saved
  bool rng_restored = false;
};

class TrainingState {
 public:
  // `mp` may be null (fp32 without a MixedPrecision).
  TrainingState(torch::nn::Module& module, parallel::Parallelized& par, optim::MixedPrecision* mp);
  // Collective: saves step `step` under `root` (step-<step>, `latest`), keeping the newest `keep` (0: all);
  // `meta` is the caller's (a trainer's data position). Returns the step folder.
  std::string save(const std::string& root, int64_t step, const nlohmann::json& meta = {}, int64_t keep = 0);
  // Collective: loads `path` (a step folder, or a root: its `latest`). Nothing is changed on any rank unless
  // every rank read everything it needs and every check passed (names, shapes, checksums).
  Resumed load(const std::string& path);
  // Collective: the parameters from a consolidated safetensors file (dtrain's export, or any file with the
  // module's parameter names and shapes; dtypes are converted), under any layout. The optimizer state and the
  // step stay as they are: a new run starts from these weights.
  void import_weights(const std::string& path);

 private:
  // Where each piece's elements live in this run: which given tensor (parallel::Parallelized::given_tensors)
  // and which elements of it, or a buffer or the random state.
  struct Slot {
    enum Kind { kModel, kMaster, kOptim, kBuffer, kRng } kind;
    size_t k = 0;
    int64_t offset = 0, count = 0;
    std::string state;  // kOptim: the optimizer's name for it (exp_avg, ...)
  };
  // The pieces this rank holds (saving) or will hold (loading: the optimizer's state as it will be once
  // made, in commit), with their slots when `slots` is given.
  std::vector<Piece> pieces(bool for_load, std::vector<Slot>* slots) const;
  // Every rank read everything: the loaded values go in, the optimizer's state is made from them.
  void commit(const std::vector<Piece>& pieces, const std::vector<Slot>& slots,
              const std::vector<at::Tensor>& loaded, const Manifest& m, bool weights_only);

  torch::nn::Module& module_;
  parallel::Parallelized& par_;
  optim::MixedPrecision* mp_;
};

// One process: writes the model of the checkpoint in `step_dir` as one safetensors file `out` (the parameters
// under their names and whole shapes; with master_weights, mixed precision's fp32 masters in their place),
// through a temporary file renamed at the end. Returns the number of tensors.
int64_t export_safetensors(const std::string& step_dir, const std::string& out, bool master_weights);

}  // namespace dtrain::checkpoint

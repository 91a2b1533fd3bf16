// Tensor parallelism as block-level styles (Megatron-LM's layout; PyTorch's parallelize_module), for any
// torch::nn::Module: a plan maps module-name patterns to styles, and each rank keeps its part of the matched
// modules' parameters as plain tensors. The module's own code runs unchanged: ops that read a sharded
// parameter (matmul, addmm, linear, embedding) are intercepted above autograd by the tensor-parallel
// dispatch key, which the sharded parameters carry, and insert the block's collectives around the local op:
//
//   style                     parameter kept             input                  output
//   ColwiseParallel(unit)     weight/bias rows           whole (all-gathered    this rank's output features
//                             (output features)          on the sequence dim    (gather_output: whole)
//                                                        under SP)
//   RowwiseParallel(unit)     weight columns (input      this rank's features   summed over the ranks (all-
//                             features); bias whole                             reduce; under SP reduce-
//                                                                               scattered on the sequence
//                                                                               dim)
//   VocabParallel()           embedding rows (tokens)    token ids, whole       as RowwiseParallel's; used as
//                                                                               an output head (tied): logits
//                                                                               for the loss-parallel cross
//                                                                               entropy (or whole)
//   SequenceParallel()        whole (gradients summed    this rank's part of    an Embedding (positions)
//   keeps
//                             over the ranks)            the sequence           this rank's part of the
//                             sequence
//
// A block written as colwise projections, local work, and a rowwise projection talks exactly as Megatron's:
// one all-reduce in forward (the rowwise output) and one in backward (the input's gradient, reduced once
// for all colwise projections reading the same tensor, e.g. q, k and v); under sequence parallel the
// all-gather / reduce-scatter pair instead. `unit` keeps groups of rows whole: attention's q, k, v and
// output projection use unit = head_dim so that heads are never split (3 heads on 2 ranks: 2 + 1).
//
// What the module's code must allow: shapes read from tensors, not from the configuration (a view by the
// projection's own size, e.g. t.view({B, T, t.size(-1) / head_dim, head_dim})); the ranks of a tensor-
// parallel group see the same input. The sequence dimension is the second to last of an activation
// ([.., T, C]); under sequence parallel every parameter left whole gets its gradient summed over the group
// by finish_gradients() (parallel::Parallelized::step() calls it).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "parallel/strategy_report.h"

namespace dtrain::parallel {

struct TPStyle {
  enum class Kind { kColwise, kRowwise, kVocab, kSequence };
  Kind kind = Kind::kColwise;
  int64_t unit = 1;  // rows (colwise, vocab) or columns (rowwise) kept together
  bool gather_output =
      false;  // colwise: all-gather the output features (a head whose output leaves the model)
  bool loss_parallel = true;  // vocab: as an output head, logits for the loss-parallel cross entropy
};

// Output features sharded (PyTorch's ColwiseParallel, Megatron's ColumnParallelLinear).
TPStyle ColwiseParallel(int64_t unit = 1, bool gather_output = false);
// Input features sharded, output summed (RowwiseParallel, RowParallelLinear).
TPStyle RowwiseParallel(int64_t unit = 1);
// An Embedding's rows sharded (VocabParallelEmbedding). Its weight as an output head (linear(h, wte.weight))
// gives logits that only cross_entropy may read, each rank holding its part of the vocabulary (loss_parallel,
// the default), or the whole logits all-gathered (loss_parallel = false).
TPStyle VocabParallel(bool loss_parallel = true);
// Parameters whole; runs on this rank's part of the sequence (LayerNorm, position Embedding).
TPStyle SequenceParallel();
std::string to_string(const TPStyle& s);

struct TensorParallelPlan {
  // Module-name patterns ("h*.attn.q": '*' matches within one name component) and their styles.
  std::vector<std::pair<std::string, TPStyle>> styles;
  bool sequence_parallel = false;  // activations between blocks sharded on the sequence dim
};

// Applies `plan` to `module` over the ranks of `group` (each keeps its part of the matched modules'
// parameters). Errors, before anything is changed: a pattern that names no module, a module matched twice, a
// style the module's parameters cannot take (no 2-d weight; rows not a multiple of unit; fewer units than
// ranks), SequenceParallel without plan.sequence_parallel. ValueError naming the pattern, module and shape.
class TensorParallel {
 public:
  TensorParallel(torch::nn::Module& module, comm::BackendPtr group, TensorParallelPlan plan);
  ~TensorParallel();
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  // Sequence parallel: sums the gradients of the parameters left whole over the group (one all-reduce);
  // a no-op otherwise. Call after the last backward of a step, before the optimizer.
  void finish_gradients();
  // What finish_gradients() issues per step (strategy_report.h): under sequence parallel one all-reduce of
  // the whole parameters' gradients; nothing otherwise.
  std::vector<StepCollective> step_collectives() const;
  const TensorParallelPlan& plan() const { return plan_; }
  const comm::BackendPtr& group() const { return group_; }
  // One line per sharded module: "h0.attn.q  colwise(unit 16)  weight [64, 64] -> [32, 64]".
  std::string describe() const;
  // This rank's part of `name`'s parameter along its split dim as (start, count, global size), or
  // count = -1 for a parameter left whole.
  struct Part {
    int dim = -1;
    int64_t start = 0, count = -1, global = 0;
  };
  Part part_of(const std::string& param_name) const;
  // Whether `t` is (the module's tensor of) a parameter this layout split.
  bool is_sharded(const at::Tensor& t) const;

  struct State;

 private:
  TensorParallelPlan plan_;
  comm::BackendPtr group_;
  std::shared_ptr<State> state_;
};

// Whether '*'-pattern `pattern` matches module name `name` ('*' matches any run of characters without '.').
bool tp_pattern_matches(const std::string& pattern, const std::string& name);

}  // namespace dtrain::parallel

// One training step as a graph of the aten ops that DTensor's handler ran (issue 32, the sharding solver's
// input; docs/planning.md, "Recording a step"). The step runs on DTensors (a module distributed on a mesh,
// tensor/distribute_module.h); every top-level op the handler sees, in forward, backward and the optimizer's
// step, becomes a RecordedOp, and every tensor state it reads or writes a RecordedValue: a tensor written in
// place becomes a new value, so the record is a data-flow graph in which each value has one producer.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/backend.h"
#include "tensor/sharding_rules.h"

namespace dtrain::plan {

struct RecordedValue {
  std::vector<int64_t> sizes;  // global (a DTensor's), or a plain tensor's own
  std::string dtype;           // "Float"
  int64_t element_size = 4;    // bytes per element
  std::string placements;      // "(R)", "(S(0), R)"; empty for a plain tensor
  int producer = -1;           // the op that produced it; -1: it came from outside the step (parameters,
                               // inputs, the optimizer's state, constants)
  int previous = -1;           // written in place: the value of the same tensor it replaced
  std::string name;            // what the caller named the tensor (a parameter's name), or empty
};

struct RecordedOp {
  std::string name;                // "aten::addmm", "aten::add_.Tensor"
  std::vector<int> inputs;         // the values it read, in argument order (lists flattened)
  std::vector<int> outputs;        // the values it produced: its returns, and the new state of what it wrote
  std::vector<int> output_return;  // per output: the index of the return it is (-1: written, not returned)
  double seconds = 0;              // the handler's time on it while recorded (one rank, placements as run)
  bool view = false;               // its returns are views of an input (they allocate nothing)
  // Recorded for a mesh shape (record_step's `mesh_shape`): every way the sharding rules let the op run on
  // such a mesh (tensor/op_choices.h). `ruled` false: no rule applies, and the handler would run it on
  // gathered inputs. choices[c].inputs[k] is the placement of inputs[choice_inputs[k]] (0-d plain tensors,
  // scalars, have none); choices[c].outputs[r] that of its r-th return.
  bool ruled = false;
  std::vector<tensor::Choice> choices;
  std::vector<int> choice_inputs;
};

struct StepRecord {
  std::vector<RecordedOp> ops;
  std::vector<RecordedValue> values;

  // The values the step read without producing them, in the order it first read them.
  std::vector<int> outside_values() const;
  // How many ops of each name ran.
  std::map<std::string, int> op_counts() const;
};

// Runs `step` once and records the ops DTensor's handler ran on this thread meanwhile (with backward on the
// CPU, the caller's thread runs it too). The step must run on DTensors: an empty record is an error that says
// so.
// With a `mesh_shape`, each op's choices on a mesh of that shape are recorded too. `named` tensors (a
// module's named_parameters(), say) give their names to the values they hold.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
StepRecord record_step(const std::function<void()>& step, const std::vector<int64_t>& mesh_shape = {},
                       const NamedTensors& named = {});

// The step at `batch` samples without running it there: `step(b)` runs one step at b samples. It runs once at
// `small` (the optimizer's state is made), then is recorded at `small` and at 2 x `small`, and every dim that
// doubled between the two records is scaled to `batch` (a dim of the batch, or of the batch times the
// sequence); the others are the same at any batch. Ops that differ between the two records, or a dim that
// changes otherwise, are an error naming the op. Costs three steps at a small batch. The ops' choices (for
// `mesh_shape`) are those of both records: the rules take uneven shards, so a dim's size does not change
// which placements an op can take, but a dim of size 1 may (a view that drops it keeps a shard it could not
// keep at another size).
StepRecord record_step_at(const std::function<void(int64_t batch)>& step, int64_t batch, int64_t small = 1,
                          const std::vector<int64_t>& mesh_shape = {}, const NamedTensors& named = {});

// Makes every rank's record of the step time its ops alike: rank 0's op seconds go to every rank of `group`
// (a broadcast). Each rank records on its own and its clock differs, and the solver must get the same problem
// on every rank to give them the same plan. ValueError when the ranks recorded different numbers of ops.
void share_op_times(StepRecord& record, comm::Backend& group);

}  // namespace dtrain::plan

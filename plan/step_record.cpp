// record_step; see step_record.h.
#include "plan/step_record.h"

#include <ATen/ATen.h>

#include <unordered_map>

#include "core/error.h"
#include "plan/detail/rank0_values.h"
#include "tensor/dtensor.h"
#include "tensor/op_choices.h"
#include "tensor/op_observer.h"
#include "tensor/placement.h"

namespace dtrain::plan {

namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// Which value a live tensor holds now. A tensor is known by its TensorImpl: the weak reference kept here
// keeps that address from being reused by another tensor while the recording lasts.
struct Tracked {
  WeakImpl impl;
  int value;
};

class Recorder {
 public:
  Recorder(std::vector<int64_t> mesh_shape, const NamedTensors& named) : mesh_shape_(std::move(mesh_shape)) {
    for (const auto& [name, t] : named) {
      if (t.defined()) names_[identity(t).unsafeGetTensorImpl()] = name;
    }
  }

  void observe(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
               const std::vector<c10::IValue>& rets, double seconds) {
    const auto& schema = op.schema();
    const auto& name = schema.operator_name();
    RecordedOp rec;
    rec.name = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
    rec.seconds = seconds;
    for (const auto& ret : schema.returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) rec.view = true;
    }
    const int index = static_cast<int>(record_.ops.size());
    // Inputs first, all of them as they were before the op (a written argument is read too).
    std::vector<at::Tensor> written;
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& alias = schema.arguments()[i].alias_info();
      const bool writes = alias && alias->isWrite();
      for_each(args[i], [&](const at::Tensor& t) {
        // (the handler's DTensor arguments: DTensors, and plain tensors other than scalars it does not write)
        if (tensor::is_dtensor(t) || (t.dim() > 0 && !writes))
          rec.choice_inputs.push_back(static_cast<int>(rec.inputs.size()));
        rec.inputs.push_back(value_of(t));
        if (writes) written.push_back(t);
      });
    }
    if (!mesh_shape_.empty()) {
      torch::jit::Stack stack(args.begin(), args.end());
      if (auto c = tensor::op_choices(op, stack, mesh_shape_)) {
        rec.ruled = true;
        rec.choices = std::move(c->choices);
        if (rec.choices[0].inputs.size() != rec.choice_inputs.size()) {
          throw ValueError(
              str_cat("record_step: ", rec.name, " has ", rec.choices[0].inputs.size(),
                      " placed inputs in its rule and ", rec.choice_inputs.size(),
                      " in the record (a tensor list of optional tensors?): it cannot be planned."));
        }
      }
    }
    if (!rec.ruled) rec.choice_inputs.clear();
    // Then what it produced: the new state of each written argument, and each return that is not one of them.
    for (const at::Tensor& t : written) {
      rec.outputs.push_back(produce(t, index));
      rec.output_return.push_back(-1);
    }
    for (size_t r = 0; r < rets.size(); ++r) {
      for_each(rets[r], [&](const at::Tensor& t) {
        for (size_t w = 0; w < written.size(); ++w) {
          if (identity(written[w]).unsafeGetTensorImpl() == identity(t).unsafeGetTensorImpl()) {  // (counted)
            rec.output_return[w] = static_cast<int>(r);
            return;
          }
        }
        rec.outputs.push_back(produce(t, index));
        rec.output_return.push_back(static_cast<int>(r));
      });
    }
    record_.ops.push_back(std::move(rec));
  }

  StepRecord take() { return std::move(record_); }

 private:
  template <class F>
  static void for_each(const c10::IValue& v, F&& f) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) f(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (t.defined()) f(t);
      }
    } else if (v.isList()) {  // Tensor?[]
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor() && e.toTensor().defined()) f(e.toTensor());
      }
    }
  }

  int new_value(const at::Tensor& t, int producer) {
    RecordedValue v;
    v.sizes = t.sizes().vec();
    v.dtype = c10::toString(t.scalar_type());
    v.element_size = static_cast<int64_t>(t.element_size());
    if (tensor::is_dtensor(t)) v.placements = tensor::to_string(tensor::placements_of(t));
    v.producer = producer;
    record_.values.push_back(std::move(v));
    return static_cast<int>(record_.values.size()) - 1;
  }

  // What identifies `t`'s state: a DTensor's stored block, which its shallow copies share (an optimizer
  // writes p.data(), a new tensor object on the parameter's block), or a plain tensor itself.
  static at::Tensor identity(const at::Tensor& t) {
    return tensor::is_dtensor(t) ? tensor::stored_block(t) : t;
  }

  // The value `t` holds now; one from outside the step the first time it is read.
  int value_of(const at::Tensor& t) {
    const at::Tensor id = identity(t);
    auto it = live_.find(id.unsafeGetTensorImpl());
    if (it != live_.end()) return it->second.value;
    const int v = new_value(t, -1);
    if (auto n = names_.find(id.unsafeGetTensorImpl()); n != names_.end()) record_.values[v].name = n->second;
    live_.insert_or_assign(id.unsafeGetTensorImpl(), Tracked{WeakImpl(id.getIntrusivePtr()), v});
    return v;
  }

  // `t`'s new value, produced by op `op`.
  int produce(const at::Tensor& t, int op) {
    const at::Tensor id = identity(t);
    auto it = live_.find(id.unsafeGetTensorImpl());
    const int previous = it != live_.end() ? it->second.value : -1;
    const int v = new_value(t, op);
    record_.values[v].previous = previous;
    live_.insert_or_assign(id.unsafeGetTensorImpl(), Tracked{WeakImpl(id.getIntrusivePtr()), v});
    return v;
  }

  std::vector<int64_t> mesh_shape_;
  std::unordered_map<const c10::TensorImpl*, std::string> names_;  // (the named tensors outlive the record)
  StepRecord record_;
  std::unordered_map<const c10::TensorImpl*, Tracked> live_;
};

}  // namespace

std::vector<int> StepRecord::outside_values() const {
  std::vector<int> out;
  std::vector<bool> seen(values.size(), false);
  for (const RecordedOp& op : ops) {
    for (int v : op.inputs) {
      if (values[v].producer < 0 && !seen[v]) {
        seen[v] = true;
        out.push_back(v);
      }
    }
  }
  return out;
}

std::map<std::string, int> StepRecord::op_counts() const {
  std::map<std::string, int> n;
  for (const RecordedOp& op : ops) ++n[op.name];
  return n;
}

StepRecord record_step(const std::function<void()>& step, const std::vector<int64_t>& mesh_shape,
                       const NamedTensors& named) {
  Recorder recorder(mesh_shape, named);
  {
    tensor::ObserveOps watch([&](const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                 const std::vector<c10::IValue>& rets,
                                 double seconds) { recorder.observe(op, args, rets, seconds); });
    step();
  }
  StepRecord r = recorder.take();
  if (r.ops.empty()) {
    throw ValueError(
        "record_step: the step ran no op on a DTensor, so there is nothing to record. Distribute the module "
        "on a mesh first (tensor::distribute_module) and feed it its inputs as DTensors.");
  }
  return r;
}

StepRecord record_step_at(const std::function<void(int64_t)>& step, int64_t batch, int64_t small,
                          const std::vector<int64_t>& mesh_shape, const NamedTensors& named) {
  if (small < 1 || batch < 1) {
    throw ValueError(
        str_cat("record_step_at: batch ", batch, " and small batch ", small, " must both be at least 1."));
  }
  step(small);  // (the optimizer's state is made by its first step; the steady step is recorded)
  StepRecord a = record_step([&] { step(small); }, mesh_shape, named);
  const StepRecord b = record_step([&] { step(2 * small); }, mesh_shape);
  auto op_at = [](const StepRecord& r, size_t i) {
    return i < r.ops.size() ? str_cat("#", i, " ", r.ops[i].name) : std::string("none (the step ended)");
  };
  for (size_t i = 0; i < std::max(a.ops.size(), b.ops.size()); ++i) {
    if (i < a.ops.size() && i < b.ops.size() && a.ops[i].name == b.ops[i].name &&
        a.ops[i].inputs == b.ops[i].inputs && a.ops[i].outputs == b.ops[i].outputs) {
      continue;
    }
    throw ValueError(str_cat("record_step_at: the step runs other ops at batch ", small, " than at batch ",
                             2 * small, ": op ", op_at(a, i), " against ", op_at(b, i),
                             ". Its ops must not depend on the batch size (no branch on the batch's size "
                             "or values) for its record to stand for batch ",
                             batch, "."));
  }
  // An op's choices: those it has at both batches (a dim of size 1 at the small one lets a view shard where
  // it could not at any other size).
  for (size_t i = 0; i < a.ops.size(); ++i) {
    std::vector<tensor::Choice> kept;
    for (const tensor::Choice& c : a.ops[i].choices) {
      for (const tensor::Choice& d : b.ops[i].choices) {
        if (c.inputs == d.inputs && c.outputs == d.outputs) {
          kept.push_back(c);
          break;
        }
      }
    }
    a.ops[i].choices = std::move(kept);
    if (a.ops[i].choices.empty()) {
      a.ops[i].ruled = false;
      a.ops[i].choice_inputs.clear();
    }
  }
  // An op's time at `batch`: a line through its times at the two batches (a time that fell between them is
  // the clock's noise: the smaller one stands).
  for (size_t i = 0; i < a.ops.size(); ++i) {
    const double slope = std::max(0.0, (b.ops[i].seconds - a.ops[i].seconds) / static_cast<double>(small));
    a.ops[i].seconds = std::min(a.ops[i].seconds, b.ops[i].seconds) +
                       slope * static_cast<double>(std::max<int64_t>(batch - small, 0));
  }
  for (size_t v = 0; v < a.values.size(); ++v) {
    std::vector<int64_t>& sizes = a.values[v].sizes;
    const std::vector<int64_t>& twice = b.values[v].sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes.size() != twice.size() ||
          (twice[d] != sizes[d] && (twice[d] != 2 * sizes[d] || sizes[d] % small))) {
        const int producer = a.values[v].producer;
        throw ValueError(str_cat(
            "record_step_at: a tensor ",
            producer < 0 ? std::string("from outside the step") : str_cat("made by op ", op_at(a, producer)),
            " has shape ", c10::IntArrayRef(sizes), " at batch ", small, " and ", c10::IntArrayRef(twice),
            " at batch ", 2 * small,
            ": its dims neither stay nor grow with the batch, so the record cannot "
            "be scaled. Record the step at its own batch (record_step)."));
      }
      if (twice[d] != sizes[d]) sizes[d] = sizes[d] / small * batch;
    }
  }
  return a;
}

void share_op_times(StepRecord& record, comm::Backend& group) {
  std::vector<double> seconds;
  for (const RecordedOp& op : record.ops) seconds.push_back(op.seconds);
  detail::take_rank0_values(
      seconds, group, "share_op_times", "ops of the step",
      "the ranks ran different steps. Record the same step, on the same shapes, on every "
      "rank.");
  for (size_t i = 0; i < seconds.size(); ++i) record.ops[i].seconds = seconds[i];
}

}  // namespace dtrain::plan

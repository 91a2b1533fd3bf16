// Loss parallel (tensor_parallel.h, VocabParallel(true)): the head's logits stay split by vocabulary, marked
// with kLossParallelKey and their layout; cross_entropy on them is computed over the parts (the row max and
// the sums all-reduced), and any other op but a view is refused, as it would see one part of the vocabulary.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <chrono>

#include "comm/comm_log.h"
#include "core/error.h"
#include "core/log.h"
#include "dispatch/keys.h"
#include "parallel/detail/tp.h"

namespace dtrain::parallel::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;
constexpr c10::DispatchKey kLP = dispatch::kLossParallelKey;

at::Tensor all_reduce_copy(const at::Tensor& x, const comm::BackendPtr& group, const std::string& cause,
                           comm::ReduceOp op) {
  at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
  comm::AllReduceOptions o;
  o.op = op;
  comm::CommCause in_log(cause);
  group->all_reduce(y, o)->wait();
  return y;
}

using Stack = torch::jit::Stack;

// Loss-parallel logits: this rank's vocabulary columns [start, start + count) of `global`.
struct LogitsInfo {
  comm::BackendPtr group;
  std::string cause;
  int64_t start = 0, count = 0, global = 0;
};
struct LogitsMeta : c10::BackendMeta {  // on the logits' TensorImpl
  explicit LogitsMeta(LogitsInfo info) : info(std::move(info)) {}
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return c10::make_intrusive<LogitsMeta>(info);
  }
  LogitsInfo info;
};
struct LogitsHolder : torch::CustomClassHolder {  // through autograd functions
  explicit LogitsHolder(LogitsInfo info) : info(std::move(info)) {}
  LogitsInfo info;
};
c10::IValue hold_logits(LogitsInfo info) {
  return c10::IValue::make_capsule(c10::make_intrusive<LogitsHolder>(std::move(info)));
}
const LogitsInfo& held_logits(const c10::IValue& v) {
  return static_cast<const LogitsHolder*>(v.toCapsule().get())->info;
}

// Marks logits as loss-parallel (kLossParallelKey, LogitsMeta); identity for autograd.
struct MarkLogits : torch::autograd::Function<MarkLogits> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, c10::IValue info) {
    at::Tensor y = dispatch::with_layout_keys(x.detach(), c10::DispatchKeySet(kLP));
    y.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<LogitsMeta>(held_logits(info)));
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

// Cross entropy over logits split by vocabulary: the row max (all-reduce max), then the sum of exponentials
// and the target's logit (one all-reduce of both); backward is local (softmax minus the one-hot target).
struct LossParallelCrossEntropy : torch::autograd::Function<LossParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            c10::IValue info, int64_t reduction, int64_t ignore_index) {
    c10::impl::ExcludeDispatchKeyGuard guard(kLP);
    const LogitsInfo& m = held_logits(info);
    const std::string cause = m.cause + " (loss parallel)";
    at::Tensor l = logits.detach();
    at::Tensor mx = all_reduce_copy(std::get<0>(l.max(1)), m.group, cause, comm::ReduceOp::kMax);
    at::Tensor e = (l - mx.unsqueeze(1)).exp();
    at::Tensor in_range = (target >= m.start) & (target < m.start + m.count);
    at::Tensor local = at::where(in_range, target - m.start, at::zeros_like(target));
    at::Tensor mine = l.gather(1, local.unsqueeze(1)).squeeze(1) * in_range.to(l.scalar_type());
    at::Tensor both = all_reduce_copy(at::stack({e.sum(1), mine}), m.group, cause, comm::ReduceOp::kSum);
    at::Tensor valid = (target != ignore_index).to(l.scalar_type());
    at::Tensor per = (both[0].log() + mx - both[1]) * valid;
    const double n_valid = valid.sum().item<double>();
    ctx->save_for_backward({e / both[0].unsqueeze(1), local, in_range, valid});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["n_valid"] = n_valid;
    if (reduction == at::Reduction::None) return per;
    return reduction == at::Reduction::Sum ? per.sum() : per.sum() / n_valid;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();
    grad.scatter_add_(1, saved[1].unsqueeze(1), -saved[2].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(saved[3].unsqueeze(1));
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    if (reduction == at::Reduction::None) {
      grad.mul_(g[0].unsqueeze(1));
    } else {
      grad.mul_(reduction == at::Reduction::Sum ? g[0] : g[0] / ctx->saved_data["n_valid"].toDouble());
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// cross_entropy_loss(logits, target, weight, reduction, ignore_index, label_smoothing) on loss-parallel
// logits.
void cross_entropy_kernel(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  const at::Tensor logits = arg(s, 6, 0), target = arg(s, 6, 1), weight = arg(s, 6, 2);
  const int64_t reduction = (*s)[s->size() - 3].toInt();
  const int64_t ignore = (*s)[s->size() - 2].toSymInt().expect_int();
  const double smoothing = (*s)[s->size() - 1].toDouble();
  c10::TensorImpl* base =
      logits.is_view() ? logits._base().unsafeGetTensorImpl() : logits.unsafeGetTensorImpl();
  auto* meta = dynamic_cast<LogitsMeta*>(base->get_backend_meta());
  DTRAIN_ASSERT(meta != nullptr, "loss-parallel logits without their layout");
  if (weight.defined() || smoothing != 0.0 || logits.dim() != 2 || target.dim() != 1 ||
      logits.size(1) != meta->info.count) {
    throw NotSupportedError(str_cat(
        rank_prefix(),
        " tensor parallel: the loss-parallel cross entropy takes logits [N, vocabulary part] (got ",
        logits.sizes(), ", this rank's part ", meta->info.count, ") and targets [N] (got ", target.sizes(),
        "), without class weights or label smoothing. Flatten the logits to [-1, size(-1)], or use "
        "VocabParallel(/*loss_parallel=*/false) for whole logits."));
  }
  finish(s, 6, LossParallelCrossEntropy::apply(logits, target, hold_logits(meta->info), reduction, ignore));
}

// Loss-parallel logits: views pass, anything else would see one part of the vocabulary.
void loss_parallel_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* s) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  const bool view = !args.empty() && rets.size() == 1 && args[0].alias_info() != nullptr &&
                    rets[0].alias_info() != nullptr && !args[0].alias_info()->isWrite();
  if (view) return op.redispatchBoxed(ks.remove(kLP), s);
  throw ValueError(
      str_cat(rank_prefix(), " tensor parallel: ", schema.name(),
              " on loss-parallel logits (each rank holds its part of the vocabulary): only views and "
              "cross_entropy may read them. For whole logits (sampling, accuracy) use "
              "VocabParallel(/*loss_parallel=*/false)."));
}

}  // namespace

at::Tensor mark_loss_parallel(const at::Tensor& y, const comm::BackendPtr& group, const std::string& module,
                              int64_t start, int64_t count, int64_t global) {
  return MarkLogits::apply(y, hold_logits(LogitsInfo{group, module, start, count, global}));
}

void register_loss_parallel_kernels() {
  static torch::Library refuse(torch::Library::IMPL, "_", kLP, __FILE__, __LINE__);
  refuse.fallback(torch::CppFunction::makeFromBoxedFunction<&loss_parallel_fallback>());
  static torch::Library loss(torch::Library::IMPL, "aten", kLP, __FILE__, __LINE__);
  loss.impl("cross_entropy_loss", torch::CppFunction::makeFromBoxedFunction<&cross_entropy_kernel>());
}

}  // namespace dtrain::parallel::detail

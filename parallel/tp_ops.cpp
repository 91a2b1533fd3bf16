// The kernels of tensor parallelism (tensor_parallel.h): on kTensorParallelKey, matmul, mm, addmm, linear and
// embedding with a styled weight wrap the local op in its block's collectives (the loss-parallel cross
// entropy is in tp_loss.cpp). Every other op falls through the key. The collectives are autograd functions
// (Megatron's f and g, and the sequence-parallel all-gather / reduce-scatter pair), so that backward issues
// each one's dual.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <chrono>

#include "comm/along_dim.h"
#include "comm/comm_log.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "core/log.h"
#include "dispatch/keys.h"
#include "parallel/detail/tp.h"

namespace dtrain::parallel::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;
constexpr c10::DispatchKey kTP = dispatch::kTensorParallelKey;

// What a region function needs: the group, the module it runs for (CommLog's cause), and for the
// sequence-dim and feature-dim collectives the dim and every rank's length along it.
struct Holder : torch::CustomClassHolder {
  comm::BackendPtr group;  // (not the TPGroup: its region cache may hold the graph that holds this)
  std::string cause;
  int64_t dim = -1;
  std::vector<int64_t> lens;
  int64_t start = 0;  // this rank's offset along dim (feature gathers)
};

c10::IValue hold(const std::shared_ptr<TPGroup>& tp, std::string cause, int64_t dim = -1,
                 std::vector<int64_t> lens = {}, int64_t start = 0) {
  auto h = c10::make_intrusive<Holder>();
  h->group = tp->group;
  h->cause = std::move(cause);
  h->dim = dim;
  h->lens = std::move(lens);
  h->start = start;
  return c10::IValue::make_capsule(std::move(h));
}

const Holder& held(const c10::IValue& v) { return *static_cast<const Holder*>(v.toCapsule().get()); }

at::Tensor all_reduce_copy(const at::Tensor& x, const Holder& h, comm::ReduceOp op = comm::ReduceOp::kSum) {
  at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
  comm::AllReduceOptions o;
  o.op = op;
  comm::CommCause cause(h.cause);
  h.group->all_reduce(y, o)->wait();
  return y;
}

// Every rank's part along `dim` (lens[r] long), concatenated in rank order (comm/along_dim.h).
at::Tensor gather_dim(const at::Tensor& x, const Holder& h) {
  comm::CommCause cause(h.cause);
  at::Tensor out =
      comm::all_gather_along(h.group, x, h.dim, h.lens, str_cat("tensor parallel (", h.cause, ")"));
  return out;
}

// This rank's part along `dim` of the sum over the ranks of `x` (whole along dim).
at::Tensor reduce_scatter_dim(const at::Tensor& x, const Holder& h) {
  comm::CommCause cause(h.cause);
  return comm::reduce_scatter_along(h.group, x, h.dim, h.lens, comm::ReduceOp::kSum,
                                    str_cat("tensor parallel (", h.cause, ")"));
}

// Megatron's f: identity forward; the input's gradient is the sum of every rank's part (all-reduce).
struct ReduceGradRegion : torch::autograd::Function<ReduceGradRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue h) {
    ctx->saved_data["h"] = std::move(h);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduce_copy(g[0], held(ctx->saved_data["h"])), at::Tensor()};
  }
};

// Megatron's g: the sum of every rank's part forward (all-reduce); identity backward.
struct ReduceRegion : torch::autograd::Function<ReduceRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, c10::IValue h) {
    return all_reduce_copy(x, held(h));
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

// Sequence parallel's all-gather on the sequence dim; backward reduce-scatters the gradient.
struct GatherRegion : torch::autograd::Function<GatherRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue h) {
    ctx->saved_data["h"] = h;
    return gather_dim(x, held(h));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {reduce_scatter_dim(g[0], held(ctx->saved_data["h"])), at::Tensor()};
  }
};

// Sequence parallel's reduce-scatter on the sequence dim; backward all-gathers the gradient.
struct ScatterRegion : torch::autograd::Function<ScatterRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue h) {
    ctx->saved_data["h"] = h;
    return reduce_scatter_dim(x, held(h));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {gather_dim(g[0], held(ctx->saved_data["h"])), at::Tensor()};
  }
};

// A colwise module's whole output features (gather_output); backward keeps this rank's part.
struct GatherFeatures : torch::autograd::Function<GatherFeatures> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue h) {
    ctx->saved_data["h"] = h;
    return gather_dim(x, held(h));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const Holder& h = held(ctx->saved_data["h"]);
    return {g[0].narrow(-1, h.start, h.lens[h.group->group_rank()]).contiguous(), at::Tensor()};
  }
};

// x @ wt (+ b) on this rank's part of a styled weight (wt: [in, out]), with its backward, both with the
// tensor-parallel key excluded: autograd's own formulas would run the weight's products through the kernels
// below again.
struct LocalLinear : torch::autograd::Function<LocalLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& wt,
                            const std::optional<at::Tensor>& bias) {
    c10::impl::ExcludeDispatchKeyGuard guard(kTP);
    ctx->save_for_backward({x, wt});
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->saved_data["bias"] = has_bias;
    if (x.dim() == 2 && has_bias) return at::addmm(*bias, x, wt);
    at::Tensor y = at::matmul(x, wt);
    return has_bias ? y.add_(*bias) : y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    c10::impl::ExcludeDispatchKeyGuard guard(kTP);
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &wt = saved[1], &gy = g[0];
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = at::matmul(gy, wt.t());
    at::Tensor g2 = gy.reshape({-1, gy.size(-1)});
    if (ctx->needs_input_grad(1)) gw = at::mm(x.reshape({-1, x.size(-1)}).t(), g2);
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) gb = g2.sum(0);
    return {gx, gw, gb};
  }
};

bool active(const ParamRole& r) { return r.tp->group->group_size() > 1; }

// The input of a colwise module: under sequence parallel the whole sequence (all-gather), else `x` itself
// with a gradient summed over the ranks. Made once for every colwise module reading the same tensor.
at::Tensor input_region(const at::Tensor& x, const ParamRole& r) {
  TPGroup& tp = *r.tp;
  if (!active(r)) return x;
  const bool sp = tp.sequence_parallel;
  const bool grad = at::GradMode::is_enabled();
  if (!sp && !(grad && x.requires_grad())) return x;
  std::lock_guard<std::mutex> lock(tp.mu);
  for (const auto& reg : tp.regions) {
    if (reg.source.lock().get() == x.unsafeGetTensorImpl() && reg.version == x._version() &&
        reg.grad == grad) {
      if (auto kept = reg.result.lock()) return at::Tensor(std::move(kept));
    }
  }
  at::Tensor out;
  const std::string cause = r.module;
  if (sp) {
    if (tp.seq_len < 0) {
      throw ValueError(
          str_cat(rank_prefix(), " tensor parallel: '", r.module,
                  "' needs the whole sequence, but no sequence-parallel embedding or rowwise module "
                  "split one on this rank. Under sequence parallel the sequence enters through a "
                  "VocabParallel or SequenceParallel embedding."));
    }
    out = GatherRegion::apply(x, hold(r.tp, cause, -2, split_lengths(tp.seq_len, tp.group->group_size())));
  } else {
    out = ReduceGradRegion::apply(x, hold(r.tp, cause));
  }
  tp.regions.push_back(TPGroup::Region{
      c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr()), static_cast<uint32_t>(x._version()),
      grad, c10::weak_intrusive_ptr<c10::TensorImpl>(out.getIntrusivePtr()), grad ? at::Tensor() : out});
  if (tp.regions.size() > 4) tp.regions.erase(tp.regions.begin());
  return out;
}

// The output of a rowwise module (or a vocabulary-parallel lookup): summed over the ranks; under sequence
// parallel, this rank's part of the sequence of the sum.
at::Tensor output_region(const at::Tensor& y, const ParamRole& r) {
  if (!active(r)) return y;
  TPGroup& tp = *r.tp;
  if (!tp.sequence_parallel) return ReduceRegion::apply(y, hold(r.tp, r.module));
  if (y.dim() < 2) {
    throw ValueError(str_cat(rank_prefix(), " tensor parallel: '", r.module, "' gives ", y.sizes(),
                             "; sequence parallel needs [.., sequence, features]."));
  }
  {
    std::lock_guard<std::mutex> lock(tp.mu);
    tp.seq_len = y.size(-2);
  }
  return ScatterRegion::apply(y, hold(r.tp, r.module, -2, split_lengths(y.size(-2), tp.group->group_size())));
}

std::vector<int64_t> feature_lens(const ParamRole& r) {
  std::vector<int64_t> lens;
  const int64_t n = r.tp->group->group_size();
  for (int64_t k : split_lengths(r.global / r.style.unit, n)) lens.push_back(k * r.style.unit);
  return lens;
}

std::string where(const ParamRole& r) { return str_cat("'", r.module, "' (", to_string(r.style), ")"); }

// x @ wt (+ bias) where wt is a styled weight transposed ([in, out] locally).
at::Tensor tp_linear(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& bias, const ParamRole& r) {
  auto local = [](const at::Tensor& a, const at::Tensor& w, const at::Tensor& b) {
    return LocalLinear::apply(a, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  };
  if (wt.dim() != 2) {
    throw NotSupportedError(str_cat(rank_prefix(), " tensor parallel: ", where(r), " weight used as ",
                                    wt.sizes(), "; only a linear map x @ weight.t() is supported."));
  }
  switch (r.style.kind) {
    case TPStyle::Kind::kColwise:
    case TPStyle::Kind::kVocab: {
      if (r.dim != 0 || wt.size(1) != r.count) break;
      at::Tensor y = local(input_region(x, r), wt, bias);
      if (!active(r)) return y;
      if (r.style.kind == TPStyle::Kind::kVocab && r.style.loss_parallel) {
        return mark_loss_parallel(y, r.tp->group, r.module, r.start, r.count, r.global);
      }
      if (r.style.kind == TPStyle::Kind::kVocab || r.style.gather_output) {
        return GatherFeatures::apply(y, hold(r.tp, r.module, -1, feature_lens(r), r.start));
      }
      return y;
    }
    case TPStyle::Kind::kRowwise: {
      if (r.dim != 1 || wt.size(0) != r.count) break;
      if (x.size(-1) != r.count) {
        throw ValueError(str_cat(rank_prefix(), " tensor parallel: ", where(r), " gets input ", x.sizes(),
                                 " with ", x.size(-1), " features, but this rank's part of its weight takes ",
                                 r.count, " of ", r.global,
                                 ": its input must be a colwise module's local output."));
      }
      at::Tensor y = output_region(local(x, wt, at::Tensor()), r);
      return bias.defined() ? y + bias : y;
    }
    case TPStyle::Kind::kSequence:
      break;
  }
  throw NotSupportedError(str_cat(rank_prefix(), " tensor parallel: ", where(r), " weight ", wt.sizes(),
                                  " used in a product its style does not lay out (only x @ weight.t())."));
}

using Stack = torch::jit::Stack;

// The role of a weight, nullptr for a tensor without the key; a tensor with the key but no known role is
// refused rather than multiplied as if it were whole.
std::shared_ptr<const ParamRole> weight_role(const c10::OperatorHandle& op, const at::Tensor& w) {
  if (!w.defined() || !w.key_set().has(kTP)) return nullptr;
  auto r = role_of(w);
  if (!r) {
    throw NotSupportedError(
        str_cat(rank_prefix(), " tensor parallel: ", op.schema().name(),
                " reads a tensor-parallel parameter's part whose layout is unknown: its TensorParallel was "
                "destroyed, "
                "or it is a view libtorch does not track (made under InferenceMode). Keep the layout "
                "(parallelize()'s "
                "result) alive while the module runs, and use NoGradGuard rather than InferenceMode."));
  }
  return r;
}

void refuse_left_weight(const c10::OperatorHandle& op, const at::Tensor& self) {
  if (auto r = weight_role(op, self)) {
    throw NotSupportedError(str_cat(rank_prefix(), " tensor parallel: ", op.schema().name(), " with ",
                                    where(*r),
                                    "'s weight as its left operand; only x @ weight.t() is laid out."));
  }
}

// matmul(x, w.t()) and mm(x, w.t()).
void matmul_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* s) {
  const at::Tensor self = arg(s, 2, 0), other = arg(s, 2, 1);
  auto r = weight_role(op, other);
  if (!r) {
    refuse_left_weight(op, self);
    return op.redispatchBoxed(ks.remove(kTP), s);
  }
  finish(s, 2, tp_linear(self, other, at::Tensor(), *r));
}

// addmm(bias, x, w.t(), beta, alpha)
void addmm_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* s) {
  const at::Tensor bias = arg(s, 5, 0), x = arg(s, 5, 1), wt = arg(s, 5, 2);
  auto r = weight_role(op, wt);
  if (!r) {
    refuse_left_weight(op, x);
    return op.redispatchBoxed(ks.remove(kTP), s);
  }
  const c10::Scalar beta = (*s)[s->size() - 2].toScalar(), alpha = (*s)[s->size() - 1].toScalar();
  if (beta.toDouble() != 1.0 || alpha.toDouble() != 1.0) {
    throw NotSupportedError(str_cat(rank_prefix(), " tensor parallel: addmm with beta ", beta.toDouble(),
                                    " and alpha ", alpha.toDouble(), " on ", where(*r), "; only 1 and 1."));
  }
  finish(s, 5, tp_linear(x, wt, bias, *r));
}

// linear(x, w, bias)
void linear_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* s) {
  const at::Tensor x = arg(s, 3, 0), w = arg(s, 3, 1), bias = arg(s, 3, 2);
  auto r = weight_role(op, w);
  if (!r) return op.redispatchBoxed(ks.remove(kTP), s);
  at::Tensor wt;
  {
    c10::impl::ExcludeDispatchKeyGuard guard(kTP);
    wt = w.t();
  }
  finish(s, 3, tp_linear(x, wt, bias, *r));
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
void embedding_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, Stack* s) {
  const at::Tensor w = arg(s, 5, 0), idx = arg(s, 5, 1);
  auto rp = weight_role(op, w);
  if (!rp) return op.redispatchBoxed(ks.remove(kTP), s);
  const ParamRole& r = *rp;
  const int64_t padding = (*s)[s->size() - 3].toSymInt().expect_int();
  const bool scale = (*s)[s->size() - 2].toBool(), sparse = (*s)[s->size() - 1].toBool();
  c10::impl::ExcludeDispatchKeyGuard guard(kTP);
  if (r.style.kind == TPStyle::Kind::kSequence) {
    at::Tensor e = at::embedding(w, idx, padding, scale, sparse);
    if (!active(r) || !r.tp->sequence_parallel) return finish(s, 5, e);
    if (e.dim() < 2) {
      throw ValueError(str_cat(rank_prefix(), " tensor parallel: ", where(r), " looks up ", idx.sizes(),
                               "; sequence parallel needs a sequence of indices."));
    }
    const int64_t T = e.size(-2), n = r.tp->group->group_size(), me = r.tp->group->group_rank();
    {
      std::lock_guard<std::mutex> lock(r.tp->mu);
      r.tp->seq_len = T;
    }
    const int64_t start = balanced_part(T, n, me).start;
    return finish(s, 5, e.narrow(-2, start, split_lengths(T, n)[me]));
  }
  if (r.style.kind != TPStyle::Kind::kVocab || r.dim != 0) {
    throw NotSupportedError(str_cat(rank_prefix(), " tensor parallel: embedding lookup in ", where(r),
                                    "'s weight; give the Embedding VocabParallel() or SequenceParallel()."));
  }
  if (scale || sparse) {
    throw NotSupportedError(
        str_cat(rank_prefix(), " tensor parallel: ", where(r),
                " with scale_grad_by_freq or sparse gradients is not supported; turn them off."));
  }
  at::Tensor in_range = (idx >= r.start) & (idx < r.start + r.count);
  at::Tensor local = at::where(in_range, idx - r.start, at::zeros_like(idx));
  const int64_t pad = padding >= r.start && padding < r.start + r.count ? padding - r.start : -1;
  at::Tensor e = at::embedding(w, local, pad, false, false) * in_range.unsqueeze(-1).to(w.scalar_type());
  finish(s, 5, output_region(e, r));
}

}  // namespace

void ensure_tp_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library through(torch::Library::IMPL, "_", kTP, __FILE__, __LINE__);
    through.fallback(torch::CppFunction::makeFallthrough());
    static torch::Library ops(torch::Library::IMPL, "aten", kTP, __FILE__, __LINE__);
    ops.impl("matmul", torch::CppFunction::makeFromBoxedFunction<&matmul_kernel>());
    ops.impl("mm", torch::CppFunction::makeFromBoxedFunction<&matmul_kernel>());
    ops.impl("addmm", torch::CppFunction::makeFromBoxedFunction<&addmm_kernel>());
    ops.impl("linear", torch::CppFunction::makeFromBoxedFunction<&linear_kernel>());
    ops.impl("embedding", torch::CppFunction::makeFromBoxedFunction<&embedding_kernel>());
    register_loss_parallel_kernels();
  });
}

}  // namespace dtrain::parallel::detail

// Tensor-parallel plans and parameters; see tensor_parallel.h. The kernels are in tp_ops.cpp.
#include "parallel/tensor_parallel.h"

#include <ATen/ATen.h>

#include <chrono>
#include <map>
#include <sstream>

#include "comm/comm_log.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "core/log.h"
#include "dispatch/keys.h"
#include "parallel/data_parallel.h"
#include "parallel/detail/grad_buckets.h"
#include "parallel/detail/tp.h"

namespace dtrain::parallel {

TPStyle ColwiseParallel(int64_t unit, bool gather_output) {
  return TPStyle{TPStyle::Kind::kColwise, unit, gather_output, true};
}
TPStyle RowwiseParallel(int64_t unit) { return TPStyle{TPStyle::Kind::kRowwise, unit, false, true}; }
TPStyle VocabParallel(bool loss_parallel) { return TPStyle{TPStyle::Kind::kVocab, 1, false, loss_parallel}; }
TPStyle SequenceParallel() { return TPStyle{TPStyle::Kind::kSequence, 1, false, true}; }

std::string to_string(const TPStyle& s) {
  switch (s.kind) {
    case TPStyle::Kind::kColwise:
      return str_cat("ColwiseParallel(unit ", s.unit, s.gather_output ? ", gather_output)" : ")");
    case TPStyle::Kind::kRowwise:
      return str_cat("RowwiseParallel(unit ", s.unit, ")");
    case TPStyle::Kind::kVocab:
      return s.loss_parallel ? "VocabParallel(loss parallel)" : "VocabParallel(whole logits)";
    case TPStyle::Kind::kSequence:
      return "SequenceParallel()";
  }
  return "?";
}

bool tp_pattern_matches(const std::string& pattern, const std::string& name) {
  // '*' matches a run of characters other than '.'; everything else matches itself.
  std::vector<std::vector<bool>> memo(pattern.size() + 1, std::vector<bool>(name.size() + 1, false));
  memo[pattern.size()][name.size()] = true;
  for (size_t i = pattern.size(); i-- > 0;) {
    for (size_t j = name.size() + 1; j-- > 0;) {
      if (pattern[i] == '*') {
        memo[i][j] = memo[i + 1][j] || (j < name.size() && name[j] != '.' && memo[i][j + 1]);
      } else {
        memo[i][j] = j < name.size() && name[j] == pattern[i] && memo[i + 1][j + 1];
      }
    }
  }
  return memo[0][0];
}

namespace detail {

namespace {
std::mutex g_roles_mu;
std::map<const c10::TensorImpl*, std::shared_ptr<const ParamRole>>& roles() {
  static std::map<const c10::TensorImpl*, std::shared_ptr<const ParamRole>> r;
  return r;
}
}  // namespace

void register_role(const c10::TensorImpl* impl, ParamRole role) {
  std::lock_guard<std::mutex> lock(g_roles_mu);
  roles()[impl] = std::make_shared<const ParamRole>(std::move(role));
}

void unregister_role(const c10::TensorImpl* impl) {
  std::lock_guard<std::mutex> lock(g_roles_mu);
  roles().erase(impl);
}

std::shared_ptr<const ParamRole> role_of(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  const c10::TensorImpl* impl = t.is_view() ? t._base().unsafeGetTensorImpl() : t.unsafeGetTensorImpl();
  std::lock_guard<std::mutex> lock(g_roles_mu);
  auto it = roles().find(impl);
  if (it == roles().end() && t.is_view()) it = roles().find(t.unsafeGetTensorImpl());
  return it == roles().end() ? nullptr : it->second;
}

std::vector<int64_t> split_lengths(int64_t length, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < n; ++r) out.push_back(balanced_part(length, n, r).count);
  return out;
}

}  // namespace detail

struct TensorParallel::State {
  std::shared_ptr<detail::TPGroup> tp;
  struct Sharded {
    std::string module, param;
    TPStyle style;
    at::Tensor tensor;  // the module's parameter (this rank's part)
    std::vector<int64_t> global_sizes;
    Part part;
  };
  std::vector<Sharded> sharded;
  std::vector<at::Tensor> whole;  // parameters left whole (their gradients summed under sequence parallel)
  std::vector<std::string> whole_names;
  std::vector<at::Tensor> registered;  // every parameter with a role (detail::register_role)
};

namespace {

// The style's split of a module's parameter: the dim, or -1 to keep it whole.
int split_dim(const TPStyle& s, const std::string& param) {
  switch (s.kind) {
    case TPStyle::Kind::kColwise:
      return param == "weight" || param == "bias" ? 0 : -1;
    case TPStyle::Kind::kRowwise:
      return param == "weight" ? 1 : -1;
    case TPStyle::Kind::kVocab:
      return param == "weight" ? 0 : -1;
    case TPStyle::Kind::kSequence:
      return -1;
  }
  return -1;
}

// This rank's part of `size` rows in groups of `unit`, checked.
TensorParallel::Part part_for(const std::string& what, const TPStyle& s, int dim, int64_t size, int64_t n,
                              int64_t me) {
  if (s.unit < 1 || size % s.unit != 0) {
    throw ValueError(str_cat("tensor parallel: ", what, " has ", size, " rows along dim ", dim,
                             ", not a multiple of ", to_string(s), "'s unit ", s.unit,
                             ". Use a unit that divides ", size, " (attention: the head size)."));
  }
  const int64_t units = size / s.unit;
  if (units < n) {
    throw ValueError(str_cat("tensor parallel: ", what, " has ", units, " units of ", s.unit, " along dim ",
                             dim, ", fewer than the ", n,
                             " ranks of the group: each rank needs at least one. Use a ",
                             "tensor-parallel degree of at most ", units, "."));
  }
  Range r = balanced_part(units, n, me);
  return TensorParallel::Part{dim, r.start * s.unit, r.count * s.unit, size};
}

}  // namespace

TensorParallel::TensorParallel(torch::nn::Module& module, comm::BackendPtr group, TensorParallelPlan plan)
    : plan_(std::move(plan)), group_(std::move(group)), state_(std::make_shared<State>()) {
  if (!group_) throw ValueError("tensor parallel: the group is null.");
  if (plan_.styles.empty()) {
    throw ValueError(
        "tensor parallel: the plan names no module. Map module-name patterns to styles, e.g. "
        "{\"h*.attn.q\", ColwiseParallel(head_dim)}.");
  }
  const int64_t n = group_->group_size(), me = group_->group_rank();
  state_->tp = std::make_shared<detail::TPGroup>();
  state_->tp->group = group_;
  state_->tp->sequence_parallel = plan_.sequence_parallel;

  // Match every pattern first, so that a bad plan changes nothing.
  const auto modules = module.named_modules("", /*include_self=*/false);
  std::map<std::string, std::pair<std::string, TPStyle>> chosen;  // module -> (pattern, style)
  std::map<std::string, std::shared_ptr<torch::nn::Module>> by_name;
  for (const auto& item : modules) by_name[item.key()] = item.value();
  for (const auto& [pattern, style] : plan_.styles) {
    if (style.kind == TPStyle::Kind::kSequence && !plan_.sequence_parallel) {
      throw ValueError(str_cat("tensor parallel: '", pattern,
                               "' is SequenceParallel() but the plan's sequence_parallel is off. Set "
                               "plan.sequence_parallel = true, or leave the module out of the plan."));
    }
    int matched = 0;
    for (const auto& [name, m] : by_name) {
      if (!tp_pattern_matches(pattern, name)) continue;
      ++matched;
      if (auto it = chosen.find(name); it != chosen.end()) {
        throw ValueError(str_cat("tensor parallel: module '", name, "' is matched by both '",
                                 it->second.first, "' and '", pattern,
                                 "'. Make the patterns name each module once."));
      }
      chosen[name] = {pattern, style};
    }
    if (matched == 0) {
      std::string some;
      int k = 0;
      for (const auto& [name, m] : by_name) {
        if (k++ < 8) some += (some.empty() ? "" : ", ") + name;
      }
      throw ValueError(str_cat("tensor parallel: the plan's pattern '", pattern,
                               "' names no module of the model (", by_name.size(), " modules: ", some,
                               by_name.size() > 8 ? ", ..." : "",
                               "). Use the module names of named_modules(); '*' matches within one name."));
    }
  }
  // Check each style against its module's parameters, then shard.
  struct Todo {
    std::string module, param;
    TPStyle style;
    at::Tensor tensor;
    Part part;
  };
  std::vector<Todo> todo;
  for (const auto& [name, ps] : chosen) {
    const auto& [pattern, style] = ps;
    const auto params = by_name[name]->named_parameters(/*recurse=*/false);
    const at::Tensor* weight = params.find("weight");
    if (style.kind != TPStyle::Kind::kSequence && (weight == nullptr || weight->dim() != 2)) {
      throw ValueError(
          str_cat("tensor parallel: ", to_string(style), " (pattern '", pattern, "') needs module '", name,
                  "' to have a 2-d parameter 'weight' (a Linear or an Embedding); it has ",
                  weight == nullptr ? std::string("none") : str_cat("one of shape ", weight->sizes()),
                  ". Give the style to the Linear or Embedding inside it."));
    }
    for (const auto& p : params) {
      const int dim = split_dim(style, p.key());
      const std::string what = str_cat("module '", name, "' (", to_string(style), ") parameter '", p.key(),
                                       "' ", p.value().sizes());
      if (dim >= p.value().dim())
        throw ValueError(str_cat("tensor parallel: ", what, " has no dim ", dim, "."));
      if (style.kind == TPStyle::Kind::kColwise && p.key() == "bias" &&
          p.value().size(0) != weight->size(0)) {
        throw ValueError(str_cat("tensor parallel: ", what, " does not match its weight's ", weight->size(0),
                                 " output features."));
      }
      Part part = dim < 0 ? Part{} : part_for(what, style, dim, p.value().size(dim), n, me);
      todo.push_back(Todo{name, p.key(), style, p.value(), part});
    }
  }
  detail::ensure_tp_kernels();
  at::NoGradGuard no_grad;
  for (auto& t : todo) {
    at::Tensor param = t.tensor;
    const auto global = param.sizes().vec();
    state_->registered.push_back(param);
    if (t.part.dim >= 0) {
      at::Tensor local = param.detach().narrow(t.part.dim, t.part.start, t.part.count).clone();
      param.set_data(dispatch::with_layout_keys(local, c10::DispatchKeySet(dispatch::kTensorParallelKey)));
    } else if (t.style.kind == TPStyle::Kind::kVocab || t.style.kind == TPStyle::Kind::kSequence) {
      // whole, but an embedding's lookups still need the style (the sequence part)
      if (t.param == "weight") {
        param.set_data(
            dispatch::with_layout_keys(param.detach(), c10::DispatchKeySet(dispatch::kTensorParallelKey)));
      }
    }
    detail::register_role(
        param.unsafeGetTensorImpl(),
        detail::ParamRole{t.style, t.module, t.param, t.part.dim, t.part.start, t.part.count,
                          t.part.dim >= 0 ? global[t.part.dim] : 0, state_->tp});
    if (t.part.dim >= 0) {
      state_->sharded.push_back(State::Sharded{t.module, t.param, t.style, param, global, t.part});
    }
  }
  for (const auto& p : module.named_parameters()) {
    bool sharded = false;
    for (const auto& s : state_->sharded) sharded = sharded || s.tensor.is_same(p.value());
    if (!sharded) {
      state_->whole.push_back(p.value());
      state_->whole_names.push_back(p.key());
    }
  }
}

TensorParallel::~TensorParallel() {
  for (const auto& t : state_->registered) detail::unregister_role(t.unsafeGetTensorImpl());
}

std::vector<StepCollective> TensorParallel::step_collectives() const {
  if (!plan_.sequence_parallel || group_->group_size() == 1) return {};
  int64_t bytes = 0;
  for (const auto& p : state_->whole) {
    if (p.requires_grad()) bytes += p.numel() * p.element_size();
  }
  if (bytes == 0) return {};
  return {{"tp sequence-parallel gradients", "all_reduce", 1, bytes, group_->group_size()}};
}

void TensorParallel::finish_gradients() {
  if (!plan_.sequence_parallel || group_->group_size() == 1) return;
  std::vector<at::Tensor> grads;
  for (const auto& p : state_->whole) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flat_parts;
  for (const auto& g : grads) flat_parts.push_back(g.reshape({-1}));
  at::Tensor flat = at::cat(flat_parts);
  {
    comm::CommCause cause("tp sequence-parallel gradients");
    group_->all_reduce(flat)->wait();
  }
  int64_t off = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, off, g.numel()).view(g.sizes()));
    off += g.numel();
  }
}

std::string TensorParallel::describe() const {
  std::ostringstream out;
  for (const auto& s : state_->sharded) {
    std::vector<int64_t> local = s.global_sizes;
    local[s.part.dim] = s.part.count;
    out << "  " << s.module << "." << s.param << "  " << to_string(s.style) << "  "
        << c10::IntArrayRef(s.global_sizes) << " -> " << c10::IntArrayRef(local) << "\n";
  }
  return out.str();
}

bool TensorParallel::is_sharded(const at::Tensor& t) const {
  for (const auto& s : state_->sharded) {
    if (s.tensor.is_same(t)) return true;
  }
  return false;
}

TensorParallel::Part TensorParallel::part_of(const std::string& param_name) const {
  for (const auto& s : state_->sharded) {
    if (s.module + "." + s.param == param_name) return s.part;
  }
  return Part{};
}

}  // namespace dtrain::parallel

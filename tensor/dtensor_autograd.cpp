// Differentiable to_local, from_local and redistribute (DESIGN §4: "each step's backward is its dual"). The
// backward of a redistribution A -> B redistributes the gradient from B back to A, except that a Partial axis
// of A receives a Replicate gradient (every part of a sum has the sum's gradient); from_local's backward is
// the gradient's block, and to_local's backward wraps the block's gradient with the DTensor's placements.
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dtensor_meta.h"

namespace dtrain::tensor {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Placements travel through the autograd context as (kind, dim, op) triples.
c10::List<int64_t> encode(const Placements& p) {
  c10::List<int64_t> out;
  for (const auto& x : p) {
    out.push_back(static_cast<int64_t>(x.kind));
    out.push_back(x.dim);
    out.push_back(static_cast<int64_t>(x.op));
  }
  return out;
}

Placements decode(const c10::IValue& v) {
  auto list = v.toIntList();
  Placements out;
  for (size_t i = 0; i + 2 < list.size(); i += 3) {
    out.push_back(Placement{static_cast<Placement::Kind>(list.get(i)), static_cast<int>(list.get(i + 1)),
                            static_cast<ReduceOp>(list.get(i + 2))});
  }
  return out;
}

// The gradient layout for an input laid out as `p`: Partial axes get Replicate.
Placements grad_placements(Placements p) {
  for (auto& x : p) {
    if (x.is_partial()) x = Replicate();
  }
  return p;
}

struct RedistributeFn : torch::autograd::Function<RedistributeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Placements& to) {
    ctx->saved_data["from"] = encode(placements_of(x));
    return detail::redistribute_raw(x, to);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Placements back = grad_placements(decode(ctx->saved_data["from"]));
    at::Tensor g = grads[0];
    return {is_dtensor(g) ? detail::redistribute_raw(g, back) : g, at::Tensor()};
  }
};

// from_local's parts: the tensor is the reduction of the ranks' blocks over each Partial axis, so a block's
// gradient is the tensor's gradient (sum), divided by the axis's size (avg). Through max and min it would go
// only where the extreme came from: not supported (from_local refuses it).
struct FromLocalFn : torch::autograd::Function<FromLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, MeshPtr mesh,
                            const Placements& placements, const std::optional<std::vector<int64_t>>& shape) {
    ctx->saved_data["placements"] = encode(placements);
    int64_t avg_parts = 1;
    for (size_t a = 0; a < placements.size(); ++a) {
      if (placements[a].is_partial() && placements[a].op == ReduceOp::kAvg)
        avg_parts *= mesh->size(static_cast<int>(a));
    }
    ctx->saved_data["avg_parts"] = avg_parts;
    return detail::from_local_raw(local, std::move(mesh), placements, shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor g = grads[0];
    if (is_dtensor(g)) {
      g = detail::to_local_raw(
          detail::redistribute_raw(g, grad_placements(decode(ctx->saved_data["placements"]))));
    }
    const int64_t avg_parts = ctx->saved_data["avg_parts"].toInt();
    if (avg_parts > 1 && g.defined()) g = g / static_cast<double>(avg_parts);
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ToLocalFn : torch::autograd::Function<ToLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->saved_data["shape"] = c10::List<int64_t>(x.sizes().vec());
    ctx->saved_data["placements"] = encode(placements_of(x));
    ctx->saved_data["x"] = x.detach();  // keeps the mesh reachable
    return detail::to_local_raw(x).view_as(detail::to_local_raw(x));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor x = ctx->saved_data["x"].toTensor();
    auto shape = ctx->saved_data["shape"].toIntList().vec();
    return {detail::make_dtensor(grads[0].contiguous(), mesh_of(x), decode(ctx->saved_data["placements"]),
                                 shape)};
  }
};

}  // namespace

at::Tensor redistribute(const at::Tensor& t, const Placements& placements) {
  if (!is_dtensor(t)) return detail::redistribute_raw(t, placements);  // its error names the problem
  return detail::reporting_failures(mesh_of(t), [&] {
    if (!t.requires_grad() || !at::GradMode::is_enabled()) return detail::redistribute_raw(t, placements);
    return RedistributeFn::apply(t, placements);
  });
}

at::Tensor from_local(const at::Tensor& local, MeshPtr mesh, Placements placements,
                      std::optional<std::vector<int64_t>> global_shape) {
  if (!mesh)
    return detail::from_local_raw(local, std::move(mesh), std::move(placements), std::move(global_shape));
  return detail::reporting_failures(mesh, [&] {
    if (!local.requires_grad() || !at::GradMode::is_enabled()) {
      return detail::from_local_raw(local, mesh, placements, global_shape);
    }
    for (const Placement& p : placements) {
      if (p.is_partial() && (p.op == ReduceOp::kMax || p.op == ReduceOp::kMin)) {
        throw NotSupportedError(str_cat(
            rank_prefix(), " from_local: a block that requires grad cannot be wrapped as ",
            to_string(placements), ": the gradient through ", p.to_string(),
            " would go only to the rank holding the extreme value, which dtrain does not compute. Wrap it as "
            "Partial(sum) or Partial(avg), reduce it first (redistribute to Replicate), or detach the "
            "block."));
      }
    }
    return FromLocalFn::apply(local, mesh, placements, global_shape);
  });
}

at::Tensor to_local(const at::Tensor& t) {
  if (!t.requires_grad() || !at::GradMode::is_enabled()) return detail::to_local_raw(t);
  return ToLocalFn::apply(t);
}

}  // namespace dtrain::tensor

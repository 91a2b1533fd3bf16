// Views and shape ops. See sharding_rules.h. P below stands for every Partial op (these ops are linear).
//
//   op                          per-axis options (inputs -> outputs)
//   view, _unsafe_view,         R -> R; P -> P; S(d) -> S(d') where the view merges or splits a group
//     _reshape_alias            of dims, d is the group's first input dim of a size above 1 and d' its
//                               first such output dim, when every coordinate's block is exactly the
//                               output's block (checked over the mesh); the block is viewed (never
//                               copied: libtorch's meta kernel has already refused a view the global
//                               strides forbid), _unsafe_view reshapes
//   expand                      R -> R; P -> P; S(d) -> S(d + new leading dims) where d is not broadcast
//   t, transpose, permute       R -> R; P -> P; S(d) -> S(where d goes)
//   unsqueeze, squeeze          R -> R; P -> P; S(d) -> S(d shifted), d not squeezed; the block squeezes the
//                               global tensor's size-1 dims, never its own
//   split, split_with_sizes,    R -> R; P -> P; S(d) -> S(d') for d other than the split/sliced/selected dim
//     unbind, slice, select
//   cat, stack                  all R -> R; all P -> P; all S(d) -> S(d') for d other than the joined dim
//   tril, triu (and in place)   R -> R; P -> P; S(d) -> S(d), the diagonal shifted by the block's offset
//   as_strided                  R -> R; P -> P, on the block laid out in the input's global geometry (a copy)
#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>

#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "tensor/shard_math.h"
#include "tensor/sharding_rules.h"

namespace dtrain::tensor::rules {

namespace {

// R -> R and P -> P for every reduce op (n inputs alike).
std::vector<AxisStrategy> base_options(size_t n = 1) { return identity_options(0, n); }

// Options mapping input dim d to output dim map(d) (-1: may not stay sharded).
template <typename F>
std::vector<AxisStrategy> mapped_options(size_t in_ndim, F map, size_t n = 1) {
  auto s = base_options(n);
  for (size_t d = 0; d < in_ndim; ++d) {
    int64_t to = map(static_cast<int64_t>(d));
    if (to >= 0) {
      s.push_back({std::vector<Placement>(n, Shard(static_cast<int>(d))), Shard(static_cast<int>(to))});
    }
  }
  return s;
}

// A view's groups: input dims [i0, i1) hold the same elements as output dims [o0, o1); `is` and `os` are the
// first dims of each side that are not of size 1 (the group's leading size-1 dims hold no layout: [1, 512]
// viewed as [512] shards on 1 where [512] shards on 0), or i0 and o0 where every dim is.
struct Group {
  size_t i0, i1, o0, o1, is, os;
};

std::vector<Group> view_groups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<Group> g;
  size_t i = 0, o = 0;
  while (i < in.size() || o < out.size()) {
    Group x{i, i, o, o};
    int64_t pi = 1, po = 1;
    if (i < in.size()) pi *= in[i++];
    if (o < out.size()) po *= out[o++];
    while (pi != po) {
      if ((pi < po && i < in.size()) || o >= out.size()) {
        pi *= in[i++];
      } else {
        po *= out[o++];
      }
      if (i >= in.size() && o >= out.size()) break;
    }
    x.i1 = i;
    x.o1 = o;
    x.is = x.i0;
    while (x.is + 1 < x.i1 && in[x.is] == 1) ++x.is;
    x.os = x.o0;
    while (x.os + 1 < x.o1 && out[x.os] == 1) ++x.os;
    g.push_back(x);
  }
  return g;
}

int64_t product(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t k = from; k < to; ++k) p *= v[k];
  return p;
}

RuleResult view_rule(const RuleCall& c) {
  const std::vector<int64_t> in = c.input_shapes[0], out = c.out_shape();
  auto s = base_options();
  const bool empty = product(in, 0, in.size()) == 0;
  std::vector<Group> groups = empty ? std::vector<Group>{} : view_groups(in, out);
  for (const auto& g : groups) {
    if (g.i1 > g.i0 && g.o1 > g.o0)
      s.push_back({{Shard(static_cast<int>(g.is))}, Shard(static_cast<int>(g.os))});
  }
  RuleResult r(std::move(s));
  std::vector<int64_t> mesh_shape = c.mesh_shape;
  r.valid = [in, out, groups, mesh_shape](const Choice& ch) {
    bool sharded = false;
    for (const auto& p : ch.inputs[0]) sharded |= p.is_shard();
    if (!sharded) return true;
    // Every coordinate's block must be the output's block: per group, the same range of the flattened group.
    int64_t n = std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1}, std::multiplies<>());
    std::vector<int64_t> coord(mesh_shape.size());
    for (int64_t lin = 0; lin < n; ++lin) {
      int64_t rest = lin;
      for (int a = static_cast<int>(mesh_shape.size()) - 1; a >= 0; --a) {
        coord[a] = rest % mesh_shape[a];
        rest /= mesh_shape[a];
      }
      auto ci = local_chunk(in, mesh_shape, ch.inputs[0], coord);
      auto co = local_chunk(out, mesh_shape, ch.outputs[0], coord);
      for (const auto& g : groups) {
        if (g.i1 == g.i0 || g.o1 == g.o0) continue;
        // (the dims before is and os are of size 1: whole on every coordinate)
        int64_t inner_i = product(in, g.is + 1, g.i1), inner_o = product(out, g.os + 1, g.o1);
        if (ci.offset[g.is] * inner_i != co.offset[g.os] * inner_o ||
            ci.shape[g.is] * inner_i != co.shape[g.os] * inner_o) {
          return false;
        }
      }
    }
    return true;
  };
  // view and _reshape_alias are views of the block, as in libtorch (in-place writes through them reach the
  // base); _unsafe_view reshapes a fresh copy, which may itself be copied.
  r.run = [out](const c10::OperatorHandle& op, torch::jit::Stack& stack, const Choice& ch,
                const MeshPtr& mesh) {
    at::Tensor local = stack[0].toTensor();
    auto shape = local_chunk(out, mesh->shape(), ch.outputs[0], mesh->coordinate()).shape;
    stack.clear();
    if (op.schema().name() == "aten::_unsafe_view") {
      stack.emplace_back(local.reshape(shape));
      return;
    }
    if (!at::detail::computeStride(local.sizes(), local.strides(), shape)) {
      throw NotSupportedError(str_cat(
          rank_prefix(), " DTensor: ", op.schema().name(), ": this rank's block of shape ", local.sizes(),
          " and strides ", local.strides(), " cannot be viewed as ", c10::IntArrayRef(shape),
          ", although the DTensor's global layout allows it (the block was laid out differently, e.g. by "
          "from_local() of a non-contiguous tensor). Call .contiguous() on the block before from_local(), or "
          "use reshape()."));
    }
    stack.emplace_back(local.view(shape));
  };
  return r;
}

RuleResult expand_rule(const RuleCall& c) {
  const auto& in = c.input_shapes[0];
  const auto& out = c.out_shape();
  const int64_t lead = static_cast<int64_t>(out.size() - in.size());
  RuleResult r = mapped_options(in.size(), [&](int64_t d) { return in[d] == out[d + lead] ? d + lead : -1; });
  r.localize = [out, mesh_shape = c.mesh_shape](torch::jit::Stack& args, const Choice& ch,
                                                const std::vector<int64_t>& coord) {
    args[1] = c10::IValue(local_chunk(out, mesh_shape, ch.outputs[0], coord).shape);
  };
  return r;
}

RuleResult transpose_rule(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  int64_t i = 0, j = ndim > 1 ? 1 : 0;
  const auto& args = *c.args;
  if (args.size() >= 3 && args[1].isInt()) {
    i = norm_dim(args[1].toInt(), ndim);
    j = norm_dim(args[2].toInt(), ndim);
  }
  return mapped_options(ndim, [&](int64_t d) { return d == i ? j : d == j ? i : d; });
}

RuleResult permute_rule(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  std::vector<int64_t> dims = (*c.args)[1].toIntVector();
  return mapped_options(ndim, [&](int64_t d) {
    for (size_t k = 0; k < dims.size(); ++k) {
      if (norm_dim(dims[k], ndim) == d) return static_cast<int64_t>(k);
    }
    return int64_t{-1};
  });
}

RuleResult unsqueeze_rule(const RuleCall& c) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  int64_t at = norm_dim((*c.args)[1].toInt(), ndim + 1);
  return mapped_options(ndim, [&](int64_t d) { return d >= at ? d + 1 : d; });
}

// squeeze(), squeeze.dim, squeeze.dims: the dims removed are the named (or all) dims of size 1.
RuleResult squeeze_rule(const RuleCall& c) {
  const auto& in = c.input_shapes[0];
  const int64_t ndim = static_cast<int64_t>(in.size());
  std::vector<bool> removed(ndim, false);
  const auto& args = *c.args;
  std::vector<int64_t> named;
  if (args.size() > 1 && args[1].isInt()) named = {args[1].toInt()};
  if (args.size() > 1 && args[1].isIntList()) named = args[1].toIntVector();
  if (args.size() == 1) {
    for (int64_t d = 0; d < ndim; ++d) named.push_back(d);
  }
  std::vector<int64_t> dims;  // the dims the global tensor loses
  for (int64_t d : named) {
    d = norm_dim(d, ndim);
    if (d < ndim && in[d] == 1 && !removed[d]) {
      removed[d] = true;
      dims.push_back(d);
    }
  }
  RuleResult r = mapped_options(ndim, [&](int64_t d) {
    if (removed[d]) return int64_t{-1};
    int64_t before = 0;
    for (int64_t k = 0; k < d; ++k) before += removed[k];
    return d - before;
  });
  // The block squeezes exactly the global tensor's dims: an uneven shard of one row (7 rows on 4 ranks)
  // has a size-1 dim that the global tensor does not, and must keep it.
  r.run = [dims](const c10::OperatorHandle&, torch::jit::Stack& stack, const Choice&, const MeshPtr&) {
    at::Tensor local = stack[0].toTensor();
    stack.clear();
    stack.emplace_back(at::squeeze(local, dims));
  };
  return r;
}

// Ops along one dim (argument `dim_arg`): split, slice, select, unbind keep other dims' shards; select and
// unbind remove their dim.
RuleResult along_rule(const RuleCall& c, size_t dim_arg, bool removes) {
  const int64_t ndim = static_cast<int64_t>(c.input_shapes[0].size());
  const auto& args = *c.args;
  int64_t dim = args.size() > dim_arg && args[dim_arg].isInt() ? norm_dim(args[dim_arg].toInt(), ndim) : 0;
  return mapped_options(ndim, [&](int64_t d) {
    if (d == dim) return int64_t{-1};
    return removes && d > dim ? d - 1 : d;
  });
}

// cat(tensors, dim) and stack(tensors, dim): every input alike.
RuleResult join_rule(const RuleCall& c, bool adds_dim) {
  const size_t n = c.input_shapes.size();
  const int64_t ndim = static_cast<int64_t>(c.out_shape().size()) - (adds_dim ? 1 : 0);
  int64_t dim = norm_dim((*c.args)[1].toInt(), static_cast<int64_t>(c.out_shape().size()));
  for (const auto& s : c.input_shapes) {  // legacy cat skips 1-d empty inputs: keep those replicated
    if (static_cast<int64_t>(s.size()) != ndim) return base_options(n);
  }
  return mapped_options(
      ndim,
      [&](int64_t d) {
        if (!adds_dim) return d == dim ? int64_t{-1} : d;
        return d >= dim ? d + 1 : d;
      },
      n);
}

// tril/triu(x, diagonal): a block at (row offset r, column offset c) keeps the elements with
// (r + i) - (c + j) on the kept side of the diagonal, i.e. its own diagonal shifted by c - r.
RuleResult triangle_rule(const RuleCall& c) {
  const auto& in = c.input_shapes[0];
  RuleResult r = mapped_options(in.size(), [](int64_t d) { return d; });
  r.localize = [in, mesh_shape = c.mesh_shape](torch::jit::Stack& args, const Choice& ch,
                                               const std::vector<int64_t>& coord) {
    auto chunk = local_chunk(in, mesh_shape, ch.inputs[0], coord);
    const size_t n = in.size();
    int64_t shift = chunk.offset[n - 1] - chunk.offset[n - 2];
    int64_t diagonal = args.size() > 1 && args[1].isInt() ? args[1].toInt() : 0;
    args[1] = c10::IValue(diagonal - shift);
  };
  return r;
}

// as_strided(self, size, stride, offset?): positions in self's global layout (its sizes, strides and storage
// offset, as on one process). Runs on the whole tensor (R) or on each part (P, for every op: it only moves
// elements): the block is laid into a storage of that geometry and viewed with the op's arguments. The
// result is a copy; the handler keeps it a view of self's root (tensor/detail/view_sync.h).
RuleResult as_strided_rule(const RuleCall& c) {
  RuleResult r(base_options());
  const at::Tensor& self = (*c.args)[0].toTensor();
  std::vector<int64_t> sizes = self.sizes().vec(), strides = self.strides().vec();
  const int64_t offset = self.storage_offset();
  r.run = [sizes, strides, offset](const c10::OperatorHandle&, torch::jit::Stack& stack, const Choice&,
                                   const MeshPtr&) {
    at::Tensor block = stack[0].toTensor();
    std::vector<int64_t> out_size = stack[1].toIntVector(), out_stride = stack[2].toIntVector();
    const int64_t out_offset = stack.size() > 3 && !stack[3].isNone() ? stack[3].toInt() : offset;
    at::Tensor storage = at::empty(
        {std::max(storage_extent(sizes, strides, offset), storage_extent(out_size, out_stride, out_offset))},
        block.options());
    storage.as_strided(sizes, strides, offset).copy_(block);
    stack.clear();
    stack.emplace_back(storage.as_strided(out_size, out_stride, out_offset));
  };
  return r;
}

}  // namespace

void add_shape(RuleTable& t) {
  for (const char* op : {"aten::view", "aten::_unsafe_view", "aten::_reshape_alias"}) t[op] = {view_rule};
  t["aten::expand"] = {expand_rule};
  t["aten::as_strided"] = {as_strided_rule};
  t["aten::t"] = {transpose_rule};
  t["aten::transpose.int"] = {transpose_rule};
  t["aten::permute"] = {permute_rule};
  t["aten::unsqueeze"] = {unsqueeze_rule};
  for (const char* op : {"aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims"}) t[op] = {squeeze_rule};
  t["aten::split.Tensor"] = {[](const RuleCall& c) { return along_rule(c, 2, false); }};
  t["aten::split_with_sizes"] = {[](const RuleCall& c) { return along_rule(c, 2, false); }};
  t["aten::slice.Tensor"] = {[](const RuleCall& c) { return along_rule(c, 1, false); }};
  t["aten::select.int"] = {[](const RuleCall& c) { return along_rule(c, 1, true); }};
  t["aten::unbind.int"] = {[](const RuleCall& c) { return along_rule(c, 1, true); }};
  t["aten::cat"] = {[](const RuleCall& c) { return join_rule(c, false); }};
  t["aten::stack"] = {[](const RuleCall& c) { return join_rule(c, true); }};
  for (const char* op : {"aten::tril", "aten::triu", "aten::tril_", "aten::triu_"}) t[op] = {triangle_rule};
}

}  // namespace dtrain::tensor::rules

// The validation matrix (see worker_suites.h): every op with a sharding rule, forward and backward, on every
// combination of input placements, against the op on the whole tensors in this process.
#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/random.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

using namespace dtrain::tensor;
using comm::ReduceOp;

at::Tensor ids(std::vector<int64_t> shape, int64_t vocab) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return ((at::arange(n, at::kLong) * 5 + 2) % vocab).view(shape);
}

struct OpCase {
  std::string name;
  std::vector<at::Tensor> inputs;  // floating inputs get gradients; integer ones (indices) do not
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;
  bool exact = true;      // integer-valued results: equal; otherwise within 1e-9 (double)
  bool backward = true;   // check input gradients too
  int max_inputs_2d = 3;  // on a 2-d mesh, inputs after this many stay Replicate (bounds the combinations)
};

// A 1-rank mesh of this process alone: the reference for random ops, whose values come from DTensor's own
// stream (the same at every world size) rather than libtorch's generator.
std::shared_ptr<const mesh::DeviceMesh> g_solo;

std::vector<OpCase> cases() {
  using V = const std::vector<at::Tensor>&;
  auto seeded_dropout = [](V x) {
    tensor::manual_seed(11);
    if (is_dtensor(x[0])) return at::dropout(x[0], 0.5, true);
    return to_local(at::dropout(from_local(x[0], g_solo, {Replicate()}, x[0].sizes().vec()), 0.5, true));
  };
  return {
      {"relu", {data({7, 5}, 0)}, [](V x) { return at::relu(x[0]); }},
      {"gelu", {data({7, 5}, 0)}, [](V x) { return at::gelu(x[0]); }, false},
      {"add", {data({7, 5}, 0), data({7, 5}, 1)}, [](V x) { return x[0] + x[1]; }},
      {"add_ (in place)", {data({7, 5}, 0), data({7, 5}, 1)}, [](V x) { return x[0].clone().add_(x[1], 2); }},
      {"sub (P(max) - R shifts every part)",
       {data({7, 5}, 0), data({7, 5}, 1)},
       [](V x) { return at::sub(x[0], x[1], 3); }},
      {"mul out=",
       {data({7, 5}, 0), data({7, 5}, 1)},
       [](V x) {
         at::Tensor out = at::empty_like(x[0]);
         return at::mul_out(out, x[0], x[1]);
       },
       true,
       false},
      {"mm out=",
       {data({7, 5}, 0), data({5, 3}, 1)},
       [](V x) {
         at::Tensor out = at::empty_like(x[0].narrow(1, 0, 3));  // [7, 3]: its placements get replaced
         return at::mm_out(out, x[0], x[1]);
       },
       true,
       false},
      {"mul (broadcast row)", {data({7, 5}, 0), data({5}, 2)}, [](V x) { return x[0] * x[1]; }},
      {"div by scalar", {data({7, 5}, 0)}, [](V x) { return x[0] / 4; }},
      {"where", {data({7, 5}, 0), data({7, 5}, 1)}, [](V x) { return at::where(x[0] > 0, x[0], x[1]); }},
      {"masked_fill", {data({7, 5}, 0)}, [](V x) { return x[0].masked_fill(x[0] < 0, 2.0); }},
      {"mm", {data({7, 5}, 0), data({5, 3}, 1)}, [](V x) { return at::mm(x[0], x[1]); }},
      {"bmm", {data({3, 7, 5}, 0), data({3, 5, 2}, 1)}, [](V x) { return at::bmm(x[0], x[1]); }},
      {"addmm",
       {data({3}, 2), data({7, 5}, 0), data({5, 3}, 1)},
       [](V x) { return at::addmm(x[0], x[1], x[2]); }},
      {"linear 3-d",
       {data({3, 7, 5}, 0), data({4, 5}, 1), data({4}, 2)},
       [](V x) { return at::linear(x[0], x[1], x[2]); },
       true,
       true,
       2},
      {"matmul 3-d", {data({3, 7, 5}, 0), data({3, 5, 2}, 1)}, [](V x) { return at::matmul(x[0], x[1]); }},
      {"sum", {data({7, 5}, 0)}, [](V x) { return x[0].sum(); }},
      {"sum dim 0", {data({7, 5}, 0)}, [](V x) { return x[0].sum({0}); }},
      {"sum dim 1 keepdim", {data({7, 5}, 0)}, [](V x) { return x[0].sum({1}, true); }},
      {"mean", {data({7, 5}, 0)}, [](V x) { return x[0].mean(); }, false},
      {"mean dim 0", {data({7, 5}, 0)}, [](V x) { return x[0].mean({0}); }, false},
      {"amax dim 1", {data({7, 5}, 0)}, [](V x) { return at::amax(x[0], {1}); }},
      {"var dim 1", {data({7, 5}, 0)}, [](V x) { return at::var(x[0], {1}); }, false},
      {"t", {data({7, 5}, 0)}, [](V x) { return x[0].t(); }},
      {"transpose 3-d", {data({3, 7, 5}, 0)}, [](V x) { return x[0].transpose(0, 2); }},
      {"permute",
       {data({3, 7, 5}, 0)},
       [](V x) {
         return x[0].permute({2, 0, 1});
       }},
      {"view merge",
       {data({3, 7, 5}, 0)},
       [](V x) {
         return x[0].view({21, 5});
       }},
      {"view split",
       {data({6, 5}, 0)},
       [](V x) {
         return x[0].view({2, 3, 5});
       }},
      {"view after contiguous", {data({7, 5}, 0)}, [](V x) { return x[0].t().contiguous().view({35}); }},
      {"view after narrow",
       {data({7, 5}, 0)},
       [](V x) { return x[0].narrow(1, 1, 3).contiguous().view({21}); }},
      {"reshape",
       {data({7, 6}, 0)},
       [](V x) {
         return x[0].reshape({7, 2, 3});
       }},
      {"unsqueeze", {data({7, 5}, 0)}, [](V x) { return x[0].unsqueeze(1); }},
      {"squeeze", {data({7, 1, 5}, 0)}, [](V x) { return x[0].squeeze(1); }},
      {"expand",
       {data({7, 1}, 0)},
       [](V x) {
         return x[0].expand({2, 7, 5});
       }},
      {"chunk", {data({7, 6}, 0)}, [](V x) { return x[0].chunk(3, 1)[1]; }},
      {"narrow", {data({7, 5}, 0)}, [](V x) { return x[0].narrow(0, 2, 3); }},
      {"select", {data({7, 5}, 0)}, [](V x) { return x[0].select(1, 3); }},
      {"cat",
       {data({7, 5}, 0), data({7, 3}, 1)},
       [](V x) {
         return at::cat({x[0], x[1]}, 1);
       }},
      {"stack",
       {data({7, 5}, 0), data({7, 5}, 1)},
       [](V x) {
         return at::stack({x[0], x[1]}, 0);
       }},
      {"contiguous", {data({5, 7}, 0)}, [](V x) { return x[0].t().contiguous(); }},
      {"tril", {data({7, 5}, 0)}, [](V x) { return at::tril(x[0]); }},
      {"triu -1", {data({7, 5}, 0)}, [](V x) { return at::triu(x[0], -1); }},
      {"clone", {data({7, 5}, 0)}, [](V x) { return x[0].clone(); }},
      {"ones_like", {data({7, 5}, 0)}, [](V x) { return at::ones_like(x[0]); }, true, false},
      {"to float32", {data({7, 5}, 0)}, [](V x) { return x[0].to(at::kFloat); }},
      {"softmax dim 1", {data({7, 5}, 0)}, [](V x) { return at::softmax(x[0], 1); }, false},
      {"log_softmax dim 0", {data({7, 5}, 0)}, [](V x) { return at::log_softmax(x[0], 0); }, false},
      {"layer_norm",
       {data({3, 7, 5}, 0), data({5}, 1), data({5}, 2)},
       [](V x) { return at::layer_norm(x[0], {5}, x[1], x[2]); },
       false,
       true,
       1},
      {"embedding", {data({11, 4}, 0), ids({3, 5}, 11)}, [](V x) { return at::embedding(x[0], x[1]); }},
      {"embedding (few ids: vocab parallel)",
       {data({11, 4}, 0), ids({2}, 11)},
       [](V x) { return at::embedding(x[0], x[1]); }},
      {"cross_entropy",
       {data({7, 5}, 0), ids({7}, 5)},
       [](V x) { return torch::nn::functional::cross_entropy(x[0], x[1]); },
       false},
      {"attention (causal)",
       {data({2, 3, 5, 4}, 0) / 4, data({2, 3, 5, 4}, 1) / 4, data({2, 3, 5, 4}, 2)},
       [](V x) { return at::scaled_dot_product_attention(x[0], x[1], x[2], std::nullopt, 0.0, true); },
       false,
       true,
       1},
      {"dropout (training)", {data({7, 5}, 0)}, seeded_dropout},
      {"item",
       {data({7, 5}, 0)},
       [](V x) { return at::scalar_tensor(x[0].sum().item<double>(), at::kDouble); },
       true,
       false},
      // Uneven blocks that once changed what the local op did: a size-1 dim only on the last rank, empty
      // blocks, out= reductions over one dim.
      {"squeeze all (uneven)", {data({7, 1, 5}, 0)}, [](V x) { return x[0].squeeze(); }},
      {"amax dim 0 (few rows)", {data({3, 5}, 0)}, [](V x) { return at::amax(x[0], {0}); }},
      {"amin dim 0 (few rows)", {data({3, 5}, 0)}, [](V x) { return at::amin(x[0], {0}); }},
      {"sum out= dim 1",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor out = at::empty_like(x[0]);
         return at::sum_out(out, x[0], {1});
       },
       true,
       false},
      {"to int64", {data({7, 5}, 0)}, [](V x) { return x[0].to(at::kLong); }, true, false},
  };
}

bool differentiable(const at::Tensor& t) { return at::isFloatingType(t.scalar_type()); }

void compare(const std::string& what, const at::Tensor& got, const at::Tensor& want, bool exact) {
  if (exact) {
    check_equal(what, got, want);
  } else {
    check_close(what, got, want, 1e-9);
  }
}

void check_op_matrix(const std::shared_ptr<const mesh::DeviceMesh>& m) {
  const bool two_d = m->ndim() > 1;
  const int me = m->group()->group_rank();
  g_solo = std::make_shared<const mesh::DeviceMesh>(m->group()->split(me, 0), std::vector<int64_t>{1},
                                                    std::vector<std::string>{"solo"});
  std::string fell_back_ops;
  for (const OpCase& c : cases()) {
    // Placement options per input: R, P(sum) (floating inputs), S(d) for every dim; P(avg), P(max) and P(min)
    // for the first two inputs on 1-d meshes (the 2-d mesh's combinations would take minutes on 2 cores).
    std::vector<std::vector<Placements>> per_input;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const at::Tensor& x = c.inputs[i];
      std::vector<Placement> opts{Replicate()};
      if (!(two_d && static_cast<int>(i) >= c.max_inputs_2d)) {
        if (differentiable(x)) opts.push_back(Partial());
        if (differentiable(x) && !two_d && i < 2) {
          for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) opts.push_back(Partial(op));
        }
        for (int d = 0; d < x.dim(); ++d) {
          if (!two_d || d == 0 || d == x.dim() - 1) opts.push_back(Shard(d));
        }
      }
      per_input.push_back(all_placements(opts, m->ndim()));
    }
    // The reference: the op and its input gradients on whole tensors, for a fixed integer-valued output
    // gradient.
    std::vector<at::Tensor> ref;
    for (const auto& x : c.inputs) {
      ref.push_back(differentiable(x) && c.backward ? x.clone().requires_grad_(true) : x);
    }
    at::Tensor want = c.fn(ref);
    at::Tensor grad_out = data(want.sizes().vec(), 5).to(want.scalar_type());
    if (c.backward) want.backward(grad_out);

    int combos = 0, fwd_fell = 0, bwd_fell = 0;
    std::string fell_list;
    std::vector<size_t> pick(per_input.size(), 0);
    for (;;) {
      std::vector<at::Tensor> locals, dts;
      std::string what = c.name;
      bool valid = true;
      for (size_t i = 0; i < per_input.size() && valid; ++i) {
        const Placements& p = per_input[i][pick[i]];
        try {
          check_placements("matrix", p, c.inputs[i].dim(), m->ndim());
        } catch (const ValueError&) {
          valid = false;
          break;
        }
        what += " " + to_string(p);
        at::Tensor local = block_of(c.inputs[i], *m, p);
        // Gradients flow into a block through Partial(sum) and Partial(avg) only (from_local refuses the
        // others); a max/min part enters as a constant whose reduction is the input.
        const bool extreme = std::any_of(p.begin(), p.end(), [](const Placement& q) {
          return q.is_partial() && (q.op == ReduceOp::kMax || q.op == ReduceOp::kMin);
        });
        if (differentiable(c.inputs[i]) && c.backward && !extreme) local = local.clone().requires_grad_(true);
        locals.push_back(local);
        dts.push_back(from_local(local, m, p, c.inputs[i].sizes().vec()));
      }
      if (valid) {
        ++combos;
        int64_t before = tensor::detail::gather_count();
        at::Tensor out = c.fn(dts);
        bool fwd = tensor::detail::gather_count() != before;
        fwd_fell += fwd;
        compare(what, is_dtensor(out) ? full_tensor(out.detach()) : out, want.detach(), c.exact);
        bool bwd = false;
        if (c.backward && out.requires_grad()) {  // not when every input entered as a max/min part
          before = tensor::detail::gather_count();
          Placements rep(m->ndim(), Replicate());
          out.backward(from_local(grad_out, m, rep, grad_out.sizes().vec()));
          bwd = tensor::detail::gather_count() != before;
          bwd_fell += bwd;
          for (size_t i = 0; i < locals.size(); ++i) {
            if (!differentiable(c.inputs[i])) continue;
            if (!locals[i].requires_grad()) continue;
            // The gradient of a Partial(sum) part is the whole gradient; of a Partial(avg) part, its share.
            Placements shards = per_input[i][pick[i]];
            double share = 1;
            for (size_t a = 0; a < shards.size(); ++a) {
              if (shards[a].is_partial() && shards[a].op == ReduceOp::kAvg)
                share *= m->size(static_cast<int>(a));
              if (shards[a].is_partial()) shards[a] = Replicate();
            }
            at::Tensor g = locals[i].grad();
            at::Tensor expect = local_block(ref[i].grad(), m->shape(), shards, m->coordinate()) / share;
            if (!g.defined()) g = at::zeros_like(expect);
            compare(str_cat(what, " grad of input ", i), g, expect, c.exact);
          }
        }
        if ((fwd || bwd) && fell_list.size() < 400)
          fell_list += str_cat("    ", what, fwd ? " forward" : "", bwd ? " backward" : "", "\n");
      }
      int i = static_cast<int>(pick.size()) - 1;
      while (i >= 0 && ++pick[i] == per_input[i].size()) pick[i--] = 0;
      if (i < 0) break;
    }
    if (m->group()->group_rank() == 0) {
      std::fprintf(stderr,
                   "validation matrix %s: %-20s %5d combinations: forward %5d by rule %4d fell back; "
                   "backward %5d by rule %4d fell back\n%s",
                   m->to_string().c_str(), c.name.c_str(), combos, combos - fwd_fell, fwd_fell,
                   c.backward ? combos - bwd_fell : 0, bwd_fell, fell_list.c_str());
    }
    if (fwd_fell + bwd_fell > 0) fell_back_ops += " " + c.name;
    // Every op here has a rule for every combination: a gather is a missing or broken rule.
    ++g_checks;
    if (fwd_fell + bwd_fell > 0) {
      g_failures += str_cat("FAIL ", c.name, " on ", m->to_string(), " fell back to gathering: forward ",
                            fwd_fell, ", backward ", bwd_fell, " combinations\n", fell_list);
    }
  }
  if (m->group()->group_rank() == 0) {
    std::fprintf(stderr, "validation matrix %s: ops that fell back for some combination:%s\n",
                 m->to_string().c_str(), fell_back_ops.empty() ? " none" : fell_back_ops.c_str());
  }
}

}  // namespace

void suite_ops(const comm::BackendPtr& world) {
  const int ws = world->group_size();
  check_op_matrix(std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{ws},
                                                           std::vector<std::string>{"x"}));
  if (ws == 4) {
    check_op_matrix(std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{2, 2},
                                                             std::vector<std::string>{"dp", "tp"}));
  }
  world->barrier()->wait();
}

}  // namespace dtrain::test

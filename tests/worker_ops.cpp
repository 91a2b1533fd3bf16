// The validation matrix (see worker_suites.h): every op with a sharding rule, forward and backward, on every
// combination of input placements, against the op on the whole tensors in this process.
#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/dtensor_random.h"
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

// Values 1..7 with alternating signs: divisors.
at::Tensor nonzero(std::vector<int64_t> shape, int salt) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor i = at::arange(n, at::kLong);
  at::Tensor v = (i * (3 + salt) + salt) % 7 + 1;
  return (v * (1 - 2 * (i % 2))).view(shape).to(at::kDouble);
}

struct OpCase {
  std::string name;
  std::vector<at::Tensor> inputs;  // floating inputs get gradients; integer ones (indices) do not
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;
  bool exact = true;     // integer-valued results: equal; otherwise within 1e-9 (double)
  bool backward = true;  // check input gradients too
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
       [](V x) { return at::linear(x[0], x[1], x[2]); }},
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
       false},
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
       false},
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
      // Arguments an op is not linear in, drawn as Partial like every other input (issue 29, class 2).
      {"div (divisor drawn too)",
       {data({7, 5}, 0), nonzero({7, 5}, 1)},
       [](V x) { return x[0] / x[1]; },
       false},
      {"0-d plain / x",
       {nonzero({7, 5}, 2)},
       [](V x) { return at::scalar_tensor(3.0, at::kDouble) / x[0]; },
       false},
      {"0-d plain - x",
       {data({7, 5}, 0)},
       [](V x) { return at::sub(at::scalar_tensor(2.0, at::kDouble), x[0]); }},
      {"x * x", {data({7, 5}, 0)}, [](V x) { return x[0] * x[0]; }},
      {"reciprocal", {nonzero({7, 5}, 3)}, [](V x) { return at::reciprocal(x[0]); }, false},
      {"pow 2", {data({7, 5}, 0)}, [](V x) { return at::pow(x[0], 2); }},
      // In-place writes through views (class 3): the write must reach the viewed tensor's blocks, and a view
      // read after its base changed must see the change.
      {"narrow(0).mul_ (through a view)",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.narrow(0, 1, 3).mul_(2);
         return y;
       }},
      {"view(-1).add_ (through a view)",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.view({-1}).add_(1);
         return y;
       }},
      {"select(1).zero_ (through a view)",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.select(1, 2).zero_();
         return y;
       }},
      {"slice(0).relu_ (through a view)",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.slice(0, 2, 5).relu_();
         return y;
       }},
      {"t().add_ (through a view)",
       {data({7, 5}, 0), data({5, 7}, 1)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.t().add_(x[1]);
         return y;
       }},
      {"narrow(1).copy_ (through a view)",
       {data({7, 5}, 0), data({7, 3}, 1)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.narrow(1, 1, 3).copy_(x[1]);
         return y;
       }},
      {"select(0).fill_ (through a view)",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor y = x[0].clone();
         y.select(0, 4).fill_(3);
         return y;
       }},
      {"view then base mul_ (the view sees it)",
       {data({7, 5}, 0)},
       [](V x) {
         at::Tensor y = x[0].clone();
         at::Tensor v = y.narrow(0, 2, 4);
         y.mul_(3);
         return v * 1;
       }},
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

// The refusals the matrix accepts: a combination whose input placements match `when` must raise
// NotSupportedError with `says` in its message, and any other error is a failure. Checked into the tests so
// that a new refusal is a decision, not an accident.
struct Refusal {
  std::string what;
  std::function<bool(const Placements&)> when;  // of one input's placements
  std::string says;
};

const std::vector<Refusal>& refusals() {
  static const std::vector<Refusal> list{
      {"Partial kinds whose reductions do not commute, on different axes of one input (max with min, "
       "sum/avg with max/min): no single value (docs/architecture.md, Partial on several axes)",
       [](const Placements& p) { return !mixed_partials(p).empty(); }, "mixes"},
  };
  return list;
}

// Each input's placement tuples for one op: every tuple on a small matrix; else a sample from a seeded
// generator that still holds, for every input, each placement on each axis, and on 2-d meshes every pair of
// Partial kinds across the two axes. Inputs after the first are shuffled so that pairings vary.
std::vector<std::vector<Placements>> combinations(const std::vector<std::vector<Placement>>& options,
                                                  int axes, std::mt19937& rng) {
  constexpr size_t kFull = 64, kExtra = 6;
  std::vector<std::vector<Placements>> all;
  size_t product = 1;
  for (const auto& o : options) {
    all.push_back(all_placements(o, axes));
    product *= all.back().size();
  }
  std::vector<std::vector<Placements>> out;
  if (product <= kFull) {
    std::vector<size_t> pick(all.size(), 0);
    for (;;) {
      std::vector<Placements> combo;
      for (size_t i = 0; i < all.size(); ++i) combo.push_back(all[i][pick[i]]);
      out.push_back(std::move(combo));
      int i = static_cast<int>(pick.size()) - 1;
      while (i >= 0 && ++pick[i] == all[i].size()) pick[i--] = 0;
      if (i < 0) break;
    }
    return out;
  }
  auto any = [&](size_t i) { return all[i][rng() % all[i].size()]; };
  std::vector<std::vector<Placements>> required(all.size());
  size_t rows = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    for (int a = 0; a < axes; ++a) {
      for (const Placement& o : options[i]) {
        Placements t = any(i);
        t[a] = o;
        required[i].push_back(t);
      }
    }
    if (axes == 2) {
      for (const Placement& p : options[i]) {
        for (const Placement& q : options[i]) {
          if (p.is_partial() && q.is_partial()) required[i].push_back({p, q});
        }
      }
    }
    if (i > 0) std::shuffle(required[i].begin(), required[i].end(), rng);
    rows = std::max(rows, required[i].size());
  }
  for (size_t r = 0; r < rows + kExtra; ++r) {
    std::vector<Placements> combo;
    for (size_t i = 0; i < all.size(); ++i) combo.push_back(r < required[i].size() ? required[i][r] : any(i));
    out.push_back(std::move(combo));
  }
  return out;
}

void check_op_matrix(const std::shared_ptr<const mesh::DeviceMesh>& m, uint32_t seed) {
  const int me = m->group()->group_rank();
  g_solo = std::make_shared<const mesh::DeviceMesh>(m->group()->split(me, 0), std::vector<int64_t>{1},
                                                    std::vector<std::string>{"solo"});
  std::mt19937 rng(seed);  // the same draws on every rank
  std::string fell_back_ops;
  for (const OpCase& c : cases()) {
    // Placement options per input: R, S(d) for every dim, and for floating inputs every Partial kind.
    std::vector<std::vector<Placement>> options;
    for (const at::Tensor& x : c.inputs) {
      std::vector<Placement> opts{Replicate()};
      if (differentiable(x)) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin})
          opts.push_back(Partial(op));
      }
      for (int d = 0; d < x.dim(); ++d) opts.push_back(Shard(d));
      options.push_back(std::move(opts));
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

    int combos = 0, refused = 0, fwd_fell = 0, bwd_fell = 0;
    std::string fell_list;
    for (const std::vector<Placements>& combo : combinations(options, m->ndim(), rng)) {
      std::string what = c.name;
      for (const Placements& p : combo) what += " " + to_string(p);
      // A listed refusal: the inputs cannot be made, with the listed error.
      const Refusal* expected = nullptr;
      for (const Refusal& r : refusals()) {
        for (const Placements& p : combo) {
          if (!expected && r.when(p)) expected = &r;
        }
      }
      bool shard_too_many = false;
      for (size_t i = 0; i < combo.size(); ++i) {
        try {
          check_placements("matrix", combo[i], c.inputs[i].dim(), m->ndim());
        } catch (const NotSupportedError&) {
        } catch (const ValueError&) {
          shard_too_many = true;  // (not drawn: every option is valid alone)
        }
      }
      if (shard_too_many) continue;
      ++combos;
      try {
        std::vector<at::Tensor> locals, dts;
        for (size_t i = 0; i < combo.size(); ++i) {
          const Placements& p = combo[i];
          at::Tensor local = block_of(c.inputs[i], *m, p);
          // Gradients flow into a block through Partial(sum) and Partial(avg) only (from_local refuses the
          // others); a max/min part enters as a constant whose reduction is the input.
          const bool extreme = std::any_of(p.begin(), p.end(), [](const Placement& q) {
            return q.is_partial() && (q.op == ReduceOp::kMax || q.op == ReduceOp::kMin);
          });
          if (differentiable(c.inputs[i]) && c.backward && !extreme)
            local = local.clone().requires_grad_(true);
          locals.push_back(local);
          dts.push_back(from_local(local, m, p, c.inputs[i].sizes().vec()));
        }
        if (expected) {
          g_failures += str_cat("FAIL ", what, " on ", m->to_string(), ": listed as refused (",
                                expected->what, ") but ran\n");
          ++g_checks;
          continue;
        }
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
            if (!differentiable(c.inputs[i]) || !locals[i].requires_grad()) continue;
            // The gradient of a Partial(sum) part is the whole gradient; of a Partial(avg) part, its share.
            Placements shards = combo[i];
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
      } catch (const NotSupportedError& e) {
        ++g_checks;
        if (expected && std::string(e.what()).find(expected->says) != std::string::npos) {
          ++refused;
        } else {
          g_failures +=
              str_cat("FAIL ", what, " on ", m->to_string(), ": refused, not in the list: ", e.what(), "\n");
        }
      } catch (const std::exception& e) {
        ++g_checks;
        g_failures += str_cat("FAIL ", what, " on ", m->to_string(), ": ", e.what(), "\n");
      }
    }
    if (me == 0) {
      std::fprintf(
          stderr,
          "validation matrix %s: %-36s %4d combinations (%3d refused as listed): forward %4d fell back; "
          "backward %4d fell back\n%s",
          m->to_string().c_str(), c.name.c_str(), combos, refused, fwd_fell, bwd_fell, fell_list.c_str());
    }
    if (fwd_fell + bwd_fell > 0) fell_back_ops += " " + c.name;
    // Every op here has a rule for every combination: a gather is a missing or broken rule.
    ++g_checks;
    if (fwd_fell + bwd_fell > 0) {
      g_failures += str_cat("FAIL ", c.name, " on ", m->to_string(), " fell back to gathering: forward ",
                            fwd_fell, ", backward ", bwd_fell, " combinations\n", fell_list);
    }
  }
  if (me == 0) {
    std::fprintf(stderr, "validation matrix %s: ops that fell back for some combination:%s\n",
                 m->to_string().c_str(), fell_back_ops.empty() ? " none" : fell_back_ops.c_str());
  }
}

}  // namespace

// The matrix on a line of every rank, and on the 2-d meshes of 3 and 4 ranks (1x3, 3x1, 2x2). The sample's
// seed is DTRAIN_MATRIX_SEED when set (to replay a failure), else a fixed one; it is printed.
void suite_ops(const comm::BackendPtr& world) {
  const int ws = world->group_size();
  const char* env = std::getenv("DTRAIN_MATRIX_SEED");
  const uint32_t seed = env != nullptr && *env != '\0' ? static_cast<uint32_t>(std::stoul(env)) : 29;
  if (world->group_rank() == 0) {
    std::fprintf(stderr, "validation matrix: sampling seed %u (DTRAIN_MATRIX_SEED=%u replays it)\n", seed,
                 seed);
  }
  std::vector<std::vector<int64_t>> shapes{{ws}};
  if (ws == 3) shapes.insert(shapes.end(), {{1, 3}, {3, 1}});
  if (ws == 4) shapes.push_back({2, 2});
  for (const auto& shape : shapes) {
    std::vector<std::string> names =
        shape.size() == 1 ? std::vector<std::string>{"x"} : std::vector<std::string>{"dp", "tp"};
    check_op_matrix(std::make_shared<const mesh::DeviceMesh>(world, shape, names), seed);
  }
  world->barrier()->wait();
}

}  // namespace dtrain::test

// One rank of the process-tier comm tests, started by tests/comm_process_test.cpp through the launcher
// (`dtrain run` semantics, real engines). Every result is compared with a single-process reference computed
// with plain libtorch on integer-valued inputs, so equality is exact. Writes "<dir>/rank<R>.txt" with "ok
// <checks>" or what failed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "comm/factory.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "mesh/mesh_math.h"
#include "tensor/comm_log.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/distribute_module.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"

using namespace dtrain;
using comm::ReduceOp;
using comm::WorkPtr;

namespace {

int g_checks = 0;
std::string g_failures;

// Compares exactly; on mismatch records the first differing indices and the largest difference (llm.c's
// check).
void check_equal(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) {
  ++g_checks;
  at::Tensor a = actual.to(at::kDouble).reshape({-1}), e = expected.to(at::kDouble).reshape({-1});
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    g_failures += str_cat("FAIL ", what, ": shape/dtype ", actual.sizes(), "/", actual.scalar_type(),
                          " vs expected ", expected.sizes(), "/", expected.scalar_type(), "\n");
    return;
  }
  if (at::equal(a, e)) return;
  at::Tensor diff = (a - e).abs();
  std::string first;
  auto idx = at::nonzero(diff).reshape({-1});
  for (int64_t k = 0; k < std::min<int64_t>(idx.numel(), 3); ++k) {
    int64_t i = idx[k].item<int64_t>();
    first += str_cat(" [", i, "] got ", a[i].item<double>(), " want ", e[i].item<double>());
  }
  g_failures += str_cat("FAIL ", what, ": ", idx.numel(), " mismatches, max diff ", diff.max().item<double>(),
                        ";", first, "\n");
}

// For float results whose summation order differs from the reference (partial sums on several ranks).
void check_close(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                 double tol = 1e-5) {
  ++g_checks;
  if (actual.sizes() != expected.sizes()) {
    g_failures += str_cat("FAIL ", what, ": shape ", actual.sizes(), " vs expected ", expected.sizes(), "\n");
    return;
  }
  double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  if (!(diff <= tol)) g_failures += str_cat("FAIL ", what, ": max diff ", diff, " > ", tol, "\n");
}

// Rank r's integer-valued input of n elements, small enough to be exact in bfloat16 after summing 4 ranks.
at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, int salt = 0) {
  at::Tensor i = at::arange(n, at::kLong);
  return ((i * 7 + r * 3 + salt) % 11 - 5).to(dtype);
}

const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kDouble, at::kBFloat16,
                                          at::kHalf,  at::kInt,    at::kLong};

std::string tag(const char* op, at::ScalarType t, int64_t n) { return str_cat(op, " ", t, " n=", n); }

void suite_collectives(comm::Backend& b, const std::vector<int64_t>& sizes) {
  const int ws = b.group_size(), me = b.group_rank();
  for (at::ScalarType dt : kDtypes) {
    for (int64_t n : sizes) {
      // all_reduce: sum, max, min, and avg on inputs whose mean is an integer.
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        at::Tensor x = input_of(me, n, dt);
        at::Tensor want = input_of(0, n, dt);
        for (int r = 1; r < ws; ++r) {
          at::Tensor y = input_of(r, n, dt);
          want = op == ReduceOp::kSum   ? want + y
                 : op == ReduceOp::kMax ? at::maximum(want, y)
                                        : at::minimum(want, y);
        }
        b.all_reduce(x, {op})->wait();
        check_equal(tag(str_cat("all_reduce ", to_string(op)).c_str(), dt, n), x, want.to(dt));
      }
      if (at::isFloatingType(dt)) {
        auto avg_input = [&](int r) { return (input_of(0, n, at::kLong) * ws + 2 * r).to(dt); };
        at::Tensor x = avg_input(me);
        at::Tensor want = (input_of(0, n, at::kLong) * ws + (ws - 1)).to(dt);
        b.all_reduce(x, {ReduceOp::kAvg})->wait();
        check_equal(tag("all_reduce avg", dt, n), x, want);
      }
      // reduce_scatter (equal chunks of n) and reduce_scatter_v (uneven, one rank gets zero).
      {
        at::Tensor want_full = input_of(0, n * ws, dt);
        for (int r = 1; r < ws; ++r) want_full = want_full + input_of(r, n * ws, dt);
        at::Tensor out = at::empty({n}, dt);
        b.reduce_scatter(out, input_of(me, n * ws, dt))->wait();
        check_equal(tag("reduce_scatter", dt, n), out, want_full.narrow(0, me * n, n).to(dt));
      }
      std::vector<int64_t> counts(ws);
      for (int g = 0; g < ws; ++g) counts[g] = (ws > 1 && g == 1) ? 0 : n / ws + g;
      int64_t total = 0, offset = 0;
      for (int g = 0; g < ws; ++g) {
        if (g == me) offset = total;
        total += counts[g];
      }
      {
        at::Tensor want_full = input_of(0, total, dt);
        for (int r = 1; r < ws; ++r) want_full = want_full + input_of(r, total, dt);
        at::Tensor out = at::empty({counts[me]}, dt);
        b.reduce_scatter_v(out, input_of(me, total, dt), counts)->wait();
        check_equal(tag("reduce_scatter_v", dt, n), out, want_full.narrow(0, offset, counts[me]).to(dt));
      }
      // all_gather and all_gather_v.
      {
        at::Tensor out = at::empty({n * ws}, dt);
        b.all_gather(out, input_of(me, n, dt, 1))->wait();
        std::vector<at::Tensor> parts;
        for (int r = 0; r < ws; ++r) parts.push_back(input_of(r, n, dt, 1));
        check_equal(tag("all_gather", dt, n), out, at::cat(parts));
      }
      {
        at::Tensor out = at::empty({total}, dt);
        b.all_gather_v(out, input_of(me, counts[me], dt, 2), counts)->wait();
        std::vector<at::Tensor> parts;
        for (int r = 0; r < ws; ++r) parts.push_back(input_of(r, counts[r], dt, 2));
        check_equal(tag("all_gather_v", dt, n), out, at::cat(parts));
      }
      // broadcast from the last rank.
      {
        at::Tensor x = input_of(me, n, dt, 3);
        b.broadcast(x, {ws - 1})->wait();
        check_equal(tag("broadcast", dt, n), x, input_of(ws - 1, n, dt, 3));
      }
      // all_to_all: rank r's chunk g is input_of(r*ws+g); all_to_all_v with counts c(from, to) = (from + 2*to
      // + n) % 4.
      {
        std::vector<at::Tensor> mine, want;
        for (int g = 0; g < ws; ++g) {
          mine.push_back(input_of(me * ws + g, n, dt));
          want.push_back(input_of(g * ws + me, n, dt));
        }
        at::Tensor out = at::empty({n * ws}, dt);
        b.all_to_all(out, at::cat(mine))->wait();
        check_equal(tag("all_to_all", dt, n), out, at::cat(want));
      }
      {
        auto c = [&](int from, int to) {
          return static_cast<int64_t>((from + 2 * to + n) % 4) * (n > 0 ? 1 : 0);
        };
        std::vector<int64_t> sc(ws), rc(ws);
        std::vector<at::Tensor> mine, want;
        for (int g = 0; g < ws; ++g) {
          sc[g] = c(me, g);
          rc[g] = c(g, me);
          mine.push_back(input_of(me * 13 + g, sc[g], dt));  // 13: not 1 mod 11, so (from, to) != (to, from)
          want.push_back(input_of(g * 13 + me, rc[g], dt));
        }
        at::Tensor out = at::empty({std::accumulate(rc.begin(), rc.end(), int64_t{0})}, dt);
        b.all_to_all_v(out, at::cat(mine), sc, rc)->wait();
        check_equal(tag("all_to_all_v", dt, n), out, at::cat(want));
      }
      // send/recv around a ring.
      if (ws > 1) {
        at::Tensor got = at::empty({n}, dt);
        auto s = b.send(input_of(me, n, dt, 4), (me + 1) % ws);
        auto r = b.recv(got, (me + ws - 1) % ws);
        r->wait();
        s->wait();
        check_equal(tag("send/recv", dt, n), got, input_of((me + ws - 1) % ws, n, dt, 4));
      }
    }
  }
  // Non-contiguous tensors are staged through contiguous buffers and copied back.
  {
    at::Tensor base = input_of(me, 35, at::kFloat).reshape({5, 7});
    at::Tensor x = base.t();  // a non-contiguous view
    at::Tensor want = input_of(0, 35, at::kFloat).reshape({5, 7});
    for (int r = 1; r < ws; ++r) want = want + input_of(r, 35, at::kFloat).reshape({5, 7});
    b.all_reduce(x)->wait();
    check_equal("all_reduce non-contiguous in place", base, want);
    at::Tensor out = at::empty({7 * ws, 5}, at::kFloat).t();  // non-contiguous output
    b.all_gather(out, input_of(me, 35, at::kFloat).reshape({5, 7}).t())->wait();
    std::vector<at::Tensor> parts;
    for (int r = 0; r < ws; ++r)
      parts.push_back(input_of(r, 35, at::kFloat).reshape({5, 7}).t().contiguous().reshape({-1}));
    check_equal("all_gather non-contiguous", out.contiguous().reshape({-1}), at::cat(parts));
  }
  b.barrier()->wait();
}

void suite_mesh(const comm::BackendPtr& world) {
  const int ws = world->group_size(), me = world->group_rank();
  if (ws != 4) throw ValueError("suite mesh needs 4 ranks");
  mesh::DeviceMesh m(world, {2, 2}, {"dp", "tp"});
  for (int a = 0; a < 2; ++a) {
    auto slice = mesh::axis_slice(me, m.shape(), a);
    const auto& g = m.axis_group(a);
    ++g_checks;
    if (g->group_size() != 2 || g->group_rank() != m.coordinate()[a])
      g_failures += str_cat("FAIL axis ", a, " group\n");
    // all_gather of global ranks along the axis equals the slice computed by pure arithmetic.
    at::Tensor out = at::empty({2}, at::kLong);
    g->all_gather(out, at::full({1}, static_cast<int64_t>(me), at::kLong))->wait();
    check_equal(str_cat("mesh axis ", a, " membership"), out, at::tensor(slice, at::kLong));
    at::Tensor x = at::full({3}, static_cast<int64_t>(me * me + 1), at::kLong);
    g->all_reduce(x)->wait();
    int64_t want = 0;
    for (int64_t r : slice) want += r * r + 1;
    check_equal(str_cat("mesh axis ", a, " all_reduce"), x, at::full({3}, want, at::kLong));
  }
  // Collectives on different groups issued in different orders: ranks 0 and 3 issue dp then tp, ranks 1 and 2
  // tp then dp, all asynchronously. Each group sees one order, so this is valid, and no rank may wait on
  // another group.
  {
    bool dp_first = me == 0 || me == 3;
    at::Tensor a = at::full({5}, static_cast<int64_t>(me + 1), at::kLong);
    at::Tensor b = at::full({5}, static_cast<int64_t>(10 * (me + 1)), at::kLong);
    const auto& first = m.axis_group(dp_first ? "dp" : "tp");
    const auto& second = m.axis_group(dp_first ? "tp" : "dp");
    auto w1 = first->all_reduce(dp_first ? a : b);
    auto w2 = second->all_reduce(dp_first ? b : a);
    w2->wait();
    w1->wait();
    int64_t want_a = 0, want_b = 0;  // a is reduced over dp, b over tp
    for (int64_t r : mesh::axis_slice(me, m.shape(), 0)) want_a += r + 1;
    for (int64_t r : mesh::axis_slice(me, m.shape(), 1)) want_b += 10 * (r + 1);
    check_equal("crossed groups dp", a, at::full({5}, want_a, at::kLong));
    check_equal("crossed groups tp", b, at::full({5}, want_b, at::kLong));
  }
  auto tp = m.sub_mesh("tp");
  ++g_checks;
  if (tp.ndim() != 1 || tp.size() != 2 || tp.coordinate()[0] != m.coordinate()[1])
    g_failures += "FAIL sub_mesh\n";
  // split with a negative color: rank 3 joins nothing, the rest form one group ordered by descending key.
  auto sub = world->split(me == 3 ? -1 : 0, -me);
  ++g_checks;
  if (me == 3 ? sub != nullptr : (sub == nullptr || sub->group_size() != 3 || sub->group_rank() != 2 - me)) {
    g_failures += "FAIL split with negative color\n";
  }
  if (sub) {
    at::Tensor x = at::full({2}, static_cast<int64_t>(me + 1), at::kLong);
    sub->all_reduce(x)->wait();
    check_equal("split all_reduce", x, at::full({2}, int64_t{6}, at::kLong));
  }
  // A mesh that does not fit the world is a ValueError with the values.
  ++g_checks;
  try {
    mesh::DeviceMesh bad(world, {2, 3}, {"dp", "tp"});
    g_failures += "FAIL mesh (2,3) on 4 ranks did not throw\n";
  } catch (const ValueError& e) {
    if (std::string(e.what()).find("needs 6 ranks but WORLD_SIZE is 4") == std::string::npos) {
      g_failures += str_cat("FAIL mesh error message: ", e.what(), "\n");
    }
  }
  world->barrier()->wait();
}

// The last rank never enters the all_reduce (it waits in a recv that nobody sends); the others must get a
// TimeoutError naming it, within the timeout.
void suite_missing_rank(comm::Backend& b, std::ofstream& out) {
  const int ws = b.group_size(), me = b.group_rank();
  if (me == ws - 1) {
    at::Tensor never = at::empty({1});
    b.recv(never, 0, {0, std::chrono::milliseconds(60000)})->wait();  // ends when the others leave
    return;
  }
  at::Tensor x = at::ones({4});
  auto t0 = std::chrono::steady_clock::now();
  try {
    b.all_reduce(x, {ReduceOp::kSum, std::chrono::milliseconds(2000)})->wait();
    g_failures += "FAIL: all_reduce completed without the last rank\n";
  } catch (const TimeoutError& e) {
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    out << "elapsed_ms " << ms << "\nmessage " << e.what() << "\n";
    ++g_checks;
  }
}

// A wait shorter than the op's timeout that runs out is not fatal: rank 0 waits 100 ms for an all_reduce the
// others enter only after rank 0 sends them a token; it gets a TimeoutError, sends the token, and its next
// wait succeeds.
void suite_short_wait(comm::Backend& b) {
  const int ws = b.group_size(), me = b.group_rank();
  at::Tensor x = at::full({8}, static_cast<int64_t>(me + 1), at::kLong);
  at::Tensor want = at::full({8}, static_cast<int64_t>(ws * (ws + 1) / 2), at::kLong);
  if (me == 0) {
    auto w = b.all_reduce(x);
    ++g_checks;
    try {
      w->wait(std::chrono::milliseconds(100));
      g_failures += "FAIL: the all_reduce finished before the others entered it\n";
    } catch (const TimeoutError& e) {
      if (std::string(e.what()).find("is still running") == std::string::npos) {
        g_failures += str_cat("FAIL short wait message: ", e.what(), "\n");
      }
    }
    std::vector<WorkPtr> sends;
    for (int r = 1; r < ws; ++r) sends.push_back(b.send(at::ones({1}), r));
    for (auto& s : sends) s->wait();
    w->wait();
  } else {
    at::Tensor token = at::empty({1});
    b.recv(token, 0)->wait();
    b.all_reduce(x)->wait();
  }
  check_equal("all_reduce after a short wait", x, want);
  at::Tensor y = at::ones({3}, at::kLong);
  b.all_reduce(y)->wait();  // the group is still healthy
  check_equal("next all_reduce", y, at::full({3}, static_cast<int64_t>(ws), at::kLong));
}

// Fault injection: every rank but 0 is late by most of the timeout (4 s); the collective must still succeed,
// and so must the next one (a late op must not poison the backend).
void suite_delayed(comm::Backend& b) {
  const int ws = b.group_size(), me = b.group_rank();
  if (me != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(3200));  // the injected delay, not a sync
  at::Tensor x = at::full({4}, static_cast<int64_t>(me), at::kLong);
  b.all_reduce(x, {ReduceOp::kSum, std::chrono::milliseconds(4000)})->wait();
  check_equal("delayed all_reduce", x, at::full({4}, static_cast<int64_t>(ws * (ws - 1) / 2), at::kLong));
  b.barrier()->wait();
  at::Tensor y = at::ones({2});
  b.all_reduce(y)->wait();
  check_equal("all_reduce after the delayed one", y, at::full({2}, static_cast<float>(ws)));
}

// Values whose reduction with `op` over the k coordinates of axis `axis` is `v`, and that differ between
// coordinates (so a result cannot match by coincidence): this coordinate's part. Integer-valued, so every
// check is exact.
// `other` (the coordinates on the other axes) also varies the parts, so that reducing over the wrong axis or
// in the wrong order shows.
at::Tensor partial_part(const at::Tensor& v, ReduceOp op, int64_t k, int64_t c, int axis, int64_t other) {
  at::Tensor idx = at::arange(v.numel(), at::kLong).view(v.sizes()).to(v.scalar_type());
  auto noise = [&](int64_t i) { return at::remainder(idx * 7 + i * 5 + axis * 3 + other * 11, 9) - 4; };
  auto sum_part = [&](const at::Tensor& total) {
    if (c < k - 1) return noise(c);
    at::Tensor rest = total.clone();
    for (int64_t i = 0; i < k - 1; ++i) rest -= noise(i);
    return rest;
  };
  switch (op) {
    case ReduceOp::kSum:
      return sum_part(v);
    case ReduceOp::kAvg:  // multiples of k, so that P(avg) -> P(sum) (a division by k) stays exact
      return sum_part(v) * static_cast<double>(k);
    case ReduceOp::kMax:
      return c == axis % k ? v : v - (1 + at::remainder(idx + c, 3));
    case ReduceOp::kMin:
      return c == axis % k ? v : v + (1 + at::remainder(idx + c, 3));
  }
  return v;
}

// This rank's block of `g` laid out as `placements`, with asymmetric parts on Partial axes.
at::Tensor block_of(const at::Tensor& g, const mesh::DeviceMesh& m, const tensor::Placements& placements) {
  at::Tensor v = g;
  for (size_t a = 0; a < placements.size(); ++a) {
    if (placements[a].is_partial()) {
      int64_t other = 0;  // the coordinates on the other axes
      for (size_t b = 0; b < placements.size(); ++b) {
        if (b != a) other = other * 3 + m.coordinate()[b];
      }
      v = partial_part(v, placements[a].op, m.size(static_cast<int>(a)), m.coordinate()[a],
                       static_cast<int>(a), other);
    }
  }
  tensor::Placements shards_only = placements;
  for (auto& p : shards_only) {
    if (p.is_partial()) p = tensor::Replicate();
  }
  return tensor::local_block(v, m.shape(), shards_only, m.coordinate());
}

// Every source -> target pair: the executor's result equals the plain tensor's block, and the collectives it
// issued are the plan's, in kind and number.
void check_all_pairs(const mesh::DeviceMesh& m, const std::vector<tensor::Placement>& options) {
  using namespace dtrain::tensor;
  const std::vector<int64_t> shape{7, 5};
  at::Tensor g = (at::arange(35, at::kLong).view({7, 5}) * 3 % 17 - 8).to(at::kDouble);
  std::vector<Placements> all{{}};
  for (int a = 0; a < m.ndim(); ++a) {
    std::vector<Placements> next;
    for (auto& p : all) {
      for (auto& o : options) {
        next.push_back(p);
        next.back().push_back(o);
      }
    }
    all = next;
  }
  PlanCache cache(CostModel::defaults(m.ndim()));
  Placements replicated(m.ndim(), Replicate());
  auto mixes_partials = [](const Placements& p) {
    try {
      check_placements("test", p, 2, static_cast<int64_t>(p.size()));
      return false;
    } catch (const ValueError&) {
      return true;  // Partial(sum) with Partial(max): no single value, rejected at the API
    }
  };
  for (const Placements& from : all) {
    if (mixes_partials(from)) continue;
    for (const Placements& to : all) {
      if (mixes_partials(to)) continue;
      const RedistributePlan& plan = cache.get({shape, 8, m.shape(), from, to});
      std::vector<IssuedCollective> issued;
      at::Tensor out = run_redistribute(block_of(g, m, from), m, plan, &issued);
      std::string what =
          str_cat("redistribute ", to_string(from), " -> ", to_string(to), " on ", m.to_string());
      ++g_checks;
      std::vector<StepKind> planned, ran;
      for (auto& s : plan.steps) {
        if (is_collective(s.kind) && m.size(s.axis) > 1) planned.push_back(s.kind);  // size 1: nothing moves
      }
      for (auto& c : issued) ran.push_back(c.kind);
      if (planned != ran) g_failures += str_cat("FAIL ", what, ": issued collectives differ from the plan\n");
      bool has_partial = std::any_of(to.begin(), to.end(), [](const Placement& p) { return p.is_partial(); });
      if (!has_partial) {
        check_equal(what, out, local_block(g, m.shape(), to, m.coordinate()));
      } else {  // a Partial result is checked through its reduction
        at::Tensor full = run_redistribute(out, m, cache.get({shape, 8, m.shape(), to, replicated}));
        check_equal(what + " (reduced)", full, g);
      }
    }
  }
}

// The validation matrix: every op with a sharding rule, on every combination of input placements (asymmetric
// Partial inputs included), against the op on the whole tensors; prints, per op, how many combinations ran by
// a rule and how many fell back to gathering. Wrong results: none allowed.
void check_op_matrix(const std::shared_ptr<const mesh::DeviceMesh>& m) {
  using namespace dtrain::tensor;
  auto t = [](std::vector<int64_t> shape, int salt) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return ((at::arange(n, at::kLong) * (3 + salt) + salt) % 13 - 6).view(shape).to(at::kDouble);
  };
  struct OpCase {
    std::string name;
    std::vector<at::Tensor> inputs;
    std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;
  };
  std::vector<OpCase> cases{
      {"relu", {t({7, 5}, 0)}, [](auto& x) { return at::relu(x[0]); }},
      {"add", {t({7, 5}, 0), t({7, 5}, 1)}, [](auto& x) { return x[0] + x[1]; }},
      {"mul (broadcast row)", {t({7, 5}, 0), t({5}, 2)}, [](auto& x) { return x[0] * x[1]; }},
      {"mm", {t({7, 5}, 0), t({5, 3}, 1)}, [](auto& x) { return at::mm(x[0], x[1]); }},
      {"addmm", {t({3}, 2), t({7, 5}, 0), t({5, 3}, 1)}, [](auto& x) { return at::addmm(x[0], x[1], x[2]); }},
      {"sum", {t({7, 5}, 0)}, [](auto& x) { return x[0].sum(); }},
      {"sum dim 0", {t({7, 5}, 0)}, [](auto& x) { return x[0].sum({0}); }},
      {"sum dim 1 keepdim", {t({7, 5}, 0)}, [](auto& x) { return x[0].sum({1}, true); }},
      {"t", {t({7, 5}, 0)}, [](auto& x) { return x[0].t(); }},
      {"clone", {t({7, 5}, 0)}, [](auto& x) { return x[0].clone(); }},
      {"ones_like", {t({7, 5}, 0)}, [](auto& x) { return at::ones_like(x[0]); }},
      {"to float32", {t({7, 5}, 0)}, [](auto& x) { return x[0].to(at::kFloat); }},
      {"softmax dim 1", {t({7, 5}, 0)}, [](auto& x) { return at::_softmax(x[0], 1, false); }},
      {"log_softmax dim 0", {t({7, 5}, 0)}, [](auto& x) { return at::_log_softmax(x[0], 0, false); }},
      {"softmax backward dim 1",
       {t({7, 5}, 0), t({7, 5}, 1)},  // integer-valued: a Partial split of it is exact
       [](auto& x) { return at::_softmax_backward_data(x[0], x[1], 1, at::kDouble); }},
  };
  for (auto& c : cases) {
    std::vector<std::vector<Placements>> per_input;
    for (auto& x : c.inputs) {
      std::vector<Placement> opts{Replicate(), Partial()};
      for (int d = 0; d < x.dim(); ++d) opts.push_back(Shard(d));
      std::vector<Placements> all{{}};
      for (int a = 0; a < m->ndim(); ++a) {
        std::vector<Placements> next;
        for (auto& p : all) {
          for (auto& o : opts) {
            next.push_back(p);
            next.back().push_back(o);
          }
        }
        all = next;
      }
      per_input.push_back(all);
    }
    at::Tensor want = c.fn(c.inputs);
    int combos = 0, fell_back = 0;
    std::vector<size_t> pick(per_input.size(), 0);
    for (;;) {
      std::vector<at::Tensor> dts;
      std::string what = c.name;
      bool valid = true;
      for (size_t i = 0; i < per_input.size(); ++i) {
        const Placements& p = per_input[i][pick[i]];
        try {
          check_placements("matrix", p, c.inputs[i].dim(), m->ndim());
        } catch (const ValueError&) {
          valid = false;
        }
        what += " " + to_string(p);
        if (valid) dts.push_back(from_local(block_of(c.inputs[i], *m, p), m, p, c.inputs[i].sizes().vec()));
      }
      if (valid) {
        ++combos;
        int64_t before = tensor::detail::gather_count();
        at::Tensor out = c.fn(dts);
        if (tensor::detail::gather_count() != before) ++fell_back;
        check_equal(what, full_tensor(out), want);
      }
      int i = static_cast<int>(pick.size()) - 1;
      while (i >= 0 && ++pick[i] == per_input[i].size()) pick[i--] = 0;
      if (i < 0) break;
    }
    if (m->group()->group_rank() == 0) {
      std::fprintf(stderr, "validation matrix %s: %-20s %4d combinations, %4d by rule, %3d fell back\n",
                   m->to_string().c_str(), c.name.c_str(), combos, combos - fell_back, fell_back);
    }
  }
}

void suite_redistribute(const comm::BackendPtr& world) {
  using tensor::Partial;
  using tensor::Replicate;
  using tensor::Shard;
  const int ws = world->group_size();
  mesh::DeviceMesh line(world, {ws}, {"x"});
  check_all_pairs(line, {Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum), Partial(ReduceOp::kAvg),
                         Partial(ReduceOp::kMax), Partial(ReduceOp::kMin)});
  if (ws == 2) {  // a 2-d mesh with a size-1 axis: steps on it are relabellings
    mesh::DeviceMesh tall(world, {2, 1}, {"dp", "tp"});
    check_all_pairs(tall, {Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum)});
  }
  if (ws == 4) {
    mesh::DeviceMesh square(world, {2, 2}, {"dp", "tp"});
    check_all_pairs(square,
                    {Replicate(), Shard(0), Shard(1), Partial(ReduceOp::kSum), Partial(ReduceOp::kMax)});
  }
  world->barrier()->wait();
}

// DTensor end to end on real collectives: creation and gathering, uneven shapes, pointwise ops that stay
// sharded, ops without a rule that gather (and strict mode), in-place ops, and an nn::Linear + AdamW step
// with replicated DTensor parameters equal to the same step on plain tensors.
void suite_dtensor(const comm::BackendPtr& world) {
  using namespace dtrain::tensor;
  const int ws = world->group_size();
  auto mesh = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{ws},
                                                       std::vector<std::string>{"x"});
  at::Tensor g = (at::arange(35, at::kLong).view({7, 5}) * 3 % 17 - 8).to(at::kDouble);
  at::Tensor h = (at::arange(35, at::kLong).view({7, 5}) * 5 % 13 - 6).to(at::kDouble);
  for (Placement p : {Shard(0), Shard(1), Replicate()}) {
    at::Tensor dt = distribute_tensor(g, mesh, {p});
    ++g_checks;
    if (!is_dtensor(dt) || dt.sizes() != g.sizes())
      g_failures += str_cat("FAIL distribute_tensor ", p.to_string(), "\n");
    check_equal(str_cat("to_local ", p.to_string()), to_local(dt),
                local_block(g, mesh->shape(), {p}, mesh->coordinate()));
    check_equal(str_cat("full_tensor ", p.to_string()), full_tensor(dt), g);
    at::Tensor again = from_local(to_local(dt).clone(), mesh, {p});  // global shape found from the blocks
    ++g_checks;
    if (again.sizes() != g.sizes()) g_failures += str_cat("FAIL from_local shape ", again.sizes(), "\n");
  }
  at::Tensor a = distribute_tensor(g, mesh, {Shard(0)});
  at::Tensor b = distribute_tensor(h, mesh, {Shard(0)});
  check_equal("redistribute S(0)->S(1)", to_local(redistribute(a, {Shard(1)})),
              local_block(g, mesh->shape(), {Shard(1)}, mesh->coordinate()));
  // Pointwise ops keep the shard layout (the gather fallback would return Replicate).
  at::Tensor c = a * b + a;
  ++g_checks;
  if (!is_dtensor(c) || placements_of(c) != Placements{Shard(0)})
    g_failures += "FAIL pointwise left Shard(0)\n";
  check_equal("pointwise a*b+a", full_tensor(c), g * h + g);
  a.add_(2);
  ++g_checks;
  if (placements_of(a) != Placements{Shard(0)}) g_failures += "FAIL in-place add_ changed placements\n";
  check_equal("in-place add_", full_tensor(a), g + 2);
  // mm by its rule: (S(0), R) -> S(0), no gathering.
  at::Tensor w = distribute_tensor(h.t().contiguous(), mesh, {Replicate()});
  int64_t gathers = tensor::detail::gather_count();
  at::Tensor m = at::mm(a, w);
  ++g_checks;
  if (placements_of(m) != Placements{Shard(0)} || tensor::detail::gather_count() != gathers) {
    g_failures += str_cat("FAIL mm (S(0), R) did not run by its rule: ", to_string(placements_of(m)), "\n");
  }
  check_equal("mm by rule", full_tensor(m), at::mm(g + 2, h.t()));
  // cumsum has no rule: gathered, correct, Replicate; strict mode refuses it.
  at::Tensor cs = at::cumsum(a, 0);
  check_equal("cumsum through the gather fallback", full_tensor(cs), at::cumsum(g + 2, 0));
  setenv("DTRAIN_DTENSOR_STRICT", "1", 1);
  ++g_checks;
  try {
    at::cumsum(a, 0);
    if (ws > 1) g_failures += "FAIL strict mode did not refuse cumsum\n";
  } catch (const NotSupportedError& e) {
    if (std::string(e.what()).find("aten::cumsum has no sharding rule") == std::string::npos) {
      g_failures += str_cat("FAIL strict message: ", e.what(), "\n");
    }
  }
  unsetenv("DTRAIN_DTENSOR_STRICT");
  // Gradients flow through from_local, redistribute and to_local (each backward is its dual).
  {
    at::Tensor wfull = (at::arange(35, at::kDouble).view({7, 5}) % 4) - 1;
    for (Placement p : {Shard(0), Shard(1), Partial()}) {
      at::Tensor mine = block_of(g, *mesh, {p}).clone().requires_grad_(true);
      at::Tensor dt = from_local(mine, mesh, {p}, g.sizes().vec());
      at::Tensor y = to_local(redistribute(dt, {Replicate()}));  // the whole tensor on every rank
      (y * wfull).sum().backward();
      // d/d(block) of sum(whole * W): W's block for a shard; all of W for each part of a Partial(sum).
      at::Tensor want = p.is_partial() ? wfull : local_block(wfull, mesh->shape(), {p}, mesh->coordinate());
      check_equal(str_cat("gradient through from_local/redistribute/to_local ", p.to_string()), mine.grad(),
                  want);
    }
  }
  // nn::Linear + AdamW with replicated DTensor parameters equals the plain step.
  torch::manual_seed(0);
  torch::nn::Linear plain(5, 3);
  torch::nn::Linear dist(5, 3);
  {
    torch::NoGradGuard ng;
    dist->weight.copy_(plain->weight);
    dist->bias.copy_(plain->bias);
  }
  distribute_module(*dist, mesh);
  ++g_checks;
  if (!is_dtensor(dist->weight) || !is_dtensor(dist->parameters()[0]))
    g_failures += "FAIL distribute_module\n";
  at::Tensor x = (at::arange(20, at::kFloat).view({4, 5}) % 7 - 3) / 4;
  torch::optim::AdamW opt_plain(plain->parameters(), torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW opt_dist(dist->parameters(), torch::optim::AdamWOptions(0.01));
  for (int step = 0; step < 2; ++step) {
    opt_plain.zero_grad();
    opt_dist.zero_grad();
    at::Tensor loss_plain = torch::relu(plain->forward(x)).sum();
    at::Tensor loss_dist = torch::relu(dist->forward(distribute_tensor(x, mesh, {Replicate()}))).sum();
    loss_plain.backward();
    loss_dist.backward();
    check_equal(str_cat("linear loss step ", step), full_tensor(loss_dist), loss_plain.detach());
    check_equal(str_cat("linear weight grad step ", step), full_tensor(dist->weight.grad()),
                plain->weight.grad());
    opt_plain.step();
    opt_dist.step();
  }
  check_equal("linear weight after AdamW", full_tensor(dist->weight.detach()), plain->weight.detach());
  check_equal("linear bias after AdamW", full_tensor(dist->bias.detach()), plain->bias.detach());
  // Data parallel by the rules alone: batch Shard(0), parameters Replicate. The weight gradient comes out
  // Partial(sum) (each rank's rows), and AdamW's first op on it all-reduces it; no op gathers.
  torch::nn::Linear ref(5, 3), dp(5, 3);  // both start from plain's current weights, with fresh optimizers
  {
    torch::NoGradGuard ng;
    for (auto* mod : {&ref, &dp}) {
      (*mod)->weight.copy_(plain->weight);
      (*mod)->bias.copy_(plain->bias);
    }
  }
  distribute_module(*dp, mesh);
  torch::optim::AdamW opt_ref(ref->parameters(), torch::optim::AdamWOptions(0.01));
  torch::optim::AdamW opt_dp(dp->parameters(), torch::optim::AdamWOptions(0.01));
  at::Tensor batch = (at::arange(35, at::kFloat).view({7, 5}) % 5 - 2) / 3;
  int64_t gathers_before_dp = tensor::detail::gather_count();
  CommLog::instance().clear();
  at::Tensor lp = torch::relu(ref->forward(batch)).sum();
  at::Tensor ld = torch::relu(dp->forward(distribute_tensor(batch, mesh, {Shard(0)}))).sum();
  lp.backward();
  ld.backward();
  // The step's communication so far: the two Partial parameter gradients are all-reduced when AdamW first
  // combines them with the Replicate parameters (before that, nothing moves: forward and backward run on the
  // batch rows).
  CommTotals totals = CommLog::instance().totals();
  check_close("data parallel loss", full_tensor(ld), lp.detach());
  check_close("data parallel weight grad", full_tensor(dp->weight.grad()), ref->weight.grad());
  check_close("data parallel bias grad", full_tensor(dp->bias.grad()), ref->bias.grad());
  CommLog::instance().clear();  // the checks above gathered for comparison
  opt_ref.step();
  opt_dp.step();
  CommTotals after_step = CommLog::instance().totals();
  // Forward and backward move nothing; the step all-reduces each Partial gradient exactly once (AdamW reads
  // it in three ops; the redistributed block is reused while the gradient is unchanged): 2 all_reduces, 15 +
  // 3 floats.
  ++g_checks;
  if (ws > 1 &&
      (totals.collectives != 0 || after_step.by_kind["all_reduce"] != 2 || after_step.collectives != 2 ||
       after_step.bytes != static_cast<int64_t>(18 * sizeof(float)))) {
    g_failures += str_cat("FAIL data parallel comm: ", totals.collectives,
                          " collectives before the step, then\n", CommLog::instance().summary());
  }
  if (ws > 1 && world->group_rank() == 0) {
    std::fprintf(stderr, "data parallel step comm:\n%s", CommLog::instance().summary().c_str());
  }
  check_close("data parallel weight after AdamW", full_tensor(dp->weight.detach()), ref->weight.detach());
  check_close("data parallel bias after AdamW", full_tensor(dp->bias.detach()), ref->bias.detach());
  ++g_checks;
  if (tensor::detail::gather_count() != gathers_before_dp) {
    g_failures +=
        str_cat("FAIL data parallel step gathered ", tensor::detail::gather_count() - gathers_before_dp,
                " times; every op should have run by a rule\n");
  }
  world->barrier()->wait();
}

}  // namespace

int main(int argc, char** argv) {
  std::string suite = argc > 1 ? argv[1] : "collectives";
  std::string dir = argc > 2 ? argv[2] : ".";
  at::set_num_threads(1);
  comm::BackendPtr world = comm::init();
  std::ofstream out(str_cat(dir, "/rank", world->global_rank(), ".txt"));
  try {
    if (suite == "collectives") {
      suite_collectives(*world, {0, 1, 37, 262147});
    } else if (suite == "mesh") {
      suite_mesh(world);
    } else if (suite == "dtensor") {
      suite_dtensor(world);
    } else if (suite == "ops") {
      const int ws = world->group_size();
      check_op_matrix(std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{ws},
                                                               std::vector<std::string>{"x"}));
      if (ws == 4) {
        check_op_matrix(std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{2, 2},
                                                                 std::vector<std::string>{"dp", "tp"}));
      }
    } else if (suite == "redistribute") {
      suite_redistribute(world);
    } else if (suite == "short-wait") {
      suite_short_wait(*world);
    } else if (suite == "delayed") {
      suite_delayed(*world);
    } else if (suite == "missing-rank") {
      suite_missing_rank(*world, out);
    } else {
      g_failures += str_cat("unknown suite ", suite, "\n");
    }
  } catch (const std::exception& e) {
    g_failures += str_cat("EXCEPTION ", e.what(), "\n");
  }
  out << (g_failures.empty() ? "ok " : "failed ") << g_checks << "\n" << g_failures;
  out.close();
  std::fprintf(stderr, "%s", g_failures.c_str());
  return g_failures.empty() ? 0 : 1;
}

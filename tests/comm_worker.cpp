// One rank of the process-tier comm tests, started by tests/comm_process_test.cpp through the launcher
// (`dtrain run` semantics, real engines). Every result is compared with a single-process reference computed
// with plain libtorch on integer-valued inputs, so equality is exact. Writes "<dir>/rank<R>.txt" with "ok
// <checks>" or what failed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "comm/factory.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "mesh/mesh_math.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

using namespace dtrain;
using namespace dtrain::test;
using comm::ReduceOp;
using comm::WorkPtr;

namespace {

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
        // the same with the input given as scratch (Gloo reduces in it), uneven and equal
        comm::ReduceScatterOptions scratch;
        scratch.input_is_scratch = true;
        at::Tensor in = input_of(me, total, dt);
        at::Tensor out2 = at::empty({counts[me]}, dt);
        b.reduce_scatter_v(out2, in, counts, scratch)->wait();
        check_equal(tag("reduce_scatter_v scratch", dt, n), out2,
                    want_full.narrow(0, offset, counts[me]).to(dt));
        at::Tensor want_eq = input_of(0, n * ws, dt);
        for (int r = 1; r < ws; ++r) want_eq = want_eq + input_of(r, n * ws, dt);
        at::Tensor out3 = at::empty({n}, dt);
        b.reduce_scatter(out3, input_of(me, n * ws, dt), scratch)->wait();
        check_equal(tag("reduce_scatter scratch", dt, n), out3, want_eq.narrow(0, me * n, n).to(dt));
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
    } else if (suite == "gpt") {
      suite_gpt(world);
    } else if (suite == "solved") {
      suite_solved(world);
    } else if (suite == "dp") {
      suite_data_parallel(world);
    } else if (suite == "zero") {
      suite_zero(world);
    } else if (suite == "hsdp") {
      suite_hsdp(world);
    } else if (suite == "tp") {
      suite_tp(world);
    } else if (suite == "tp2d") {
      suite_tp2d(world);
    } else if (suite == "plan-module") {
      suite_plan_module(world, dir);
    } else if (suite == "clip") {
      suite_clip(world);
    } else if (suite == "matrix") {
      suite_matrix(world);
    } else if (suite == "checkpointing") {
      suite_checkpointing(world);
    } else if (suite == "deterministic") {
      suite_deterministic(world, dir);
    } else if (suite == "ops") {
      suite_ops(world);
    } else if (suite == "hardening") {
      suite_hardening(world);
    } else if (suite == "failfast") {
      suite_failfast(world, dir);
    } else if (suite == "redistribute") {
      suite_redistribute(world);
    } else if (suite == "short-wait") {
      suite_short_wait(*world);
    } else if (suite == "delayed") {
      suite_delayed(*world);
    } else if (suite == "freeze") {
      suite_freeze(world, dir);
    } else if (suite == "cut-link") {
      suite_cut_link(world, dir);
    } else if (suite == "await-go") {
      suite_await_go(world, dir);
    } else if (suite == "linger") {
      suite_linger(world, dir);
    } else if (suite == "early-exit") {
      suite_early_exit(world, dir);
    } else if (suite.rfind("mismatch-", 0) == 0) {
      suite_mismatch(world, dir, suite.substr(9));
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

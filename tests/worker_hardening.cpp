// The DTensor hardening suite (see worker_suites.h): the places where DTensor once gave a wrong answer
// without an error, let ranks decide differently, failed on one rank only, or kept memory without bound.
// Each check compares with plain libtorch in this process, or expects the error libtorch (or dtrain) gives.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "comm/comm_log.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/dtensor_random.h"
#include "tensor/redistribute.h"
#include "tensor/settings.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

using namespace dtrain::tensor;
using comm::ReduceOp;

at::Tensor dtensor_of(const at::Tensor& full, const MeshPtr& m, const Placements& p) {
  return from_local(block_of(full, *m, p).clone(), m, p, full.sizes().vec());
}

// Runs `f`, which must throw E with `needle` in its message.
template <typename E, typename F>
void expect_error(const std::string& what, const std::string& needle, F&& f) {
  ++g_checks;
  try {
    f();
    g_failures += str_cat("FAIL ", what, ": no error\n");
  } catch (const E& e) {
    std::string msg = e.what();
    if (msg.find(needle) == std::string::npos) {
      g_failures += str_cat("FAIL ", what, ": the error does not say \"", needle, "\": ", msg, "\n");
    }
  } catch (const std::exception& e) {
    g_failures += str_cat("FAIL ", what, ": unexpected error type: ", e.what(), "\n");
  }
}

void with_settings(const std::function<void(DTensorSettings&)>& change, const std::function<void()>& f) {
  const DTensorSettings before = settings();
  DTensorSettings s = before;
  change(s);
  set_settings(s);
  try {
    f();
  } catch (...) {
    set_settings(before);
    throw;
  }
  set_settings(before);
}

void check_wrong_results(const comm::BackendPtr& world, const MeshPtr& m) {
  const int ws = world->group_size();
  const at::Tensor x = data({7, 5}, 0);
  // out= reductions over one dim are reductions over that dim (not full reductions).
  for (const Placements& p : {Placements{Shard(0)}, Placements{Shard(1)}, Placements{Partial()}}) {
    at::Tensor dt = dtensor_of(x, m, p);
    at::Tensor out = at::empty_like(dt);
    at::sum_out(out, dt, {1});
    check_equal(str_cat("sum_out dim 1 of ", to_string(p)), full_tensor(out), x.sum({1}));
    at::Tensor out2 = at::empty_like(dt);
    at::mean_out(out2, dt, {0});
    check_close(str_cat("mean_out dim 0 of ", to_string(p)), full_tensor(out2), x.mean({0}), 1e-12);
  }
  // Casts keep a Partial only where the cast commutes with the reduction.
  {
    at::Tensor part = at::full({3}, 0.6, at::kDouble);
    at::Tensor sum = part.clone();
    for (int r = 1; r < ws; ++r) sum = sum + part;
    at::Tensor dt = from_local(part, m, {Partial()}, std::vector<int64_t>{3});
    check_equal("Partial(sum) of 0.6 parts cast to int64", full_tensor(dt.to(at::kLong)), sum.to(at::kLong));
    check_close("Partial(sum) cast to float32", full_tensor(dt.to(at::kFloat)), sum.to(at::kFloat), 1e-6);
    at::Tensor mx = at::full({3}, world->group_rank() == 0 && ws > 1 ? -1.0 : 0.0, at::kDouble);
    at::Tensor dmax = from_local(mx, m, {Partial(ReduceOp::kMax)}, std::vector<int64_t>{3});
    check_equal("Partial(max) of {-1, 0} cast to bool", full_tensor(dmax.to(at::kBool)),
                at::full({3}, false, at::kBool));
  }
  // A view of a sharded DTensor is a view of the block (writes reach the base), and a view libtorch refuses
  // is refused.
  {
    at::Tensor base = data({7, 6}, 1);
    at::Tensor dt = dtensor_of(base, m, {Shard(0)});
    at::Tensor v = dt.view({7, 2, 3});
    v.mul_(2);
    check_equal("in-place write through view() reaches the base", full_tensor(dt), base * 2);
    expect_error<c10::Error>("view() of a transposed DTensor", "view", [&] { dt.t().view({42}); });
  }
  // Autograd through from_local(Partial(avg)) divides the gradient by the parts; max/min are refused.
  {
    at::Tensor w = data({7, 5}, 3);
    at::Tensor local = block_of(x, *m, {Partial(ReduceOp::kAvg)}).clone().requires_grad_(true);
    at::Tensor dt = from_local(local, m, {Partial(ReduceOp::kAvg)}, x.sizes().vec());
    (full_tensor(dt) * w).sum().backward();
    check_close("gradient of a Partial(avg) part", local.grad(), w / ws, 1e-12);
    for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
      at::Tensor l = block_of(x, *m, {Partial(op)}).clone().requires_grad_(true);
      expect_error<NotSupportedError>(str_cat("from_local(", Partial(op).to_string(), ") with grad"),
                                      "would go only to the rank holding the extreme value",
                                      [&] { from_local(l, m, {Partial(op)}, x.sizes().vec()); });
    }
  }
  // Rules validate the dims they read: a ValueError, not an out-of-bounds read.
  {
    at::Tensor dt = dtensor_of(x, m, {Shard(0)});
    expect_error<ValueError>("var over dim 5 of a 2-d DTensor", "dim 5 is out of range",
                             [&] { at::var(dt, {5}); });
    at::Tensor dt3 = dtensor_of(data({3, 7, 5}, 0), m, {Shard(0)});
    expect_error<ValueError>("layer_norm with normalized_shape [6] of [3, 7, 5]", "is not the trailing dims",
                             [&] { at::layer_norm(dt3, {6}); });
  }
  // Plain tensors meeting a DTensor are taken as Replicate: in strict and check modes, one that differs
  // across ranks is an error on every rank.
  if (ws > 1) {
    at::Tensor dt = dtensor_of(x, m, {Replicate()});
    at::Tensor mine = at::full({7, 5}, static_cast<double>(world->group_rank()), at::kDouble);
    at::Tensor same = at::full({7, 5}, 2.0, at::kDouble);
    for (bool strict : {true, false}) {
      with_settings([&](DTensorSettings& s) { (strict ? s.strict : s.check) = true; },
                    [&] {
                      expect_error<ValueError>(
                          str_cat("a rank-specific plain tensor (", strict ? "strict" : "check", " mode)"),
                          "differs across ranks", [&] { (void)(dt + mine); });
                      check_equal(str_cat("an equal plain tensor (", strict ? "strict" : "check", " mode)"),
                                  full_tensor(dt + same), x + 2);
                    });
    }
  }
}

void check_meshes(const comm::BackendPtr& world, const MeshPtr& m) {
  const at::Tensor x = data({4, 3}, 0);
  // Another mesh object over the same ranks in the same layout combines.
  auto again = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{world->group_size()},
                                                        std::vector<std::string>{"y"});
  check_equal("DTensors on two meshes of the same ranks",
              full_tensor(dtensor_of(x, m, {Shard(0)}) + dtensor_of(x, again, {Replicate()})), x * 2);
  if (world->group_size() != 4) return;
  // The "dp" and "tp" sub-meshes of a 2x2 mesh have the same shape but not the same ranks.
  mesh::DeviceMesh grid(world, {2, 2}, {"dp", "tp"});
  auto dp = std::make_shared<const mesh::DeviceMesh>(grid.sub_mesh("dp"));
  auto tp = std::make_shared<const mesh::DeviceMesh>(grid.sub_mesh("tp"));
  at::Tensor a = from_local(x, dp, {Replicate()}, x.sizes().vec());
  at::Tensor b = from_local(x, tp, {Replicate()}, x.sizes().vec());
  expect_error<ValueError>("DTensors on the dp and tp sub-meshes", "different meshes",
                           [&] { (void)(a + b); });
}

void check_random(const comm::BackendPtr& world, const MeshPtr& m) {
  const int me = world->group_rank();
  const at::Tensor shape_of = at::zeros({7, 5}, at::kDouble);
  // Ranks seeded differently still draw one Replicate mask.
  at::manual_seed(100 + me);
  at::Tensor rep = dtensor_of(shape_of + 1, m, {Replicate()});
  at::Tensor dropped = to_local(at::dropout(rep, 0.5, true)).contiguous();
  at::Tensor all = at::empty({world->group_size(), 7, 5}, at::kDouble);
  world->all_gather(all, dropped)->wait();
  for (int r = 0; r < world->group_size(); ++r) {
    check_equal(str_cat("dropout mask of a Replicate DTensor on rank ", r, " (seeded per rank)"), all[r],
                all[0]);
  }
  // A sharded draw is the block of the global draw, and equals one process's draw (a 1-rank mesh here).
  comm::BackendPtr solo_group = world->split(me, 0);
  auto solo = std::make_shared<const mesh::DeviceMesh>(solo_group, std::vector<int64_t>{1},
                                                       std::vector<std::string>{"solo"});
  tensor::manual_seed(5);
  at::Tensor one = to_local(at::rand_like(dtensor_of(shape_of, solo, {Replicate()})));
  for (const Placements& p : {Placements{Replicate()}, Placements{Shard(0)}, Placements{Shard(1)}}) {
    tensor::manual_seed(5);
    check_equal(str_cat("rand_like ", to_string(p), " equals one process's draw"),
                full_tensor(at::rand_like(dtensor_of(shape_of, m, p))), one);
    tensor::manual_seed(9);
    at::Tensor t = dtensor_of(shape_of, m, p);
    t.normal_(1.0, 2.0);
    tensor::manual_seed(9);
    at::Tensor u = dtensor_of(shape_of, solo, {Replicate()});
    u.normal_(1.0, 2.0);
    check_equal(str_cat("normal_ on ", to_string(p), " equals one process's draw"), full_tensor(t),
                to_local(u));
  }
  // The values are a sound uniform draw.
  ++g_checks;
  if (!(one.min().item<double>() >= 0 && one.max().item<double>() < 1 && one.std().item<double>() > 0.1)) {
    g_failures += str_cat("FAIL rand_like values are not uniform in [0, 1): ", one, "\n");
  }
  at::Generator g = at::detail::createCPUGenerator(1);
  expect_error<NotSupportedError>("normal_ with an explicit generator on a DTensor", "explicit generator",
                                  [&] { dtensor_of(shape_of, m, {Shard(0)}).normal_(0, 1, g); });
}

// Ops whose block-level result once depended on the block's own sizes.
void check_uneven(const comm::BackendPtr& world, const MeshPtr& m) {
  const int ws = world->group_size();
  // 2 ws - 1 rows: the last rank holds one row, so its block has a size-1 dim the tensor does not.
  const int64_t rows = 2 * ws - 1;
  at::Tensor x = data({rows, 1, 5}, 2);
  at::Tensor dt = dtensor_of(x, m, {Shard(0)});
  check_equal("squeeze() of uneven shards", full_tensor(dt.squeeze()), x.squeeze());
  check_equal("squeeze(0) of uneven shards", full_tensor(dt.squeeze(0)), x.squeeze(0));
  check_equal("squeeze(1) of uneven shards", full_tensor(dt.squeeze(1)), x.squeeze(1));
  // More ranks than rows: empty blocks.
  if (ws > 1) {
    at::Tensor y = data({ws - 1, 5}, 4);
    at::Tensor dy = dtensor_of(y, m, {Shard(0)});
    check_equal("amax over rows with an empty block", full_tensor(at::amax(dy, {0})), at::amax(y, {0}));
    check_equal("amin over rows with an empty block", full_tensor(at::amin(dy, {0})), at::amin(y, {0}));
    check_equal("amax keepdim with an empty block", full_tensor(at::amax(dy, {0}, true)),
                at::amax(y, {0}, true));
  }
  // The example: linear with x Partial(sum) [13, 1, 3] and W Shard(1) [5, 3], forward and backward,
  // under check mode (every decision compared across ranks).
  with_settings(
      [](DTensorSettings& s) { s.check = true; },
      [&] {
        at::Tensor xf = data({13, 1, 3}, 0), wf = data({5, 3}, 1);
        at::Tensor xr = xf.clone().requires_grad_(true), wr = wf.clone().requires_grad_(true);
        at::Tensor want = at::linear(xr, wr);
        at::Tensor grad = data(want.sizes().vec(), 5);
        want.backward(grad);
        // The ranks' parts differ in layout where it carries no meaning (the stride of the size-1 dim).
        at::Tensor part = block_of(xf, *m, {Partial()});
        at::Tensor xl = (world->group_rank() == 0 ? part.squeeze(1).clone().unsqueeze(1) : part.clone())
                            .requires_grad_(true);
        at::Tensor wl = block_of(wf, *m, {Shard(1)}).clone().requires_grad_(true);
        at::Tensor out = at::linear(from_local(xl, m, {Partial()}, xf.sizes().vec()),
                                    from_local(wl, m, {Shard(1)}, wf.sizes().vec()));
        check_equal("linear(P(sum) [13, 1, 3], S(1) [5, 3])", full_tensor(out.detach()), want.detach());
        out.backward(from_local(grad, m, {Replicate()}, grad.sizes().vec()));
        check_equal("its gradient of x", xl.grad(), xr.grad());
        check_equal("its gradient of W", wl.grad(),
                    local_block(wr.grad(), m->shape(), {Shard(1)}, m->coordinate()));
      });
  // Check mode catches ranks that decide differently (here: rank 0 runs another op).
  if (ws > 1) {
    with_settings([](DTensorSettings& s) { s.check = true; },
                  [&] {
                    at::Tensor a = dtensor_of(data({7, 5}, 0), m, {Shard(0)});
                    expect_error<ValueError>("check mode with rank 0 running another op",
                                             "decided differently", [&] {
                                               if (world->group_rank() == 0) {
                                                 (void)(a * 2);
                                               } else {
                                                 (void)(a + 2);
                                               }
                                             });
                  });
  }
}

void check_memory(const comm::BackendPtr& world, const MeshPtr& m) {
  const at::Tensor x = data({16, 8}, 0);  // 1 KiB
  clear_redistribute_cache();
  // Bounded: at most cache_bytes of redistributed copies, whatever the number of DTensors.
  with_settings([](DTensorSettings& s) { s.cache_bytes = 4096; },
                [&] {
                  std::vector<at::Tensor> keep;
                  int64_t most = 0;
                  for (int i = 0; i < 12; ++i) {
                    keep.push_back(dtensor_of(x + i, m, {Shard(0)}));
                    check_equal("a cached copy's values",
                                detail::redistributed_local(keep.back(), {Replicate()}), x + i);
                    most = std::max(most, redistribute_cache_bytes());
                  }
                  ++g_checks;
                  if (most > 4096 || (world->group_size() > 1 && most == 0)) {
                    g_failures +=
                        str_cat("FAIL redistributed copies took ", most, " bytes under a 4096-byte bound\n");
                  }
                  // A changed DTensor is redistributed afresh.
                  keep.back().add_(1);
                  check_equal("a copy after an in-place change",
                              detail::redistributed_local(keep.back(), {Replicate()}), x + 12);
                  // Freed with their DTensor, and all at once by clear_redistribute_cache().
                  keep.clear();
                  check_equal("copies freed with their DTensors",
                              at::scalar_tensor(redistribute_cache_bytes()), at::scalar_tensor(int64_t{0}));
                  at::Tensor held = dtensor_of(x, m, {Shard(0)});
                  detail::redistributed_local(held, {Replicate()});
                  clear_redistribute_cache();
                  check_equal("clear_redistribute_cache", at::scalar_tensor(redistribute_cache_bytes()),
                              at::scalar_tensor(int64_t{0}));
                  {
                    NoRedistributeCache none;
                    detail::redistributed_local(held, {Replicate()});
                    check_equal("nothing kept under NoRedistributeCache",
                                at::scalar_tensor(redistribute_cache_bytes()), at::scalar_tensor(int64_t{0}));
                  }
                });
  // CommLog keeps the last records only, and counts every collective.
  if (world->group_size() > 1) {
    comm::CommLog& log = comm::CommLog::instance();
    log.clear();
    log.set_capacity(4);
    for (int i = 0; i < 10; ++i) full_tensor(dtensor_of(x, m, {Shard(0)}));
    ++g_checks;
    if (log.records().size() != 4 || log.totals().collectives != 10 || log.dropped() != 6) {
      g_failures += str_cat("FAIL comm::CommLog bound: ", log.records().size(), " records kept, ",
                            log.totals().collectives, " counted, ", log.dropped(), " dropped\n");
    }
    log.set_capacity(comm::CommLog::kDefaultCapacity);
    log.clear();
  }
}

}  // namespace

void suite_hardening(const comm::BackendPtr& world) {
  auto m = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{world->group_size()},
                                                    std::vector<std::string>{"x"});
  check_wrong_results(world, m);
  check_meshes(world, m);
  check_random(world, m);
  check_uneven(world, m);
  check_memory(world, m);
  world->barrier()->wait();
}

void suite_failfast(const comm::BackendPtr& world, const std::string& dir) {
  // The last rank's plan lookup fails (its profile file is missing, as on a node without it) inside a DTensor
  // op; the others go on into the op's collective. Every rank records when and what it raised.
  auto m = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{world->group_size()},
                                                    std::vector<std::string>{"x"});
  const int me = world->group_rank();
  const bool failing = me == world->group_size() - 1;
  at::Tensor dt = dtensor_of(data({7, 5}, 0), m, {Shard(0)});
  world->barrier()->wait();
  if (failing) {
    DTensorSettings s = settings();
    s.comm_profile = "/nonexistent/dtrain-profile-on-this-node-only.json";
    set_settings(s);
  }
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  std::string what;
  try {
    full_tensor(dt);
    what = "none";
  } catch (const std::exception& e) {
    what = e.what();
  }
  const int64_t at_ms = now_ms();
  std::ofstream out(str_cat(dir, "/failfast", me, ".txt"));
  out << (failing ? "raised " : "caught ") << at_ms << " " << what << "\n";
  ++g_checks;
}

}  // namespace dtrain::test

// Per-op overhead of dtrain's DTensor dispatch (C++) on small tensors, against the same op on plain tensors:
// alone, a 1-rank mesh (no communication, only dispatch: Replicate and Shard(0)); under `dtrain run -n N`, an
// N-rank mesh (Shard(0) only), where a sharded op redistributes as PyTorch's does (run it with
// DTRAIN_DTENSOR_CACHE_MB=0 so that dtrain does not reuse the gathered operand across calls). Rank 0 prints.
// bench/dtensor_overhead.py measures PyTorch's Python DTensor the same way; bench/RESULTS.md records both.
//   usage: dtensor_overhead [iterations]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "comm/factory.h"
#include "core/env.h"
#include "tensor/dtensor.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

namespace {

// Microseconds per call of `f`, the best of 5 runs of `iters` calls.
double us_per_op(const std::function<void()>& f, int iters) {
  for (int i = 0; i < iters / 10; ++i) f();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / iters * 1e6);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  at::set_num_threads(1);
  const bool launched = env_get(current_env(), "WORLD_SIZE").has_value();
  auto world = launched ? comm::init() : comm::create_backend("gloo", RankInfo{}, std::chrono::seconds(30));
  const int n = world->group_size();
  auto mesh =
      std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{n}, std::vector<std::string>{"x"});
  at::Tensor a = at::randn({16, 16}), b = at::randn({16, 16});
  struct Layout {
    const char* name;
    tensor::Placement p;
  };
  std::vector<Layout> layouts{Layout{"Shard(0)", tensor::Shard(0)}};
  if (n == 1) layouts.insert(layouts.begin(), Layout{"Replicate", tensor::Replicate()});
  for (Layout layout : layouts) {
    at::Tensor da = tensor::distribute_tensor(a, mesh, {layout.p});
    at::Tensor db = tensor::distribute_tensor(b, mesh, {layout.p});
    struct Op {
      const char* name;
      std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> fn;
    };
    for (const Op& op : {Op{"add", [](auto&x, auto&y) { return x + y; }},
                         Op{"relu", [](auto&x, auto&) { return at::relu(x); }},
                         Op{"mm", [](auto&x, auto&y) { return at::mm(x, y); }}}) {
      double plain = us_per_op([&] { op.fn(a, b); }, iters);
      double dt = us_per_op([&] { op.fn(da, db); }, iters);
      nlohmann::json j{{"tool", "dtrain"},  {"op", op.name},    {"layout", layout.name},
                       {"plain_us", plain}, {"dtensor_us", dt}, {"overhead_us", dt - plain},
                       {"shape", "16x16"},  {"iters", iters},   {"ranks", n}};
      if (world->group_rank() == 0) std::printf("%s\n", j.dump().c_str());
    }
  }
  return 0;
}

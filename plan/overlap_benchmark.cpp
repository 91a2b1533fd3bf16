// The overlap benchmark; see overlap_benchmark.h.
#include "plan/overlap_benchmark.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "comm/comm_log.h"
#include "core/error.h"
#include "plan/measure_in_step.h"

namespace dtrain::plan {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void products(at::Tensor& a, const at::Tensor& w, int64_t k) {
  for (int64_t i = 0; i < k; ++i) a = at::mm(a, w).div_(16.0);
}

}  // namespace

double measure_overlap(comm::Backend& g) {
  if (g.group_size() < 2) {
    throw ValueError("overlap benchmark: needs at least 2 ranks (one rank communicates nothing).");
  }
  comm::NotLogged quiet;
  at::Tensor a = at::randn({256, 256}), w = at::randn({256, 256});
  products(a, w, 4);  // warm-up
  auto t0 = Clock::now();
  products(a, w, 16);
  // products for about 0.2 s; as many all-reduces of 1 MiB as take about as long (agreed over the ranks)
  const int64_t k = std::max<int64_t>(4, static_cast<int64_t>(0.2 / std::max(1e-6, since(t0) / 16)));
  std::vector<at::Tensor> bufs;
  auto reduce_all = [&](int64_t m) {
    std::vector<comm::WorkPtr> works;
    for (int64_t i = 0; i < m; ++i) works.push_back(g.all_reduce(bufs[i]));
    return works;
  };
  bufs.push_back(at::zeros({1 << 18}));
  t0 = Clock::now();
  for (auto& wk : reduce_all(1)) wk->wait();
  const double one = slowest_seconds(g, since(t0));
  const int64_t m = static_cast<int64_t>(slowest_seconds(
      g, static_cast<double>(std::clamp<int64_t>(static_cast<int64_t>(0.05 / std::max(1e-6, one)), 1, 64))));
  while (static_cast<int64_t>(bufs.size()) < m) bufs.push_back(at::zeros({1 << 18}));
  std::vector<double> fractions;
  for (int round = 0; round < 5; ++round) {
    t0 = Clock::now();
    products(a, w, k);
    const double c = slowest_seconds(g, since(t0));
    t0 = Clock::now();
    for (auto& wk : reduce_all(m)) wk->wait();
    const double comm_alone = slowest_seconds(g, since(t0));
    t0 = Clock::now();
    std::vector<comm::WorkPtr> works;
    for (int64_t i = 0; i < m; ++i) {  // one all-reduce issued after each m-th of the products
      products(a, w, k / m + (i < k % m ? 1 : 0));
      works.push_back(g.all_reduce(bufs[i]));
    }
    for (auto& wk : works) wk->wait();
    const double both = slowest_seconds(g, since(t0));
    fractions.push_back(
        std::clamp((c + comm_alone - both) / std::max(1e-9, std::min(c, comm_alone)), 0.0, 1.0));
  }
  std::sort(fractions.begin(), fractions.end());
  return fractions[fractions.size() / 2];
}

}  // namespace dtrain::plan

// The overlap benchmark; see overlap_benchmark.h.
#include "plan/overlap_benchmark.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "comm/comm_log.h"
#include "comm/rehearsal.h"
#include "core/error.h"
#include "parallel/tensor_parallel.h"

namespace dtrain::plan {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The largest of every rank's `seconds` (the group's time).
double slowest(comm::Backend& g, double seconds) {
  comm::NotLogged quiet;
  at::Tensor t = at::full({1}, seconds, at::kDouble);
  comm::AllReduceOptions max;
  max.op = comm::ReduceOp::kMax;
  g.all_reduce(t, max)->wait();
  return t.item<double>();
}

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
  const double one = slowest(g, since(t0));
  const int64_t m = static_cast<int64_t>(slowest(
      g, static_cast<double>(std::clamp<int64_t>(static_cast<int64_t>(0.05 / std::max(1e-6, one)), 1, 64))));
  while (static_cast<int64_t>(bufs.size()) < m) bufs.push_back(at::zeros({1 << 18}));
  std::vector<double> fractions;
  for (int round = 0; round < 5; ++round) {
    t0 = Clock::now();
    products(a, w, k);
    const double c = slowest(g, since(t0));
    t0 = Clock::now();
    for (auto& wk : reduce_all(m)) wk->wait();
    const double comm_alone = slowest(g, since(t0));
    t0 = Clock::now();
    std::vector<comm::WorkPtr> works;
    for (int64_t i = 0; i < m; ++i) {  // one all-reduce issued after each m-th of the products
      products(a, w, k / m + (i < k % m ? 1 : 0));
      works.push_back(g.all_reduce(bufs[i]));
    }
    for (auto& wk : works) wk->wait();
    const double both = slowest(g, since(t0));
    fractions.push_back(
        std::clamp((c + comm_alone - both) / std::max(1e-9, std::min(c, comm_alone)), 0.0, 1.0));
  }
  std::sort(fractions.begin(), fractions.end());
  return fractions[fractions.size() / 2];
}

double measure_blocking_penalty(const ProfileTarget& t, const comm::BackendPtr& group, int64_t mb,
                                const ClusterProfile& links) {
  const int64_t n = group->group_size();
  if (n < 2 || !t.tp_plan) return 0;
  // the same split on the real group and on a rehearsal group, a pass of each in turn (so that the machine's
  // drift over the rounds falls on both), the median of the rounds' differences
  std::shared_ptr<torch::nn::Module> real_m = t.build(), rehearsed_m = t.build();
  parallel::TensorParallel real_tp(*real_m, group, t.tp_plan(false));
  parallel::TensorParallel rehearsed_tp(
      *rehearsed_m, comm::rehearsal_group(static_cast<int>(n), group->group_rank()), t.tp_plan(false));
  auto pass = [&](torch::nn::Module& m) {
    const auto t0 = Clock::now();
    t.loss(m, mb).backward();
    return slowest(*group, since(t0));
  };
  pass(*real_m);  // warm-ups
  pass(*rehearsed_m);
  std::vector<comm::CommRecord> calls;
  std::vector<double> diffs;
  for (int i = 0; i < 7; ++i) {
    comm::CommLog::instance().clear();
    const double real = pass(*real_m);
    if (calls.empty()) calls = comm::CommLog::instance().records();
    comm::CommLog::instance().clear();
    diffs.push_back(real - pass(*rehearsed_m));
  }
  comm::CommLog::instance().clear();
  std::sort(diffs.begin(), diffs.end());
  const double difference = diffs[diffs.size() / 2];
  if (calls.empty()) return 0;
  double ab = 0;
  for (const auto& r : calls) {
    const double bytes = static_cast<double>(r.kind == comm::StepKind::kAllGather ? r.bytes * n : r.bytes);
    ab += links.seconds(comm::to_string(r.kind), n, bytes, false);
  }
  return std::max(0.0, (difference - ab) / static_cast<double>(calls.size()));
}

}  // namespace dtrain::plan

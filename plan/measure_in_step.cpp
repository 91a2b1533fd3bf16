// measure_in_step(); see measure_in_step.h.
#include "plan/measure_in_step.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>

#include "comm/comm_log.h"
#include "comm/rehearsal.h"
#include "core/error.h"
#include "parallel/parallelize.h"
#include "parallel/tensor_parallel.h"

namespace dtrain::plan {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A real step and a rehearsed one, in turn, after a warm-up of each: the median of their differences, and
// the collectives CommLog saw in the first timed real step.
struct Paired {
  double difference = 0;
  std::vector<comm::CommRecord> calls;
};
template <typename Real, typename Rehearsed>
Paired paired(const InStepRequest& r, comm::Backend& group, Real real, Rehearsed rehearsed) {
  real();
  rehearsed();
  Paired out;
  std::vector<double> diffs;
  const auto t0 = Clock::now();
  for (int i = 0; i < r.max_rounds; ++i) {
    // past the fewest rounds, more while the point's time allows (rank 0's clock decides for all)
    if (i >= r.rounds && slowest_seconds(group, group.group_rank() == 0 ? since(t0) : 0) > r.point_s) break;
    comm::CommLog::instance().clear();
    const double a = real();
    if (out.calls.empty()) out.calls = comm::CommLog::instance().records();
    comm::CommLog::instance().clear();
    diffs.push_back(a - rehearsed());
  }
  comm::CommLog::instance().clear();
  std::sort(diffs.begin(), diffs.end());
  out.difference = diffs[diffs.size() / 2];
  return out;
}

// An eighth of `largest` and `largest` (one size when they meet): the ends of the candidates' range, so that
// every candidate's figure is read between two measured points.
std::vector<int64_t> two_sizes(int64_t largest) {
  const int64_t lo = std::max<int64_t>(1, largest / 8), hi = std::max<int64_t>(1, largest);
  return lo == hi ? std::vector<int64_t>{lo} : std::vector<int64_t>{lo, hi};
}

void measure_tp(const InStepRequest& r, InStepCosts& out) {
  const ProfileTarget& t = *r.target;
  const int64_t deg = r.tp_degrees.back();
  const int rank = r.world->group_rank();
  const comm::BackendPtr group =
      deg == r.world->group_size() ? r.world : r.world->split(static_cast<int>(rank / deg), rank);
  for (bool sp : {false, true}) {
    if (sp && !t.sequence_parallel) continue;
    std::shared_ptr<torch::nn::Module> real_m = t.build(), rehearsed_m = t.build();
    parallel::TensorParallel real_tp(*real_m, group, t.tp_plan(sp));
    parallel::TensorParallel rehearsed_tp(
        *rehearsed_m, comm::rehearsal_group(static_cast<int>(deg), group->group_rank()), t.tp_plan(sp));
    for (int64_t mb : two_sizes(std::max<int64_t>(1, r.batch * deg / r.topo.world))) {
      auto pass = [&](torch::nn::Module& m) {
        const auto t0 = Clock::now();
        t.loss(m, mb).backward();
        return slowest_seconds(*group, since(t0));
      };
      const Paired p = paired(
          r, *group, [&] { return pass(*real_m); }, [&] { return pass(*rehearsed_m); });
      if (p.calls.empty()) continue;
      double priced = 0;  // as the step model prices tp's calls: alpha-beta each, blocking
      for (const auto& c : p.calls) {
        const double bytes =
            static_cast<double>(c.kind == comm::StepKind::kAllGather ? c.bytes * deg : c.bytes);
        priced += r.links.seconds(comm::to_string(c.kind), deg, bytes, false);
      }
      const auto n = static_cast<int64_t>(p.calls.size());
      out.points.push_back(
          {sp ? "tp sp" : "tp", 0, mb, 1, n, (p.difference - priced) / static_cast<double>(n)});
    }
  }
}

void measure_data_parallel(const InStepRequest& r, InStepCosts& out) {
  const ProfileTarget& t = *r.target;
  const int n = r.world->group_size();
  std::vector<std::pair<std::string, int64_t>> cases{
      {"dp", r.bucket_bytes > 0 ? r.bucket_bytes : default_bucket_bytes()}};
  for (int64_t u : zero3_unit_sizes(*r.facts, 1)) cases.emplace_back("zero3", u);
  ClusterProfile links = r.links;
  links.in_step = {};
  for (const auto& [strategy, bytes] : cases) {
    parallel::ParallelConfig pc;
    pc.strategy = strategy;
    pc.reduction.bucket_bytes = bytes;
    auto adamw = [](std::vector<at::Tensor> params) {
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-4));
    };
    // (the rehearsal plays rank 0, whose share of an uneven split is the largest, as the compute profile's
    // do)
    std::shared_ptr<torch::nn::Module> real_m = t.build(), rehearsed_m = t.build();
    auto real_par = parallel::parallelize(*real_m, r.world, pc, adamw);
    auto rehearsed_par = parallel::parallelize(*rehearsed_m, comm::rehearsal_group(n), pc, adamw);
    // accumulation 1 at both sizes; 2 at the smaller one (what each further micro-batch adds)
    const std::vector<int64_t> sizes = two_sizes(std::max<int64_t>(1, r.batch / n));
    std::vector<std::pair<int64_t, int64_t>> points;
    for (int64_t mb : sizes) points.emplace_back(mb, 1);
    points.emplace_back(sizes.front(), 2);
    for (const auto& [mb, acc] : points) {
      auto step = [&, mb = mb, acc = acc](torch::nn::Module& m, parallel::Parallelized& par) {
        const auto t0 = Clock::now();
        par.zero_grad();
        for (int64_t k = 0; k < acc; ++k) {
          par.set_requires_gradient_sync(k == acc - 1);
          (t.loss(m, mb) / static_cast<double>(acc)).backward();
        }
        par.step();
        return slowest_seconds(*r.world, since(t0));
      };
      const Paired p = paired(
          r, *r.world, [&] { return step(*real_m, *real_par); },
          [&] { return step(*rehearsed_m, *rehearsed_par); });
      // what the step model prices for this step's communication, and its calls
      Candidate c;
      c.strategy = strategy;
      c.micro_batch = mb;
      c.accumulation = acc;
      c.bucket_bytes = bytes;
      predict(c, *r.facts, *r.compute, links, r.topo, r.overlap);
      if (c.comm_calls <= 0) continue;
      out.points.push_back({strategy, bytes, mb, acc, c.comm_calls,
                            (p.difference - c.exposed_comm_s) / static_cast<double>(c.comm_calls)});
    }
  }
}

}  // namespace

double slowest_seconds(comm::Backend& g, double seconds) {
  comm::NotLogged quiet;
  at::Tensor t = at::full({1}, seconds, at::kDouble);
  comm::AllReduceOptions max;
  max.op = comm::ReduceOp::kMax;
  g.all_reduce(t, max)->wait();
  return t.item<double>();
}

InStepCosts measure_in_step(const InStepRequest& r) {
  if (!r.target || !r.facts || !r.compute || !r.world || r.world->group_size() < 2) {
    throw ValueError("in-step costs: need a target, its facts, a compute model and 2 ranks or more.");
  }
  const auto t0 = Clock::now();
  InStepCosts out;
  if (!r.tp_degrees.empty() && r.target->tp_plan) measure_tp(r, out);
  measure_data_parallel(r, out);
  out.measured_s = since(t0);
  return out;
}

}  // namespace dtrain::plan

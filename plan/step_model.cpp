// The step model; see step_model.h.
#include "plan/step_model.h"

#include <algorithm>
#include <map>
#include <string>

#include "core/error.h"
#include "parallel/data_parallel.h"
#include "parallel/strategy.h"
#include "plan/memory_model.h"

namespace dtrain::plan {

namespace {

// Seconds of one collective per bucket, summed; and the last bucket's alone.
struct Reduction {
  double total = 0, last = 0;
};
Reduction over_buckets(const ClusterProfile& links, const std::string& op, int64_t n,
                       const std::vector<int64_t>& buckets, double divide, bool across) {
  Reduction r;
  for (int64_t b : buckets) {
    r.last = links.seconds(op, n, static_cast<double>(b) / divide, across);
    r.total += r.last;
  }
  return r;
}

// What is left of `comm` seconds run under `compute` seconds: the overlap hides that fraction of the shorter.
double hidden_rest(double comm, double compute, double overlap) {
  return comm - overlap * std::min(std::max(0.0, comm), compute);
}

}  // namespace

std::vector<int64_t> pack_buckets(const std::vector<int64_t>& bytes, int64_t first, int64_t cap) {
  std::vector<int64_t> out;
  int64_t cur = 0;
  for (int64_t b : bytes) {
    const int64_t limit = out.empty() ? first : cap;
    if (cur > 0 && cur + b > limit) {
      out.push_back(cur);
      cur = 0;
    }
    cur += b;
  }
  if (cur > 0) out.push_back(cur);
  return out;
}

int64_t default_bucket_bytes() { return parallel::with_horovod_env({}).bucket_bytes; }

std::vector<int64_t> zero3_unit_sizes(const ModelFacts& f, int64_t tp) {
  const int64_t whole = default_bucket_bytes();
  std::vector<int64_t> out{whole};
  const int64_t eighth = f.params_per_rank(tp) * f.element_bytes / 8;
  int64_t p = 64 << 10;
  while (p * 2 <= eighth) p *= 2;
  if (p < whole && eighth >= (64 << 10)) out.push_back(p);
  return out;
}

void predict(Candidate& c, const ModelFacts& f, const ComputeModel& compute, const ClusterProfile& links,
             const Topology& topo, double overlap) {
  const int64_t n = topo.world / c.tp;
  const ComputeSetting setting{c.tp, c.sequence_parallel, c.checkpoint_activations};
  if (!compute.has(setting)) {
    throw ValueError(str_cat("plan: the compute profile has no measurement under ", setting.to_string(),
                             ". Measure it again with that degree (it is cached by the degrees asked for)."));
  }
  const double mb = static_cast<double>(c.micro_batch), acc = static_cast<double>(c.accumulation);
  const double fwd = compute.forward_s(mb, setting), bwd = compute.backward_s(mb, setting);
  // the mesh: [dp, tp] (tp inner unless the order says "tp,dp"), hsdp's [replicate, shard] likewise
  const bool tp_inner = !parallel::groups_strided(c.mesh_order);
  const bool tp_across = topo.across(tp_inner, c.tp, topo.world);
  // each blocking call's in-step cost beyond alpha-beta: measured for this model (plan/in_step_costs.h), else
  // the profile's blocking penalty
  const double tp_penalty =
      links.in_step.per_call(c.sequence_parallel ? "tp sp" : "tp", 0, mb).value_or(links.blocking_penalty_s);
  double tp_s = 0;
  int64_t tp_calls = 0;
  for (const MeasuredComm& m : compute.tp_collectives(mb, setting)) {
    if (m.count == 0) continue;
    const double ab =
        links.seconds(m.op, c.tp, static_cast<double>(m.bytes) / static_cast<double>(m.count), tp_across);
    tp_s += static_cast<double>(m.count) * std::max(0.0, ab + tp_penalty);
    tp_calls += m.count;
  }
  c.compute_s = acc * (fwd + bwd);
  c.comm.clear();
  if (tp_s > 0) c.comm["tp"] = acc * tp_s;

  // this rank's gradients, packed as the engine packs them: reverse registration order (backward's)
  const parallel::Strategy s = parallel::parse_strategy(c.strategy);
  const bool zero3 = s == parallel::Strategy::kZero3 || s == parallel::Strategy::kHybridShard;
  std::vector<int64_t> grads;
  for (auto it = f.params.rbegin(); it != f.params.rend(); ++it) {
    const int64_t elems = it->tp_placement == "Replicate()" ? it->numel : (it->numel + c.tp - 1) / c.tp;
    grads.push_back(elems * f.element_bytes);
  }
  const int64_t cap = c.bucket_bytes > 0 ? c.bucket_bytes : default_bucket_bytes();
  const int64_t first = parallel::GradReductionOptions{}.first_bucket_bytes;
  // (zero3's units are whole modules up to the size, without data parallel's small first bucket)
  const std::vector<int64_t> buckets = pack_buckets(grads, zero3 ? cap : first, cap);
  const double P = static_cast<double>(f.params_per_rank(c.tp));
  const int64_t shard_group = s == parallel::Strategy::kHybridShard ? c.shard_size : n;
  // (hsdp is 1-d in tp: its mesh is over the world)
  const bool shard_inner =
      s == parallel::Strategy::kHybridShard ? !parallel::groups_strided(c.mesh_order) : !tp_inner;
  const bool dp_across = topo.across(c.tp > 1 && !tp_inner, n, topo.world);
  const bool shard_across = topo.across(shard_inner, shard_group, topo.world);
  const bool replicas_across = topo.across(!shard_inner, n / shard_group, topo.world);
  double exposed = 0;
  int64_t calls = 0;  // the data-parallel strategy's collectives in a step
  if (!zero3) {
    const char* op = s == parallel::Strategy::kDataParallel ? "all_reduce" : "reduce_scatter";
    const Reduction r = over_buckets(links, op, n, buckets, 1, dp_across);
    c.comm["gradients"] = r.total;
    exposed += r.last + hidden_rest(r.total - r.last, bwd, overlap);
    calls = static_cast<int64_t>(buckets.size());
    if (s != parallel::Strategy::kDataParallel) {  // zero1/2: the updated shards gathered after the step
      const Reduction g = over_buckets(links, "all_gather", n, buckets, 1, dp_across);
      c.comm["parameter all-gather"] = g.total;
      exposed += g.total;  // (its calls follow the step's wait for the gradients: no drift to wait out)
    }
  } else {
    const Reduction gather = over_buckets(links, "all_gather", shard_group, buckets, 1, shard_across);
    const Reduction scatter = over_buckets(links, "reduce_scatter", shard_group, buckets, 1, shard_across);
    double first = 0;
    if (!buckets.empty())
      first = links.seconds("all_gather", shard_group, static_cast<double>(buckets.back()), shard_across);
    c.comm["zero3 gathers"] = 2 * acc * gather.total;
    c.comm["gradients"] = scatter.total;
    exposed += acc * (first + hidden_rest(gather.total - first, fwd, overlap));
    exposed += (acc - 1) * hidden_rest(gather.total, bwd, overlap);
    exposed += scatter.last + hidden_rest(gather.total + scatter.total - scatter.last, bwd, overlap);
    // (no blocking penalty: the gathers are prefetched, one unit ahead, and the reduce-scatters are waited
    // for once, before the step; what they cost beyond this is zero3's in-step cost, below)
    const auto units = static_cast<int64_t>(buckets.size());
    calls = c.accumulation * 2 * units + units;
    if (s == parallel::Strategy::kHybridShard && n / shard_group > 1) {
      const Reduction rep = over_buckets(links, "all_reduce", n / shard_group, buckets,
                                         static_cast<double>(shard_group), replicas_across);
      c.comm["hsdp replicas"] = rep.total;
      exposed += rep.total;  // (after each unit's reduce-scatter; counted whole)
      calls += units;
    }
  }
  // what these calls cost in a real step beyond the model above, measured for this model (in_step_costs.h;
  // dp's figure, per gradient bucket, serves zero1 and zero2): per call in a step of one micro-batch, plus
  // what each further micro-batch adds where that was measured (else per call over all of them)
  c.in_step_s = 0;
  if (n <= 1) calls = 0;  // (one data-parallel rank communicates nothing)
  if (n > 1) {
    const char* family = zero3 ? "zero3" : "dp";
    if (const auto per = links.in_step.per_call(family, cap, mb)) {
      const auto more = links.in_step.per_micro_batch(family, cap);
      const auto units = static_cast<int64_t>(buckets.size());
      const int64_t calls_of_one = zero3 ? calls - (c.accumulation - 1) * 2 * units : calls;
      // (a further micro-batch's calls add to a step; a negative difference is the two steps' noise)
      c.in_step_s = more ? *per * static_cast<double>(calls_of_one) + (acc - 1) * std::max(0.0, *more)
                         : *per * static_cast<double>(calls);
    }
  }
  exposed = std::max(0.0, exposed + c.in_step_s);
  c.comm_calls = calls + c.accumulation * tp_calls;
  if (c.sequence_parallel && c.tp > 1) {  // the parameters left whole: their gradients summed once a step
    double whole = 0;
    for (const auto& p : f.params) {
      if (p.tp_placement == "Replicate()") whole += static_cast<double>(p.numel * f.element_bytes);
    }
    const double t = links.seconds("all_reduce", c.tp, whole, tp_across);
    c.comm["tp"] += t;
    tp_s += t / acc;
  }
  const double stepped = s == parallel::Strategy::kDataParallel ? P : P / static_cast<double>(shard_group);
  c.optimizer_s = compute.optimizer_s(stepped);
  c.comm_s = 0;
  for (const auto& [k, v] : c.comm) c.comm_s += v;
  c.exposed_comm_s = exposed + acc * tp_s;
  c.strategy_overhead_s = 0;
  c.predicted_step_s = c.compute_s + c.optimizer_s + c.exposed_comm_s;

  // memory
  const double eb = static_cast<double>(f.element_bytes);
  const double unit =
      zero3 && !buckets.empty() ? static_cast<double>(*std::max_element(buckets.begin(), buckets.end())) : 0;
  // The peak is the larger of two moments: the forward and backward passes (activations, and a gathered
  // unit) and the optimizer's step (every gradient, no activations).
  // Tensor parallel alone (one data-parallel rank): a plain optimizer over the module's parameters. Its
  // gradients are set to none after each step and accumulate in place, so the passes of a step without
  // accumulation hold none of them, and accumulation keeps no second copy.
  const bool plain = n == 1 && c.tp > 1;
  const double state = model_state_bytes_per_param(s, static_cast<double>(shard_group)) * P * eb / 4.0;
  auto at_step = [&](int64_t accumulation) {
    std::map<std::string, double> m;
    m["model state"] = state;
    if (accumulation > 1 && !plain) m["accumulated gradients"] = P * eb;
    return m;
  };
  auto at_passes = [&](int64_t accumulation, double micro_batch) {
    std::map<std::string, double> m = at_step(accumulation);
    if (plain && accumulation == 1) m["model state"] -= P * eb;
    if (unit > 0) m["gathered unit"] = unit;
    m["activations"] = compute.activation_bytes(micro_batch, setting);
    return m;
  };
  auto sum = [](const std::map<std::string, double>& m) {
    double t = 0;
    for (const auto& [k, v] : m) t += v;
    return t;
  };
  std::map<std::string, double> passes = at_passes(c.accumulation, mb), stepping = at_step(c.accumulation);
  // what the strategy's own code adds at each moment, from its rehearsal (tp 1: the data-parallel strategies)
  const bool rehearsed = c.tp == 1 && n > 1;
  const StrategyPoint* r1 =
      rehearsed ? compute.rehearsal(c.strategy, cap, c.checkpoint_activations, 1) : nullptr;
  const StrategyPoint* r2 =
      rehearsed ? compute.rehearsal(c.strategy, cap, c.checkpoint_activations, 2) : nullptr;
  const StrategyPoint* mine = c.accumulation == 1 ? r1 : r2;
  if (mine) {
    passes["strategy buffers (rehearsed)"] =
        static_cast<double>(mine->peak_bytes) -
        sum(at_passes(mine->accumulation, static_cast<double>(mine->micro_batch)));
    stepping["step buffers (rehearsed)"] =
        static_cast<double>(mine->step_peak_bytes) - sum(at_step(mine->accumulation));
  }
  c.memory = sum(stepping) > sum(passes) ? stepping : passes;
  c.memory["data"] = static_cast<double>(f.data_bytes);
  if (r1 && r2) {  // time beyond forward, backward and optimizer: per micro-batch and per step
    auto over = [&](const StrategyPoint& r) {
      const double rm = static_cast<double>(r.micro_batch);
      return r.step_s -
             static_cast<double>(r.accumulation) *
                 (compute.forward_s(rm, setting) + compute.backward_s(rm, setting)) -
             c.optimizer_s;
    };
    const double per_micro =
        std::max(0.0, (over(*r2) - over(*r1)) / static_cast<double>(r2->accumulation - 1));
    const double per_step = std::max(0.0, over(*r1) - per_micro);
    c.strategy_overhead_s = acc * per_micro + per_step;
  }
  c.predicted_step_s += c.strategy_overhead_s;
  c.predicted_peak_bytes = sum(c.memory);
}

}  // namespace dtrain::plan

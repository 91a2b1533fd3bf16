// Measuring a module's compute; see measure_compute.h.
#include "plan/measure_compute.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "comm/comm_log.h"
#include "comm/rehearsal.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "dispatch/tensor_memory.h"
#include "parallel/activation_checkpointing.h"
#include "plan/rehearse_strategy.h"

namespace dtrain::plan {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

uint64_t fnv(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The sizes measured under degree `tp`: its largest, then halving down to its smallest, largest first.
std::vector<int64_t> sizes_for(const MeasureOptions& o, int64_t tp) {
  int64_t largest = 0;
  for (auto [t, mb] : o.largest_micro_batch) {
    if (t == tp) largest = mb;
  }
  std::vector<int64_t> out;
  for (int64_t mb = largest; mb >= std::max<int64_t>(1, o.smallest_micro_batch); mb /= 2) out.push_back(mb);
  if (out.empty()) out.push_back(largest);
  if (out.size() == 1) out.push_back(out[0] + 1);  // (a line needs two sizes)
  return out;
}

// One forward and backward of `mb` samples: seconds of each, and the bytes tensors peaked at above what was
// live before (the gradients exist already, from a warm-up: only activations and temporaries are counted).
ComputePoint run_once(const ProfileTarget& t, torch::nn::Module& m, int64_t mb, int64_t group) {
  ComputePoint p;
  p.micro_batch = mb;
  comm::CommLog::instance().clear();
  const int64_t live = dispatch::tensor_bytes_live();
  dispatch::reset_tensor_peak();
  const auto t0 = Clock::now();
  at::Tensor loss = t.loss(m, mb);
  p.forward_s = since(t0);
  if (loss.numel() != 1 || !loss.requires_grad()) {
    throw ValueError(str_cat("compute profile of ", t.description, ": the loss has ", loss.numel(),
                             " elements", loss.requires_grad() ? "" : " and no gradient",
                             "; it must be the scalar mean loss of the micro-batch."));
  }
  const auto t1 = Clock::now();
  loss.backward();
  p.backward_s = since(t1);
  loss = at::Tensor();
  p.activation_bytes = std::max<int64_t>(0, dispatch::tensor_bytes_peak() - live);
  std::map<std::string, MeasuredComm> by_op;
  for (const comm::CommRecord& r : comm::CommLog::instance().records()) {
    MeasuredComm& c = by_op[comm::to_string(r.kind)];
    c.op = comm::to_string(r.kind);
    c.count += 1;
    c.bytes += r.kind == comm::StepKind::kAllGather ? r.bytes * group : r.bytes;  // (the log has the input)
  }
  comm::CommLog::instance().clear();
  for (auto& [op, c] : by_op) p.comm.push_back(c);
  return p;
}

// Every size of `setting`: a warm-up each, then `repeats` timed runs each, round-robin over the sizes, so
// that a slow spell of the machine spreads over the sizes instead of settling on all of one size's repeats
// (which made one size's figure 15% high beside its neighbours'). Sizes are added until the time limit would
// be spent, the repeats still to come counted (two sizes at least).
void measure_setting(const ProfileTarget& t, const MeasureOptions& o, const ComputeSetting& setting,
                     Clock::time_point start, ComputeProfile& out) {
  std::shared_ptr<torch::nn::Module> m = t.build();
  std::unique_ptr<parallel::TensorParallel> tp;
  if (setting.tp > 1) {
    const parallel::TensorParallelPlan plan = t.tp_plan(setting.sequence_parallel);
    tp = std::make_unique<parallel::TensorParallel>(*m, comm::rehearsal_group(static_cast<int>(setting.tp)),
                                                    plan);
  }
  if (setting.checkpoint) parallel::checkpoint_activations(*m, t.checkpoint_patterns);
  struct Timed {
    int64_t mb = 0;
    int repeats = 1;
    std::vector<double> fwd, bwd;
    int64_t bytes = 0;
    std::vector<MeasuredComm> comm;
  };
  std::vector<Timed> sizes;
  double pending = 0;  // the seconds the repeats of the sizes added so far will take
  for (int64_t mb : sizes_for(o, setting.tp)) {
    if (sizes.size() >= 2 && since(start) + pending > o.time_limit_s) break;
    const double t0 = since(start);
    run_once(t, *m, mb, setting.tp);  // warm-up (and the gradients allocated)
    const double once = since(start) - t0;
    Timed s;
    s.mb = mb;
    s.repeats = once > 0.5 ? 1 : std::max(1, o.repeats);
    pending += s.repeats * once;
    sizes.push_back(std::move(s));
  }
  for (int r = 0;; ++r) {
    bool any = false;
    for (Timed& s : sizes) {
      if (r >= s.repeats) continue;
      any = true;
      ComputePoint p = run_once(t, *m, s.mb, setting.tp);
      s.comm = std::move(p.comm);
      s.fwd.push_back(p.forward_s);
      s.bwd.push_back(p.backward_s);
      s.bytes = std::max(s.bytes, p.activation_bytes);
    }
    if (!any) break;
  }
  for (Timed& s : sizes) {
    ComputePoint p;
    p.micro_batch = s.mb;
    p.setting = setting;
    p.forward_s = median(s.fwd);
    p.backward_s = median(s.bwd);
    p.activation_bytes = s.bytes;
    p.comm = std::move(s.comm);
    out.points.push_back(p);
  }
}

// How fast this machine runs just now: the fastest of three timings of a fixed piece of work on this thread
// (products of 192 x 192 float matrices, about 5 ms). Compared before and after each setting's sizes.
double probe_seconds() {
  static const at::Tensor a = at::linspace(-1, 1, 192 * 192).view({192, 192});
  double best = 1e9;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    at::Tensor x = a;
    for (int k = 0; k < 8; ++k) x = at::mm(x, a).tanh_();
    best = std::min(best, since(t0));
  }
  return best;
}

// Each setting's sizes with a probe before and after: a setting whose probes ran more than kUnsteady slower
// than the fastest probe of the profile was timed in a slow spell of the machine (a whole setting 20-40% high
// beside a profile measured minutes later). It is timed again where that second timing ends within 60% of
// the time limit, and the timing with the faster probes is kept. out.unsteady is the slowdown of the slowest
// setting kept (1: none).
void measure_steadily(const ProfileTarget& t, const MeasureOptions& o,
                      const std::vector<ComputeSetting>& settings, Clock::time_point start,
                      ComputeProfile& out) {
  constexpr double kUnsteady = 1.10;
  std::vector<std::pair<size_t, size_t>> range;  // each setting's points in out.points
  std::vector<double> took;                      // and the seconds it took
  std::vector<double> probes{probe_seconds()};
  for (const ComputeSetting& setting : settings) {
    const size_t first = out.points.size();
    const double t0 = since(start);
    measure_setting(t, o, setting, start, out);
    took.push_back(since(start) - t0);
    range.emplace_back(first, out.points.size() - first);
    probes.push_back(probe_seconds());
  }
  std::vector<double> slow(settings.size());
  for (size_t i = 0; i < settings.size(); ++i) slow[i] = (probes[i] + probes[i + 1]) / 2;
  const double fastest = *std::min_element(probes.begin(), probes.end());
  for (size_t i = 0; i < settings.size(); ++i) {
    // (a second timing only where it ends within 60% of the time limit: the rehearsals come after)
    if (slow[i] <= kUnsteady * fastest || since(start) + took[i] > 0.6 * o.time_limit_s) continue;
    ComputeProfile again;
    const double before = probe_seconds();
    measure_setting(t, o, settings[i], start, again);
    const double now = (before + probe_seconds()) / 2;
    if (now < slow[i] && again.points.size() == range[i].second) {
      std::copy(again.points.begin(), again.points.end(), out.points.begin() + range[i].first);
      slow[i] = now;
    }
  }
  out.unsteady = std::max(1.0, *std::max_element(slow.begin(), slow.end()) / fastest);
}

// AdamW over a fresh module's parameters (gradients of ones): seconds per parameter of its step.
void measure_optimizer(const ProfileTarget& t, ComputeProfile& out) {
  std::shared_ptr<torch::nn::Module> m = t.build();
  std::vector<at::Tensor> params;
  int64_t n = 0;
  for (auto& p : m->parameters()) {
    if (!p.requires_grad()) continue;
    p.mutable_grad() = at::ones_like(p);
    params.push_back(p);
    n += p.numel();
  }
  torch::optim::AdamW adam(params, torch::optim::AdamWOptions(1e-4));
  adam.step();  // the moments allocated
  std::vector<double> s;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    adam.step();
    s.push_back(since(t0));
  }
  out.params = n;
  out.optimizer_s_per_param = std::max(1e-15, median(s) / static_cast<double>(std::max<int64_t>(1, n)));
}

}  // namespace

std::string compute_signature(const ProfileTarget& target, const MeasureOptions& opts,
                              torch::nn::Module& built) {
  uint64_t h = fnv(1469598103934665603ull, target.description);
  for (const auto& item : built.named_parameters()) {
    h = fnv(h, item.key());
    h = fnv(h, str_cat(item.value().sizes(), at::toString(item.value().scalar_type())));
  }
  h = fnv(h, "rehearsals v3, repeats round-robin");  // (paired by accumulation; their passes' and step's
                                                     // peaks apart)
  h = fnv(h, freed_heap_kept() ? "heap kept" : "heap glibc's");  // (core/host_memory.h)
  h = fnv(h, str_cat("threads ", at::get_num_threads(), " ckpt ", target.checkpoint_patterns.size()));
  for (auto [tp, mb] : opts.largest_micro_batch) h = fnv(h, str_cat(" tp ", tp, " mb ", mb));
  h = fnv(h, str_cat(" smallest ", opts.smallest_micro_batch));
  for (const auto& r : opts.rehearsals) {
    h = fnv(h, str_cat(r.strategy, r.group, " ", r.bucket_bytes, r.checkpoint, r.accumulation, " ",
                       r.micro_batch));
  }
  if (target.tp_plan) {
    for (bool sp : {false, true}) {
      if (sp && !target.sequence_parallel) continue;
      for (const auto& [pattern, style] : target.tp_plan(sp).styles) h = fnv(h, str_cat(pattern, sp));
    }
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(h));
  return text;
}

ComputeProfile measure_compute(const ProfileTarget& t, const MeasureOptions& o) {
  if (!t.build || !t.loss) {
    throw ValueError("compute profile: the target needs a build and a loss function.");
  }
  for (auto [tp, mb] : o.largest_micro_batch) {
    if (tp < 1 || mb < 1 || (tp > 1 && !t.tp_plan)) {
      throw ValueError(str_cat(
          "compute profile of ", t.description, ": tp ", tp, " with largest micro-batch ", mb,
          " cannot be measured (both must be positive, and tp > 1 needs a ", "tensor-parallel plan)."));
    }
  }
  dispatch::install_tensor_memory_counter();
  const auto start = Clock::now();
  ComputeProfile out;
  {
    std::shared_ptr<torch::nn::Module> probe = t.build();
    out.signature = compute_signature(t, o, *probe);
    for (const auto& p : probe->parameters()) out.dtype = at::toString(p.scalar_type());
  }
  out.model = t.description;
  out.threads = at::get_num_threads();
  std::vector<ComputeSetting> settings;
  for (auto [tp, mb] : o.largest_micro_batch) {
    for (bool sp : {false, true}) {
      if (sp && (tp == 1 || !t.sequence_parallel)) continue;
      for (bool ckpt : {false, true}) {
        if (ckpt && t.checkpoint_patterns.empty()) continue;
        settings.push_back(ComputeSetting{tp, sp, ckpt});
      }
    }
  }
  measure_steadily(t, o, settings, start, out);
  measure_optimizer(t, out);
  rehearse_strategies(t, o.rehearsals, out);
  out.measured_s = since(start);
  return out;
}

ComputeProfile cached_compute_profile(const ProfileTarget& t, const MeasureOptions& o,
                                      const std::string& cache_dir, bool* measured, bool write) {
  std::string path;
  {
    std::shared_ptr<torch::nn::Module> probe = t.build();
    path = str_cat(cache_dir, "/compute-", compute_signature(t, o, *probe), ".json");
  }
  if (std::filesystem::exists(path)) {
    if (measured) *measured = false;
    return read_compute_profile(path);
  }
  ComputeProfile p = measure_compute(t, o);
  if (write) {
    std::error_code ec;
    std::filesystem::create_directories(cache_dir, ec);
    write_compute_profile(path, p);
  }
  if (measured) *measured = true;
  return p;
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("DTRAIN_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return str_cat(x, "/dtrain");
  const char* home = std::getenv("HOME");
  return str_cat(home && *home ? home : "/tmp", "/.cache/dtrain");
}

}  // namespace dtrain::plan

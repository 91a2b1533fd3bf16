// ZeRO-3's units (detail/zero_state.h): a parameter read by an op gathers its unit just in time, the next
// unit prefetched from the order recorded in the first pass, and a unit let go once the next is in use.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/graph_task.h>

#include "comm/comm_log.h"
#include "core/error.h"
#include "parallel/detail/zero_state.h"

namespace dtrain::parallel::detail {

namespace {

struct Zero3Source : dispatch::OnDemandSource {
  explicit Zero3Source(std::shared_ptr<ZeroState> impl) : impl(std::move(impl)) {}
  at::Tensor acquire(int index) override { return impl->acquire(index); }
  void written(int index, const at::Tensor& whole) override { impl->written(index, whole); }
  std::string describe() const override { return "a ZeRO-3 parameter (gathered on demand)"; }
  std::string replace_fix() const override {
    return "Convert the module (dtype, device) before applying ZeRO-3.";
  }
  std::shared_ptr<ZeroState> impl;
};

}  // namespace

std::shared_ptr<dispatch::OnDemandSource> ZeroState::make_source(std::shared_ptr<ZeroState> self) {
  return std::make_shared<Zero3Source>(std::move(self));
}

at::Tensor ZeroState::acquire(int i) {
  std::lock_guard<std::mutex> lock(units_mu);
  const GradBuckets::Param& p = engine.params[i];
  use_unit(p.bucket);
  return alias(shards[p.bucket].params_flat, p.offset, p.sizes);
}

void ZeroState::written(int i, const at::Tensor& whole) {
  std::lock_guard<std::mutex> lock(units_mu);
  keep_own_part(i, whole);
}

void ZeroState::use_unit(int u) {
  Units& z = units;
  const int phase = torch::autograd::get_current_graph_task_id() >= 0 ? 1 : 0;
  if (phase != z.phase) {
    if (z.phase >= 0) end_phase(z.phase);
    release_units_locked();
    z.phase = phase;
    z.pos[phase] = -1;
    z.run_started[phase] = false;
  }
  const bool recording = !z.recorded[phase];
  std::vector<int>& seq = z.seq[phase];
  if (u != z.current) {
    z.current = u;
    if (recording) {
      seq.push_back(u);
    } else {
      int& pos = z.pos[phase];
      int found = -1;
      for (int k = pos + 1; k < static_cast<int>(seq.size()) && found < 0; ++k)
        if (seq[k] == u) found = k;
      for (int k = 0; k <= pos && k < static_cast<int>(seq.size()) && found < 0; ++k)
        if (seq[k] == u) found = k;
      if (found >= 0) pos = found;
    }
  }
  ensure_gathered(u, phase);
  int next = -1;
  if (!recording && z.pos[phase] + 1 < static_cast<int>(seq.size()) && z.pos[phase] >= 0 &&
      seq[z.pos[phase]] == u) {
    next = seq[z.pos[phase] + 1];
    if (!shards[next].params_flat.defined()) start_gather(next, phase);
  }
  for (size_t w = 0; w < shards.size(); ++w) {
    const int k = static_cast<int>(w);
    if (k == u || k == next || (!z.pinned[phase].empty() && z.pinned[phase][w])) continue;
    if (shards[w].params_flat.defined()) release_unit(k);
  }
}

void ZeroState::end_phase(int phase) {
  Units& z = units;
  if (z.recorded[phase]) return;
  z.recorded[phase] = true;
  z.pinned[phase].assign(shards.size(), 0);
  std::vector<int> count(shards.size(), 0);
  std::string text = str_cat(engine.fingerprint, ":", phase, ":");
  for (int u : z.seq[phase]) {
    if (++count[u] > 1) z.pinned[phase][u] = 1;
    text += str_cat(u, ",");
  }
  z.fingerprint[phase] = fnv1a(text) | 2;
}

void ZeroState::start_gather(int u, int phase) {
  Shard& b = shards[u];
  Units& z = units;
  comm::AgreementRun run;  // the first pass: each gather checks itself
  if (z.recorded[phase]) {
    run = {z.fingerprint[phase], !z.run_started[phase]};
    z.run_started[phase] = true;
  }
  b.params_flat = at::empty({engine.buckets[u].numel}, b.shard_param.options().requires_grad(false));
  comm::CommCause cause("zero3");
  b.gather = engine.group->all_gather_v(b.params_flat, b.shard_param.detach(), b.counts, {{}, run});
}

void ZeroState::ensure_gathered(int u, int phase) {
  if (!shards[u].params_flat.defined()) start_gather(u, phase);
  finish_gather(u);
}

void ZeroState::finish_gather(int u) {
  Shard& b = shards[u];
  if (!b.gather) return;
  b.gather->wait();
  b.gather.reset();
}

void ZeroState::release_unit(int u) {
  finish_gather(u);  // a prefetch in flight: its buffer must outlive it
  shards[u].params_flat = at::Tensor();
}

void ZeroState::release_units_locked() {
  for (size_t u = 0; u < shards.size(); ++u) release_unit(static_cast<int>(u));
  units.current = -1;
}

void ZeroState::release_units() {
  std::lock_guard<std::mutex> lock(units_mu);
  if (units.phase >= 0) end_phase(units.phase);
  units.phase = -1;
  release_units_locked();
}

}  // namespace dtrain::parallel::detail

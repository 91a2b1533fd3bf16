// strategy auto; see auto_layout.h.
#include "apps/dtrain/gpt/auto_layout.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "apps/dtrain/gpt/plan_gpt.h"
#include "apps/dtrain/gpt/text_data.h"
#include "comm/gather_text.h"
#include "core/error.h"
#include "models/gpt.h"
#include "plan/plan_report.h"

namespace dtrain::train {

namespace {

// Steps 3..6 of a short run of `c`: the median seconds a step (collective).
double time_candidate(const TrainOptions& base, const plan::Candidate& c, const comm::BackendPtr& world,
                      const TextCorpus& corpus) {
  TrainOptions o = base;
  apply_candidate(o, c);
  o.steps = 6;
  o.log_every = 1000000;
  o.metrics.clear();
  o.timeline.clear();
  o.save.clear();
  o.resume.clear();
  o.init_from.clear();
  o.tp_plan = gpt_tensor_parallel_plan(o.model, o.sequence_parallel);
  o.activation_checkpointing.clear();
  if (o.checkpoint_activations) o.activation_checkpointing = {"h*"};
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;
  cfg.seed = o.seed;
  models::GPT gpt(cfg);
  const int64_t T = cfg.block_size;
  const DistributedSampler sampler(window_count(corpus.train, T), o.batch, o.seed);
  auto loss = [&](const Trainer::Batch& rows) {
    const at::Tensor& w = rows[0];
    return gpt->loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
  };
  auto batches = [&](int64_t step) -> Trainer::Batch {
    return {windows(corpus.train, T, sampler.step_indices(step))};
  };
  struct Times : Callback {
    std::vector<double> at;
    void on_step_end(Trainer&, const StepInfo& s) override { at.push_back(s.seconds); }
  };
  auto times = std::make_shared<Times>();
  Trainer trainer(*gpt, loss, batches, o, world);
  trainer.add_callback(times);
  trainer.fit();
  std::vector<double> d;
  for (size_t i = 3; i < times->at.size(); ++i) d.push_back(times->at[i] - times->at[i - 1]);
  std::sort(d.begin(), d.end());
  return d.empty() ? 0 : d[d.size() / 2];
}

}  // namespace

void choose_layout(TrainOptions& o, const comm::BackendPtr& world, const TextCorpus& corpus) {
  PlanContext ctx;
  ctx.world = world->group_size();
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  ctx.ranks_per_host =
      local && std::atoi(local) > 0 ? std::min<int64_t>(std::atoi(local), ctx.world) : ctx.world;
  if (ctx.world % ctx.ranks_per_host != 0) ctx.ranks_per_host = ctx.world;
  ctx.backend = world->name();
  ctx.group = world;
  ctx.corpus = &corpus;
  const GptPlan g = plan_gpt(o, ctx);
  const bool lead = world->group_rank() == 0;
  // (the plan is rank 0's on every rank: plan::plan_module agrees on it)
  const size_t k = static_cast<size_t>(std::max<int64_t>(1, o.auto_confirm));
  std::vector<plan::Candidate> top;
  for (const auto& c : g.plan.candidates) {
    if (c.fits && top.size() < k) top.push_back(c);
  }
  if (lead) {
    for (const auto& n : g.plan.notes) std::printf("dtrain train: plan: %s\n", n.c_str());
    if (o.verbose) std::printf("%s", plan::plan_table(g.plan).c_str());
  }
  plan::Candidate chosen = top.front();
  if (o.auto_confirm > 0) {
    double best = 0;
    for (size_t i = 0; i < top.size(); ++i) {
      if (lead) {
        std::printf("dtrain train: auto-confirm %zu/%zu: timing %s for 6 steps\n", i + 1, top.size(),
                    top[i].name().c_str());
        std::fflush(stdout);
      }
      const double t = time_candidate(o, top[i], world, corpus);
      // every rank keeps rank 0's timing, so that all choose alike
      const double agreed = std::stod(comm::all_gather_text(world, str_cat(t))[0]);
      if (lead) {
        std::printf("dtrain train: auto-confirm: %s predicted %.2f ms, measured %.2f ms (%+.1f%%)\n",
                    top[i].name().c_str(), top[i].predicted_step_s * 1e3, agreed * 1e3,
                    100.0 * (top[i].predicted_step_s - agreed) / agreed);
      }
      if (i == 0 || agreed < best) {
        best = agreed;
        chosen = top[i];
      }
    }
  }
  apply_candidate(o, chosen);
  o.micro_batch = 0;
  if (lead) {
    std::string flags;
    for (const auto& f : plan::candidate_flags(chosen, o.batch)) flags += " " + f;
    std::printf(
        "dtrain train: strategy auto chose %s: predicted %.2f ms a step and %.1f MiB of tensors per rank "
        "(%zu candidates%s; `dtrain plan` shows them all); the same as:%s\n",
        chosen.name().c_str(), chosen.predicted_step_s * 1e3, chosen.predicted_peak_bytes / (1 << 20),
        g.plan.candidates.size(), o.auto_confirm > 0 ? ", the fastest measured of the top ones" : "",
        flags.c_str());
    std::fflush(stdout);
  }
  o.config_notes.push_back(str_cat("strategy auto: ", chosen.name()));
}

}  // namespace dtrain::train

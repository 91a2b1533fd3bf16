// The GPT's planner inputs; see plan_gpt.h.
#include "apps/dtrain/gpt/plan_gpt.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>

#include "apps/dtrain/gpt/text_data.h"
#include "comm/factory.h"
#include "core/error.h"
#include "models/gpt.h"
#include "plan/plan_module.h"
#include "plan/plan_report.h"

namespace dtrain::train {

namespace {

models::GPTConfig run_config(const TrainOptions& o) {
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;  // bytes
  cfg.seed = o.seed;
  return cfg;
}

std::string describe(const models::GPTConfig& c) {
  return str_cat("GPT ", c.n_layer, "x", c.n_embd, ", ", c.n_head, " heads, seq ", c.block_size, ", vocab ",
                 c.vocab_size);
}

// The degrees the GPT's plan allows: dividing the world, the heads and the byte vocabulary.
std::vector<int64_t> tp_degrees(const models::GPTConfig& c, int64_t world) {
  std::vector<int64_t> out;
  for (int64_t t = 2; t <= world; ++t) {
    if (world % t == 0 && c.n_head % t == 0 && c.vocab_size % t == 0) out.push_back(t);
  }
  return out;
}

}  // namespace

GptPlan plan_gpt(const TrainOptions& o, const PlanContext& ctx) {
  const models::GPTConfig cfg = run_config(o);
  cfg.validate();
  const TextCorpus loaded = ctx.corpus ? TextCorpus{} : load_text(o.data);
  const TextCorpus& corpus = ctx.corpus ? *ctx.corpus : loaded;
  plan::ModulePlanRequest r;
  r.target.description = describe(cfg);
  r.target.build = [cfg] { return std::static_pointer_cast<torch::nn::Module>(models::GPT(cfg).ptr()); };
  const int64_t T = cfg.block_size;
  r.target.loss = [T](torch::nn::Module& m, int64_t mb) {
    auto& gpt = dynamic_cast<models::GPTImpl&>(m);
    const at::Tensor w = at::randint(256, {mb, T + 1}, at::kLong);
    return gpt.loss(w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous());
  };
  r.target.checkpoint_patterns = {"h*"};
  r.target.tp_plan = [cfg](bool sp) { return gpt_tensor_parallel_plan(cfg, sp); };
  r.target.sequence_parallel = true;
  r.tp_degrees = tp_degrees(cfg, ctx.world);
  r.data_bytes =
      corpus.train.numel() * corpus.train.element_size() + corpus.val.numel() * corpus.val.element_size();
  r.shape = plan::TransformerShape{cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab_size, 4};
  r.batch = o.batch;
  r.bucket_bytes = o.bucket_bytes;
  r.memory_budget = o.memory_budget;
  r.profile = o.profile;
  r.world = ctx.world;
  r.ranks_per_host = ctx.ranks_per_host;
  r.backend = ctx.backend;
  r.group = ctx.group;
  plan::ModulePlan m = plan::plan_module(r);
  return {std::move(m.plan), std::move(m.facts)};
}

void apply_candidate(TrainOptions& o, const plan::Candidate& c) {
  o.strategy = c.strategy;
  o.tp = c.tp;
  o.sequence_parallel = c.sequence_parallel;
  o.checkpoint_activations = c.checkpoint_activations;
  o.accumulation = c.accumulation;
  o.accumulation_given = true;
  o.bucket_bytes = c.bucket_bytes;
  o.shard_size = c.shard_size;
  o.mesh_order = c.mesh_order;
}

int run_plan(const TrainOptions& o, const PlanCommandOptions& p) {
  PlanContext ctx;
  const char* ws = std::getenv("WORLD_SIZE");
  const bool in_job = ws != nullptr && std::atoi(ws) > 1 && p.world == 0;
  if (in_job) {  // inside dtrain run: the live ranks (links measured on them when missing)
    ctx.group = comm::init();
    ctx.world = ctx.group->group_size();
    ctx.backend = ctx.group->name();
  } else {
    ctx.world = p.world > 0 ? p.world : 1;
    const char* b = std::getenv("DTRAIN_BACKEND");
    ctx.backend = !p.backend.empty() ? p.backend : b && *b ? b : "gloo";
  }
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  ctx.ranks_per_host = p.ranks_per_host > 0                      ? p.ranks_per_host
                       : in_job && local && std::atoi(local) > 0 ? std::atoi(local)
                                                                 : ctx.world;
  if (ctx.ranks_per_host > ctx.world || ctx.world % ctx.ranks_per_host != 0) {
    throw ValueError(
        str_cat("plan: --ranks-per-host ", ctx.ranks_per_host, " must divide --world ", ctx.world, "."));
  }
  const GptPlan g = plan_gpt(o, ctx);
  if (ctx.group && ctx.group->group_rank() != 0) return 0;
  if (p.json) {
    for (const auto& n : g.plan.notes) std::fprintf(stderr, "# %s\n", n.c_str());
    std::fflush(stderr);
    for (const auto& c : g.plan.candidates) {
      std::printf("%s\n", plan::candidate_json(c).c_str());
      std::fflush(stdout);  // (whole lines, never mixed with the notes on stderr)
    }
  } else {
    std::printf("dtrain plan: %s, batch %ld, %ld ranks (%ld per host)\n", g.facts.description.c_str(),
                static_cast<long>(o.batch), static_cast<long>(ctx.world),
                static_cast<long>(ctx.ranks_per_host));
    std::printf("%s", plan::plan_table(g.plan).c_str());
    const plan::Candidate& c = g.plan.candidates[g.plan.chosen];
    std::printf(
        "\nchosen: %s, predicted %.2f ms a step, %.1f MiB of tensors per rank\n  run it: dtrain train",
        c.name().c_str(), c.predicted_step_s * 1e3, c.predicted_peak_bytes / (1 << 20));
    for (const auto& f : c.flags) std::printf(" %s", f.c_str());
    std::printf("\n%s", plan::placements(c, g.facts, ctx.world).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace dtrain::train

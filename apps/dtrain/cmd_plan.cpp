// Command-line options of `dtrain plan`; see cmd_plan.h.
#include "apps/dtrain/cmd_plan.h"

namespace dtrain::apps {

CLI::App* add_plan_command(CLI::App& app, PlanCommand& cmd) {
  CLI::App* c = app.add_subcommand(
      "plan",
      "Plan the layout of a `dtrain train` run without training: every candidate layout with its predicted "
      "step time and peak memory per rank, the chosen one, and the flags that run each (docs/planning.md). "
      "Takes every option of `dtrain train`");
  add_train_options(c, cmd.train);
  c->add_option("--world", cmd.plan.world,
                "Ranks to plan for (default: this job's, inside dtrain run; else 1); with --profile FILE "
                "carrying a compute rate, a cluster that is not here")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--ranks-per-host", cmd.plan.ranks_per_host,
                "Ranks on each host (consecutive ranks share one; default: all on one host)")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--backend", cmd.plan.backend, "Whose links to plan with (default: the launcher's, or gloo)")
      ->check(CLI::IsMember({"gloo", "mpi", "nccl"}));
  c->add_flag("--json", cmd.plan.json, "One JSON object per candidate per line, instead of the table");
  return c;
}

}  // namespace dtrain::apps

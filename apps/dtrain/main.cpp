// The dtrain command-line tool: `dtrain run` (launcher), `dtrain bench comm` (collective benchmark),
// `dtrain explain` (DTensor redistribution plans), `dtrain train` (GPT on text), `dtrain plan` (its layout
// planned, nothing trained) and `dtrain ckpt` (inspect and export checkpoints). Argument parsing and exit
// codes only; the work is done by the libraries. Exit codes: 0 success, 1 failure at run time, 2 bad usage or
// input; `dtrain run` passes on its ranks' outcome (see launch/launcher.h).
#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/dtrain/bench_comm.h"
#include "apps/dtrain/cmd_bench.h"
#include "apps/dtrain/cmd_ckpt.h"
#include "apps/dtrain/cmd_explain.h"
#include "apps/dtrain/cmd_plan.h"
#include "apps/dtrain/cmd_run.h"
#include "apps/dtrain/cmd_train.h"
#include "core/error.h"
#include "core/log.h"
#include "launch/launcher.h"

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed training on libtorch"};
  app.require_subcommand(1);
  dtrain::launch::LaunchOptions run_opts;
  CLI::App* run = dtrain::apps::add_run_command(app, run_opts);
  dtrain::apps::BenchCommOptions bench_opts;
  CLI::App* bench_comm = dtrain::apps::add_bench_command(app, bench_opts);
  dtrain::apps::ExplainOptions explain_opts;
  CLI::App* explain = dtrain::apps::add_explain_command(app, explain_opts);
  dtrain::apps::TrainCommand train_cmd;
  CLI::App* train = dtrain::apps::add_train_command(app, train_cmd);
  dtrain::apps::PlanCommand plan_cmd;
  CLI::App* plan = dtrain::apps::add_plan_command(app, plan_cmd);
  dtrain::apps::CkptOptions ckpt_opts;
  CLI::App* ckpt = dtrain::apps::add_ckpt_command(app, ckpt_opts);
  // A first word that is no command: say so, instead of CLI11's "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known |= sub->get_name() == word;
    if (!known) {
      std::fprintf(
          stderr,
          "dtrain: error: '%s' is not a dtrain command. Use one of: run, train, plan, explain, bench, ckpt "
          "(`dtrain --help` lists them).\n",
          word.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
    if (run->parsed()) return dtrain::launch::run(run_opts);
    if (bench_comm->parsed()) return dtrain::apps::run_bench_comm(bench_opts);
    if (explain->parsed()) return dtrain::apps::run_explain(explain_opts);
    if (train->parsed()) return dtrain::train::train_gpt(dtrain::apps::train_options(train_cmd));
    if (plan->parsed()) {
      return dtrain::train::run_plan(dtrain::apps::train_options(plan_cmd.train), plan_cmd.plan);
    }
    if (ckpt->parsed()) return dtrain::apps::run_ckpt(*ckpt, ckpt_opts);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const dtrain::ValueError& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 2;
  } catch (const dtrain::NotSupportedError& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    // libtorch's message without its C++ backtrace, unless asked for (DTRAIN_LOG_LEVEL=debug)
    const bool debug = dtrain::log_level() == dtrain::LogLevel::kDebug;
    std::fprintf(stderr, "dtrain: error: %s\n", debug ? e.what() : e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

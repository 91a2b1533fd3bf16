// Command-line options of `dtrain run`; see cmd_run.h.
#include "apps/dtrain/cmd_run.h"

#include <chrono>
#include <cmath>

#include "core/env.h"

namespace dtrain::apps {

CLI::App* add_run_command(CLI::App& app, launch::LaunchOptions& opts) {
  CLI::App* sub =
      app.add_subcommand("run", "Run a program as ranks on this node (torchrun-style environment).");
  sub->add_option("-n,--nproc-per-node,--nproc", opts.nproc, "Ranks on this node")->capture_default_str();
  sub->add_option("--backend", opts.backend, "gloo: dtrain starts the ranks; mpi: mpirun does")
      ->check(CLI::IsMember({"gloo", "mpi"}))
      ->capture_default_str();
  sub->add_option("--nnodes", opts.nnodes, "Nodes in the job; start one `dtrain run` on each")
      ->capture_default_str();
  sub->add_option("--node-rank", opts.node_rank, "This node's index, 0 .. nnodes-1")->capture_default_str();
  sub->add_option("--master-addr", opts.master_addr, "Address of node 0 (rendezvous)")->capture_default_str();
  sub->add_option("--master-port", opts.master_port, "Port on node 0; 0 picks a free one (single node only)")
      ->capture_default_str();
  sub->add_option("--max-restarts", opts.max_restarts,
                  "Relaunch the group up to this many times after a failure")
      ->capture_default_str();
  sub->add_option_function<double>(
         "--stop-grace",
         [&opts](double s) { opts.stop_grace = checked_seconds("dtrain run: --stop-grace", s, true); },
         "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->default_str(std::to_string(std::chrono::duration<double>(opts.stop_grace).count()));
  // The command is everything from the first positional, or everything after `--`, left unparsed so that the
  // program's own flags (even `-n`) reach it. prefix_command() moves the first positional and all after it to
  // remaining(). For `--`, CLI11 2.1 needs a positional slot in the subcommand (else it hands the rest back
  // to the parent app, which rejects it): "PROGRAM" is that slot. Its validator rejects every value, so it
  // never fills and the program goes to remaining() in both forms; it also documents the command in --help.
  sub->prefix_command();
  sub->validate_positionals();
  sub->add_option("PROGRAM",
                  "The program to run and its arguments (put `--` before them if the program's name "
                  "starts with '-')")
      ->check(CLI::Validator([](std::string&) { return std::string("the command is taken verbatim"); }, ""));
  sub->callback([sub, &opts] {
    std::vector<std::string> rest = sub->remaining();
    if (!rest.empty() && rest.front() == "--") {
      rest.erase(rest.begin());
    } else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-') {
      throw CLI::ExtrasError("run: unknown option " + rest.front() +
                                 " (see dtrain run --help); to pass it to the " +
                                 "program, put it after the program's name",
                             CLI::ExitCodes::ExtrasError);
    }
    opts.command = std::move(rest);
  });
  return sub;
}

}  // namespace dtrain::apps

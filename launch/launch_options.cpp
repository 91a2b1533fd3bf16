// Validation of LaunchOptions; see launch_options.h.
#include "launch/launch_options.h"

#include "core/error.h"

namespace dtrain::launch {

void validate(const LaunchOptions& o) {
  if (o.nproc < 1) {
    throw ValueError(str_cat("dtrain run: --nproc-per-node ", o.nproc,
                             " is invalid; it must be at least 1. Use e.g. --nproc-per-node 2."));
  }
  if (o.backend != "gloo" && o.backend != "mpi") {
    throw ValueError(str_cat("dtrain run: --backend '", o.backend,
                             "' is unknown; it must be gloo or mpi. Use --backend gloo (or mpi)."));
  }
  if (o.nnodes < 1) {
    throw ValueError(str_cat("dtrain run: --nnodes ", o.nnodes,
                             " is invalid; it must be at least 1. Use --nnodes 1 ", "for a single machine."));
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw ValueError(str_cat("dtrain run: --node-rank ", o.node_rank, " is outside [0, ", o.nnodes,
                             ") for --nnodes ", o.nnodes,
                             ". Give each node a distinct --node-rank from 0 to ", o.nnodes - 1, "."));
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    throw ValueError(
        str_cat("dtrain run: --master-port ", o.master_port,
                " is not a TCP port; it must be in [1, 65535], or 0 to pick a free one on a single node."));
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    throw ValueError(
        str_cat("dtrain run: --nnodes ", o.nnodes, " needs --master-port (it is 0, which picks a ",
                "free port on one node only). Pass the same --master-port and --master-addr on every node."));
  }
  if (o.master_addr.empty()) {
    throw ValueError(
        "dtrain run: --master-addr is empty. Give the address of node 0, e.g. --master-addr 127.0.0.1 on one "
        "machine.");
  }
  if (o.max_restarts < 0) {
    throw ValueError(str_cat("dtrain run: --max-restarts ", o.max_restarts,
                             " is negative; it must be 0 or more. Use --max-restarts 0 to never restart."));
  }
  if (o.stop_grace.count() < 0) {
    throw ValueError(str_cat("dtrain run: stop grace ", o.stop_grace.count(),
                             " ms is negative; it must be 0 or more. Use e.g. --stop-grace 5."));
  }
  if (o.command.empty() || o.command.front().empty()) {
    throw ValueError(
        "dtrain run: no program to run (the command is empty). Put it after the options, e.g. "
        "`dtrain run -n 2 -- ./train --steps 10`.");
  }
  if (o.backend == "mpi" && o.nnodes > 1) {
    throw NotSupportedError(
        str_cat("dtrain run: --backend mpi with --nnodes ", o.nnodes,
                " is not supported; start multi-host MPI jobs with mpirun/srun directly; dtrain ",
                "picks up OMPI_COMM_WORLD_*/SLURM_*."));
  }
}

}  // namespace dtrain::launch

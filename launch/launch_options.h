// What `dtrain run` is asked to start: ranks per node, backend, the node's place among the nodes, the
// rendezvous address, restarts, and the program to run. validate() checks it once at the public boundary.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace dtrain::launch {

struct LaunchOptions {
  int nproc = 1;                 // ranks on this node (LOCAL_WORLD_SIZE)
  std::string backend = "gloo";  // "gloo": dtrain spawns the ranks; "mpi": mpirun does
  int nnodes = 1;                // nodes in the job; every node runs one launcher
  int node_rank = 0;             // this node's index in [0, nnodes) (GROUP_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;   // 0: pick a free port (single node only)
  int max_restarts = 0;  // relaunch the whole group up to this many times after a failure
  std::chrono::milliseconds stop_grace{5000};  // SIGTERM -> SIGKILL delay when stopping ranks
  std::vector<std::string> command;            // program and its arguments; the program is looked up on PATH
};

// Throws ValueError for a bad value (naming the value, the constraint and the fix) and NotSupportedError for
// backend "mpi" with nnodes > 1.
void validate(const LaunchOptions& opts);

}  // namespace dtrain::launch

// The rank environment and the mpirun command line; see rank_env.h.
#include "launch/rank_env.h"

#include <sched.h>

#include <algorithm>

namespace dtrain::launch {

int threads_per_rank(int cores, int ranks) { return std::max(1, cores / std::max(1, ranks)); }

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

// The count for the thread variables the user left unset: the first one the user set, so that OpenMP and the
// BLAS agree (DESIGN §8; MKL's own count decides a matrix product's rounding, which the deterministic mode
// needs the same at every world size), else cores / ranks.
std::string thread_default(const EnvMap& parent_env, int cores, int ranks) {
  for (const char* name : kThreadVars) {
    auto it = parent_env.find(name);
    if (it != parent_env.end()) return it->second;
  }
  return std::to_string(threads_per_rank(cores, ranks));
}

EnvList rank_env(const LaunchOptions& o, int local_rank, int restart_count, int master_port, int cores,
                 const EnvMap& parent_env) {
  EnvList env = {
      {"RANK", std::to_string(o.node_rank * o.nproc + local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"DTRAIN_BACKEND", o.backend},
      {"DTRAIN_RESTART_COUNT", std::to_string(restart_count)},
  };
  const std::string threads = thread_default(parent_env, cores, o.nproc);
  for (const char* name : kThreadVars) {
    if (!parent_env.count(name)) env.emplace_back(name, threads);
  }
  if (!parent_env.count("OMP_WAIT_POLICY")) env.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
  return env;
}

std::vector<std::string> mpirun_command(const LaunchOptions& o, int cores, bool as_root,
                                        const EnvMap& parent_env) {
  const int n = o.nproc * o.nnodes;
  std::vector<std::string> cmd = {"mpirun", "-n", std::to_string(n)};
  if (as_root) cmd.push_back("--allow-run-as-root");
  for (const char* a : {"--oversubscribe", "--bind-to", "none", "--tag-output"}) cmd.push_back(a);
  // More ranks than cores: busy-polling ranks would starve each other.
  if (n > cores) {
    for (const char* a : {"--mca", "mpi_yield_when_idle", "1"}) cmd.push_back(a);
  }
  auto export_var = [&](const std::string& name, const std::string& value) {
    cmd.push_back("-x");
    cmd.push_back(parent_env.count(name) ? name : name + "=" + value);
  };
  cmd.push_back("-x");
  cmd.push_back("DTRAIN_BACKEND=mpi");
  cmd.push_back("-x");
  cmd.push_back("DTRAIN_RESTART_COUNT");
  cmd.push_back("-x");
  cmd.push_back("DTRAIN_LAUNCHER_PID");
  cmd.push_back("-x");
  cmd.push_back("DTRAIN_PROGRESS");
  const std::string threads = thread_default(parent_env, cores, n);
  for (const char* name : kThreadVars) export_var(name, threads);
  export_var("OMP_WAIT_POLICY", "PASSIVE");
  cmd.insert(cmd.end(), o.command.begin(), o.command.end());
  return cmd;
}

}  // namespace dtrain::launch

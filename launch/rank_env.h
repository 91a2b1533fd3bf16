// The contract between the launcher and each rank, as pure functions: the torchrun environment plus thread
// settings for `--backend gloo`, and the mpirun command line for `--backend mpi`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "launch/launch_options.h"

namespace dtrain::launch {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// The variables that cap the threads of OpenMP/BLAS; set per rank unless the user set them (DESIGN §8).
inline constexpr const char* kThreadVars[] = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"};

// Threads each rank should use when `ranks` ranks share `cores` cores: max(1, cores / ranks).
int threads_per_rank(int cores, int ranks);

// CPUs this process may run on (its affinity mask), at least 1.
int available_cores();

// Environment added to the launcher's own for one rank: RANK = node_rank * nproc + local_rank, WORLD_SIZE =
// nnodes * nproc, LOCAL_RANK, LOCAL_WORLD_SIZE = nproc, GROUP_RANK = node_rank, MASTER_ADDR, MASTER_PORT (the
// given port, which may differ from opts.master_port when the launcher picked one), DTRAIN_BACKEND,
// DTRAIN_RESTART_COUNT, and OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS and
// OMP_WAIT_POLICY=PASSIVE, each of these four only when `parent_env` (the launcher's environment) does not
// set it. A thread variable left unset takes the value of the first one the user set (OpenMP and the BLAS
// agree), else threads_per_rank(cores, nproc). The launcher adds DTRAIN_LAUNCHER_PID (ranks that call
// dtrain::init() exit when that process does) and DTRAIN_JOB_SECRET (comm/detail/job_store.h) itself.
EnvList rank_env(const LaunchOptions& opts, int local_rank, int restart_count, int master_port, int cores,
                 const EnvMap& parent_env = {});

// The mpirun command line for `--backend mpi` (single node): mpirun -n N [--allow-run-as-root]
// --oversubscribe
// --bind-to none --tag-output [--mca mpi_yield_when_idle 1 when N > cores] -x DTRAIN_BACKEND=mpi
// -x DTRAIN_RESTART_COUNT -x DTRAIN_LAUNCHER_PID -x <thread variables> PROGRAM ARGS. DTRAIN_RESTART_COUNT and
// DTRAIN_LAUNCHER_PID are exported by name: the launcher sets them in mpirun's environment. Thread variables
// that `parent_env` already sets are exported by name (the user's value wins), the others with the value
// threads_per_rank(cores, N).
std::vector<std::string> mpirun_command(const LaunchOptions& opts, int cores, bool as_root,
                                        const EnvMap& parent_env = {});

}  // namespace dtrain::launch

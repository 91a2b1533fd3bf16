// Creating backends: create_backend(name, ...) builds the world group of one engine; init() reads the
// launcher's environment (dtrain run, torchrun, mpirun, srun) and picks the backend. The only place that
// includes backend folders.
#pragma once

#include <string>

#include "comm/backend.h"
#include "core/env.h"

namespace dtrain::comm {

// Names accepted by create_backend: "gloo", "mpi" (and "nccl", which this CPU build rejects with a message).
std::vector<std::string> backend_names();

// Builds the world group of backend `name` for the process described by `info`. Collective over all ranks.
BackendPtr create_backend(const std::string& name, const RankInfo& info, std::chrono::milliseconds timeout);

// Which backend init() would choose: `requested` if not empty, else DTRAIN_BACKEND, else "mpi" when mpirun or
// srun started the process without a MASTER_ADDR, else "gloo".
std::string choose_backend(const std::string& requested, const RankInfo& info, const EnvMap& env);

struct InitOptions {
  std::string backend;  // empty: choose_backend()
  Timeout timeout;      // unset: DTRAIN_TIMEOUT, else 300 s
};

// Reads the environment, sets the log prefix "[rank r/N]", and returns the world group.
BackendPtr init(const InitOptions& opts = {});

}  // namespace dtrain::comm

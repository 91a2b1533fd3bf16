// Backend creation and init(); see factory.h.
#include "comm/factory.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/gloo/gloo_backend.h"
#include "comm/mpi/mpi_backend.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

std::vector<std::string> backend_names() { return {"gloo", "mpi", "nccl"}; }

namespace {

BackendPtr create_gloo(const RankInfo& info, std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Store> store;
  if (info.world_size == 1 && info.master_addr.empty()) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    if (info.master_addr.empty() || info.master_port == 0) {
      throw ValueError(str_cat("gloo backend: rank ", info.rank, " of ", info.world_size,
                               " needs MASTER_ADDR and MASTER_PORT (got '", info.master_addr, "' and ",
                               info.master_port,
                               ") to find rank 0. Start the ranks with `dtrain run`, torchrun, or ",
                               "set both; under mpirun, use --backend mpi."));
    }
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(info.master_port);
    so.isServer = info.rank == 0;
    so.numWorkers = info.world_size;
    so.waitWorkers = false;
    so.timeout = timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
    } catch (const std::exception& e) {
      throw CommError(str_cat(rank_prefix(), " gloo: cannot reach the store at ", info.master_addr, ":",
                              info.master_port, ": ", e.what(),
                              " Check MASTER_ADDR/MASTER_PORT and that rank 0 is running."));
    }
  }
  std::vector<int> global(info.world_size);
  for (int r = 0; r < info.world_size; ++r) global[r] = r;
  return GlooBackend::create(store, "world", global, info.rank, timeout);
}

}  // namespace

BackendPtr create_backend(const std::string& name, const RankInfo& info, std::chrono::milliseconds timeout) {
  if (name == "gloo") return create_gloo(info, timeout);
  if (name == "mpi") return MpiBackend::create_world(timeout, info.master_addr);
  if (name == "nccl") {
    throw NotSupportedError(
        "backend nccl: this build of dtrain has no NCCL (it was built against a CPU libtorch). Use --backend "
        "gloo or "
        "--backend mpi, or rebuild against a CUDA libtorch.");
  }
  throw ValueError(str_cat("backend '", name, "' is unknown. Use one of: gloo, mpi, nccl."));
}

std::string choose_backend(const std::string& requested, const RankInfo& info, const EnvMap& env) {
  if (!requested.empty()) return requested;
  if (auto b = env_get(env, "DTRAIN_BACKEND"); b && !b->empty()) return *b;
  if ((info.launcher == Launcher::kMpirun || info.launcher == Launcher::kSlurm) && info.master_addr.empty()) {
    return "mpi";
  }
  return "gloo";
}

BackendPtr init(const InitOptions& opts) {
  EnvMap env = current_env();
  RankInfo info = parse_rank_env(env);
  set_log_rank(info.rank, info.world_size);
  set_log_level(log_level_from_env(env));
  std::string name = choose_backend(opts.backend, info, env);
  auto timeout = opts.timeout.value_or(default_timeout(env));
  BackendPtr world = create_backend(name, info, timeout);
  if (world->global_rank() != info.rank || world->group_size() != info.world_size) {
    throw ValueError(
        str_cat("init: the ", name, " backend sees rank ", world->global_rank(), " of ", world->group_size(),
                " but the environment (", to_string(info.launcher), ") says rank ", info.rank, " of ",
                info.world_size,
                ". Start the program with one launcher only (dtrain run, torchrun, mpirun or srun)."));
  }
  return world;
}

}  // namespace dtrain::comm

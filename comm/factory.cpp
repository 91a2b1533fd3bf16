// Backend creation and init(); see factory.h.
#include "comm/factory.h"

#include <c10/util/Logging.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "comm/detail/job_store.h"
#include "comm/gloo/gloo_backend.h"
#include "comm/mpi/mpi_backend.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/host_memory.h"
#include "core/log.h"

namespace dtrain::comm {

std::vector<std::string> backend_names() { return {"gloo", "mpi", "nccl"}; }

namespace {

BackendPtr create_gloo(const RankInfo& info, std::chrono::milliseconds timeout, const EnvMap& env) {
  c10::intrusive_ptr<BoundedStore> store;
  if (info.world_size == 1 && info.master_addr.empty()) {
    store = c10::make_intrusive<BoundedStore>(c10::make_intrusive<c10d::HashStore>(), "the in-process store",
                                              timeout);
  } else {
    if (info.master_addr.empty() || info.master_port == 0) {
      throw ValueError(str_cat("gloo backend: rank ", info.rank, " of ", info.world_size,
                               " needs MASTER_ADDR and MASTER_PORT (got '", info.master_addr, "' and ",
                               info.master_port,
                               ") to find rank 0. Start the ranks with `dtrain run`, torchrun, or ",
                               "set both; under mpirun, use --backend mpi."));
    }
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    if (std::string problem = loopback_advertise_problem(env, host); !problem.empty())
      throw ValueError(problem);
    JobStoreOptions so;
    so.host = info.master_addr;
    so.port = info.master_port;
    so.rank = info.rank;
    so.world_size = info.world_size;
    // Loopback only when the ranks reach rank 0 through it: a single-host job may name a routable
    // MASTER_ADDR.
    so.loopback_only = is_loopback_host(info.master_addr);
    so.secret = job_secret_from_env(env);
    so.timeout = timeout;
    store = open_job_store(so).store;
    fault_point("start", 0);
  }
  std::vector<int> global(info.world_size);
  for (int r = 0; r < info.world_size; ++r) global[r] = r;
  return GlooBackend::create(store, "world", global, info.rank, timeout);
}

// libtorch's own log lines (c10d's store and socket warnings) print the C++ backtrace of the exception they
// report, tens of frames for one condition that dtrain's own error names anyway. Below DTRAIN_LOG_LEVEL=debug
// they are silenced (errors only), unless the user set TORCH_CPP_LOG_LEVEL.
void quiet_libtorch_logs(const EnvMap& env) {
  if (log_level() == LogLevel::kDebug || env_get(env, "TORCH_CPP_LOG_LEVEL")) return;
  ::setenv("TORCH_CPP_LOG_LEVEL", "ERROR", 0);  // read by c10d's logger on its first use
  FLAGS_caffe2_log_level = 2;                   // c10's LOG(WARNING) and below
}

// Under `dtrain run` (DTRAIN_LAUNCHER_PID): a thread that ends this process when the launcher dies, also
// where the launcher is not the parent (mpirun in between, a shell wrapper), so that no rank outlives its
// job.
void die_with_launcher(const EnvMap& env) {
  static bool started = false;
  auto pid = env_get(env, "DTRAIN_LAUNCHER_PID");
  if (started || !pid || pid->empty()) return;
  int launcher = std::atoi(pid->c_str());
  if (launcher <= 1) return;
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, launcher, 0));
  if (fd < 0) {
    if (errno == ESRCH) ::kill(::getpid(), SIGKILL);  // already gone
    return;  // no pidfds: the parent-death signal the launcher set still covers its direct children
  }
  started = true;
  std::thread([fd] {
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    ::kill(::getpid(), SIGKILL);
  }).detach();
}

}  // namespace

BackendPtr create_backend(const std::string& name, const RankInfo& info, std::chrono::milliseconds timeout) {
  if (name == "gloo") return create_gloo(info, timeout, current_env());
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
  die_with_launcher(env);
  quiet_libtorch_logs(env);
  keep_freed_heap(env);
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

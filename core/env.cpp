// Environment parsing; see env.h.
#include "core/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

extern char** environ;

namespace dtrain {

EnvMap current_env() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::vector<std::string> env_strings(const EnvMap& env) {
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::optional<std::string> env_get(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

int64_t env_int(const EnvMap& env, const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  auto v = env_get(env, name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0) {
    throw ValueError(str_cat("environment: ", name, "='", *v,
                             "' is not an integer. Set it to a whole number, e.g. ", name, "=",
                             std::max<int64_t>(min, 0), "."));
  }
  if (x < min || x > max) {
    throw ValueError(str_cat("environment: ", name, "=", x, " is out of range [", min, ", ", max, "]. Set ",
                             name, " to a value in that range."));
  }
  return x;
}

bool env_bool(const EnvMap& env, const std::string& name, bool fallback) {
  auto v = env_get(env, name);
  if (!v) return fallback;
  std::string x = *v;
  std::transform(x.begin(), x.end(), x.begin(), [](unsigned char c) { return std::tolower(c); });
  if (x == "1" || x == "true" || x == "yes" || x == "on") return true;
  if (x == "0" || x == "false" || x == "no" || x == "off" || x.empty()) return false;
  throw ValueError(str_cat("environment: ", name, "='", *v, "' is not a yes/no value. Set ", name,
                           "=1 (or true, yes, on) or ", name, "=0 (or false, no, off)."));
}

std::string env_choice(const EnvMap& env, const std::string& name, const std::string& fallback,
                       const std::vector<std::string>& allowed) {
  auto v = env_get(env, name);
  if (!v) return fallback;
  if (std::find(allowed.begin(), allowed.end(), *v) != allowed.end()) return *v;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) list += str_cat(i ? ", " : "", allowed[i]);
  throw ValueError(
      str_cat("environment: ", name, "='", *v, "' is not one of ", list, ". Set ", name, " to one of them."));
}

std::chrono::milliseconds checked_seconds(const std::string& what, double s, bool allow_zero) {
  if (!std::isfinite(s) || s < 0 || (s == 0 && !allow_zero)) {
    throw ValueError(str_cat(what, " = ", s, " s is not a ", allow_zero ? "non-negative" : "positive",
                             " number of seconds. Use e.g. 30 or 2.5."));
  }
  if (s > kMaxSeconds) {
    throw ValueError(str_cat(what, " = ", s, " s is more than a week (", kMaxSeconds,
                             " s), the longest dtrain accepts. Use a shorter time."));
  }
  const int64_t ms = std::llround(s * 1000.0);
  if (ms == 0 && s > 0) {
    throw ValueError(str_cat(what, " = ", s,
                             " s rounds to 0 ms; dtrain counts whole milliseconds. Use at least ", "0.001."));
  }
  return std::chrono::milliseconds(ms);
}

std::chrono::milliseconds env_seconds(const EnvMap& env, const std::string& name,
                                      std::chrono::milliseconds fallback) {
  auto v = env_get(env, name);
  if (!v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0') {
    throw ValueError(str_cat("environment: ", name, "='", *v,
                             "' is not a positive number of seconds. Use e.g. ", name, "=30 or ", name,
                             "=2.5."));
  }
  return checked_seconds(str_cat("environment: ", name), s);
}

const char* to_string(Launcher l) {
  switch (l) {
    case Launcher::kNone:
      return "none";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kMpirun:
      return "mpirun";
    case Launcher::kSlurm:
      return "slurm";
  }
  return "?";
}

namespace {

// Fills rank/world/local fields from four variable names and checks they agree.
void read_ranks(const EnvMap& env, RankInfo& info, const char* rank, const char* world,
                const char* local_rank, const char* local_world) {
  if (!env_get(env, world)) {
    throw ValueError(str_cat("environment: ", rank, " is set but ", world,
                             " is not. Set both, or neither for a ", "single process."));
  }
  info.world_size = static_cast<int>(env_int(env, world, 1, 1, 1 << 24));
  info.rank = static_cast<int>(env_int(env, rank, 0, 0, info.world_size - 1));
  info.local_world_size = static_cast<int>(env_int(env, local_world, info.world_size, 1, info.world_size));
  info.local_rank = static_cast<int>(env_int(env, local_rank, info.rank, 0, info.local_world_size - 1));
}

}  // namespace

RankInfo parse_rank_env(const EnvMap& env) {
  RankInfo info;
  if (env_get(env, "RANK")) {
    info.launcher = Launcher::kTorchrun;
    read_ranks(env, info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  } else if (env_get(env, "OMPI_COMM_WORLD_RANK")) {
    info.launcher = Launcher::kMpirun;
    read_ranks(env, info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if (env_get(env, "SLURM_PROCID") && env_get(env, "SLURM_NTASKS")) {
    info.launcher = Launcher::kSlurm;
    // Slurm gives no per-node task count in one number (SLURM_TASKS_PER_NODE may read "2(x3)");
    // SLURM_NTASKS_PER_NODE is set when the job asked for a fixed count, and that is what LOCAL_WORLD_SIZE
    // means.
    read_ranks(env, info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  }
  if (auto a = env_get(env, "MASTER_ADDR")) info.master_addr = *a;
  info.master_port = static_cast<int>(env_int(env, "MASTER_PORT", 0, 0, 65535));
  if (info.launcher == Launcher::kTorchrun && info.world_size > 1 && info.master_addr.empty()) {
    throw ValueError(
        str_cat("environment: RANK=", info.rank, " WORLD_SIZE=", info.world_size,
                " but MASTER_ADDR is not set. Start the ranks with `dtrain run` or torchrun, or set ",
                "MASTER_ADDR and MASTER_PORT."));
  }
  return info;
}

std::chrono::milliseconds default_timeout(const EnvMap& env) {
  return env_seconds(env, "DTRAIN_TIMEOUT", std::chrono::seconds(300));
}

}  // namespace dtrain

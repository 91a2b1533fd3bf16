// Reading the process environment: typed variables with clear errors, and the rank contract of the launchers
// dtrain recognises (dtrain run / torchrun, mpirun, srun).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

using EnvMap = std::map<std::string, std::string>;

// The current process environment as a map.
EnvMap current_env();

std::optional<std::string> env_get(const EnvMap& env, const std::string& name);

// "NAME=value" for each variable of `env`, for an exec'd program's environment.
std::vector<std::string> env_strings(const EnvMap& env);

// A NULL-terminated array of C strings (argv, envp for exec) that owns its strings.
class CStringArray {
 public:
  explicit CStringArray(std::vector<std::string> strings) : strings_(std::move(strings)) {
    for (auto& s : strings_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
  }
  CStringArray(const CStringArray&) = delete;
  CStringArray& operator=(const CStringArray&) = delete;
  char** data() { return ptrs_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> ptrs_;
};

// An integer variable; ValueError naming the variable and value if it is not an integer in [min, max].
int64_t env_int(const EnvMap& env, const std::string& name, int64_t fallback, int64_t min = INT64_MIN,
                int64_t max = INT64_MAX);

// A yes/no variable: 1, true, yes, on / 0, false, no, off (any case); ValueError naming the variable and
// value otherwise.
bool env_bool(const EnvMap& env, const std::string& name, bool fallback);

// One of `allowed` (exact); ValueError listing them otherwise.
std::string env_choice(const EnvMap& env, const std::string& name, const std::string& fallback,
                       const std::vector<std::string>& allowed);

// The longest duration dtrain accepts for a timeout or grace period (a week): beyond it, deadlines overflow.
constexpr double kMaxSeconds = 7 * 24 * 3600.0;

// `seconds` as milliseconds; ValueError naming `what` when it is not finite, negative (or zero unless
// `allow_zero`), rounds to 0 ms, or exceeds kMaxSeconds.
std::chrono::milliseconds checked_seconds(const std::string& what, double seconds, bool allow_zero = false);

// Seconds as a decimal number ("30", "2.5"); ValueError if not a positive number of at least a millisecond
// and at most kMaxSeconds.
std::chrono::milliseconds env_seconds(const EnvMap& env, const std::string& name,
                                      std::chrono::milliseconds fallback);

// Which launcher started this process.
enum class Launcher { kNone, kTorchrun, kMpirun, kSlurm };
const char* to_string(Launcher l);

// Where this process stands among the ranks of a job.
struct RankInfo {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // empty when the launcher gives none (mpirun without dtrain run)
  int master_port = 0;
};

// Reads the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
// first, then OpenMPI (OMPI_COMM_WORLD_*), then Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...); none
// of them: a single process. Inconsistent values (rank outside the world, a missing partner variable) are
// ValueErrors naming the variables.
RankInfo parse_rank_env(const EnvMap& env);

// Default timeout for blocking calls: DTRAIN_TIMEOUT in seconds, else 300 s.
std::chrono::milliseconds default_timeout(const EnvMap& env);

}  // namespace dtrain

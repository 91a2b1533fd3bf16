// Rank-prefixed logging; see log.h.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace dtrain {
namespace {

std::mutex g_mu;
std::string g_prefix;  // guarded by g_mu

LogLevel initial_level() {
  try {
    return log_level_from_env(current_env());
  } catch (const ValueError&) {
    return LogLevel::kInfo;  // init() reports it
  }
}

std::atomic<int> g_level{static_cast<int>(initial_level())};
std::atomic<int> g_rank{-1};

}  // namespace

void set_log_rank(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_prefix = str_cat("[rank ", rank, "/", world_size, "]");
  g_rank = rank;
}

int log_rank() { return g_rank; }

std::string rank_prefix() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_prefix;
}

LogLevel log_level_from_env(const EnvMap& env) {
  const std::string v = env_choice(env, "DTRAIN_LOG_LEVEL", "info", {"debug", "info", "warn", "error"});
  return v == "debug"   ? LogLevel::kDebug
         : v == "warn"  ? LogLevel::kWarn
         : v == "error" ? LogLevel::kError
                        : LogLevel::kInfo;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_line(LogLevel level, const std::string& msg) {
  if (static_cast<int>(level) < g_level.load()) return;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "%s%sdtrain %s: %s\n", g_prefix.c_str(), g_prefix.empty() ? "" : " ",
               kNames[static_cast<int>(level)], msg.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain

// Rank-prefixed logging; see log.h.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dtrain {
namespace {

std::mutex g_mu;
std::string g_prefix;  // guarded by g_mu

LogLevel initial_level() {
  const char* v = std::getenv("DTRAIN_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int> g_level{static_cast<int>(initial_level())};

}  // namespace

void set_log_rank(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_prefix = str_cat("[rank ", rank, "/", world_size, "]");
}

std::string rank_prefix() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_prefix;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

void log_line(LogLevel level, const std::string& msg) {
  if (static_cast<int>(level) < g_level.load()) return;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "%s%sdtrain %s: %s\n", g_prefix.c_str(), g_prefix.empty() ? "" : " ",
               kNames[static_cast<int>(level)], msg.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain

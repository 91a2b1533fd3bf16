// Rank-prefixed logging to stderr: "[rank r/N] message". Thread-safe (one line is written at a time).
#pragma once

#include <string>

#include "core/env.h"
#include "core/error.h"

namespace dtrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Sets the prefix used by every later line; called by init() once the rank is known.
void set_log_rank(int rank, int world_size);
// "[rank r/N]" (or "" before set_log_rank): the prefix that comm and mesh errors start with.
std::string rank_prefix();
// The rank set_log_rank was given (-1 before).
int log_rank();
// Minimum level printed; DTRAIN_LOG_LEVEL=debug|info|warn|error sets it at start-up (init() rejects any
// other value with a ValueError; before init() a bad value leaves info).
void set_log_level(LogLevel level);
LogLevel log_level();
// DTRAIN_LOG_LEVEL's level (info when unset); ValueError naming the value otherwise.
LogLevel log_level_from_env(const EnvMap& env);
void log_line(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(const Args&... args) {
  log_line(LogLevel::kInfo, str_cat(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  log_line(LogLevel::kWarn, str_cat(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  log_line(LogLevel::kDebug, str_cat(args...));
}

}  // namespace dtrain

// DTensor settings; see settings.h.
#include "tensor/settings.h"

#include <atomic>
#include <mutex>
#include <optional>

#include "core/env.h"

namespace dtrain::tensor {

namespace {

std::mutex g_mu;
std::optional<DTensorSettings> g_settings;  // guarded by g_mu
std::atomic<int> g_flags{-1};               // bit 0 strict, bit 1 check; -1 until the settings are read

std::atomic<int64_t> g_cache_bytes{0};
std::atomic<uint64_t> g_generation{0};

void publish(const DTensorSettings& s) {
  g_cache_bytes = s.cache_bytes;
  g_flags = (s.strict ? 1 : 0) | (s.check ? 2 : 0);
  ++g_generation;
}

int flags() {
  int f = g_flags.load(std::memory_order_relaxed);
  if (f < 0) {
    settings();
    f = g_flags.load();
  }
  return f;
}

DTensorSettings from_env() {
  const EnvMap env = current_env();
  DTensorSettings s;
  s.strict = env_bool(env, "DTRAIN_DTENSOR_STRICT", false);
  s.check = env_bool(env, "DTRAIN_DTENSOR_CHECK", false);
  s.comm_profile = env_get(env, "DTRAIN_COMM_PROFILE").value_or("");
  s.cache_bytes = env_int(env, "DTRAIN_DTENSOR_CACHE_MB", s.cache_bytes >> 20, 0, int64_t{1} << 30) << 20;
  return s;
}

}  // namespace

DTensorSettings settings() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_settings) {
    g_settings = from_env();
    publish(*g_settings);
  }
  return *g_settings;
}

void set_settings(const DTensorSettings& s) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_settings = s;
  publish(s);
}

bool strict_mode() { return (flags() & 1) != 0; }
bool check_mode() { return (flags() & 2) != 0; }
int64_t cache_bytes() {
  flags();  // read the settings once
  return g_cache_bytes.load(std::memory_order_relaxed);
}
uint64_t settings_generation() {
  flags();
  return g_generation.load();
}

}  // namespace dtrain::tensor

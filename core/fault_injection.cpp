// The fault-injection seam; see fault_injection.h.
#include "core/fault_injection.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace dtrain {

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// What the tests switched on, read once.
struct Injection {
  std::string freeze = env_or_empty("DTRAIN_TEST_FREEZE");
  std::string kill_at_step = env_or_empty("DTRAIN_TEST_KILL_AT_STEP");
  std::string kill_during_save = env_or_empty("DTRAIN_TEST_KILL_DURING_SAVE");
  bool first_attempt = std::atoi(env_or_empty("DTRAIN_RESTART_COUNT").c_str()) == 0;
  bool any() const { return !freeze.empty() || !kill_at_step.empty() || !kill_during_save.empty(); }
};

const Injection& injection() {
  static const Injection i;
  return i;
}

}  // namespace

void fault_point(const char* point, int64_t n) {
  const Injection& i = injection();
  if (!i.any()) return;
  const std::string p = point;
  if (!i.freeze.empty() && i.freeze == str_cat(log_rank(), ":", p, ":", n)) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
    std::fprintf(stderr, "dtrain test: rank %d freezes at %s %lld (monotonic ms %lld)\n", log_rank(), point,
                 static_cast<long long>(n), static_cast<long long>(ms));
    std::fflush(stderr);
    ::raise(SIGSTOP);
  }
  if (p == "step" && i.first_attempt && i.kill_at_step == str_cat(log_rank(), ":", n)) ::raise(SIGKILL);
  if (p.rfind("save_", 0) == 0 && i.kill_during_save == str_cat(log_rank(), ":", p.substr(5), ":", n)) {
    ::raise(SIGKILL);
  }
}

}  // namespace dtrain

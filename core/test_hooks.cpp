// Test-only fault points; see test_hooks.h.
#include "core/test_hooks.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace dtrain {

void test_freeze_point(const char* point, int64_t n) {
  static const char* spec = std::getenv("DTRAIN_TEST_FREEZE");
  if (spec == nullptr || std::string(spec) != str_cat(log_rank(), ":", point, ":", n)) return;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  std::fprintf(stderr, "dtrain test: rank %d freezes at %s %lld (monotonic ms %lld)\n", log_rank(), point,
               static_cast<long long>(n), static_cast<long long>(ms));
  std::fflush(stderr);
  ::raise(SIGSTOP);
}

}  // namespace dtrain

// Memory figures from /proc; see host_memory.h.
#include "core/host_memory.h"

#include <malloc.h>

#include <atomic>

#include <cstdlib>
#include <fstream>

#include "core/error.h"

namespace dtrain {

namespace {

std::atomic<bool> heap_kept{false};

// The number after "field:" in a /proc file of "field: number unit" lines; 0 when absent.
double proc_field(const char* path, const std::string& field) {
  std::ifstream in(path);
  const std::string prefix = field + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return std::atof(line.c_str() + prefix.size());
  }
  return 0;
}

}  // namespace

double process_memory_mib(const std::string& field) {
  return proc_field("/proc/self/status", field) / 1024.0;
}

double host_available_bytes() { return proc_field("/proc/meminfo", "MemAvailable") * 1024.0; }

bool keep_freed_heap(const EnvMap& env) {
  const auto choice = env_get(env, "DTRAIN_MALLOC").value_or("keep");
  if (choice != "keep" && choice != "system") {
    throw ValueError(
        str_cat("DTRAIN_MALLOC='", choice,
                "' is not a setting: use 'keep' (the default: freed memory stays in the heap for "
                "the next step) or 'system' (glibc's own thresholds)."));
  }
  if (choice == "system" || env.count("MALLOC_MMAP_THRESHOLD_") || env.count("MALLOC_TRIM_THRESHOLD_"))
    return false;
  // (32 MiB is the largest mmap threshold glibc accepts on 64-bit; fixing it also stops its dynamic growth)
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 &&
                  mallopt(M_TOP_PAD, 64 << 20) == 1;
  heap_kept = heap_kept || ok;
  return ok;
}

bool freed_heap_kept() { return heap_kept; }

}  // namespace dtrain

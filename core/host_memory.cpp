// Memory figures from /proc; see host_memory.h.
#include "core/host_memory.h"

#include <cstdlib>
#include <fstream>

namespace dtrain {

namespace {

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

}  // namespace dtrain

// Memory figures of this process and this host, from /proc.
#pragma once

#include <string>

namespace dtrain {

// A memory figure of this process from /proc/self/status ("VmRSS": resident now, "VmHWM": its peak), in MiB;
// 0 where /proc does not say.
double process_memory_mib(const std::string& field);

// The host's MemAvailable from /proc/meminfo, in bytes; 0 where /proc does not say.
double host_available_bytes();

}  // namespace dtrain

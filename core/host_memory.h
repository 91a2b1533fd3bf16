// Memory figures of this process and this host, from /proc.
#pragma once

#include <string>

#include "core/env.h"

namespace dtrain {

// A memory figure of this process from /proc/self/status ("VmRSS": resident now, "VmHWM": its peak), in MiB;
// 0 where /proc does not say.
double process_memory_mib(const std::string& field);

// The host's MemAvailable from /proc/meminfo, in bytes; 0 where /proc does not say.
double host_available_bytes();

// Keeps the memory a training step frees in this process's heap for the next step, instead of returning it
// to the system and faulting it in again (glibc's malloc; libtorch's CPU allocator has no cache of its
// own). Blocks up to 32 MiB come from the heap (glibc's threshold otherwise moves with the sizes freed, so
// two runs of the same job could differ in their page faults by 2x), and up to 1 GiB of freed heap is kept.
// The resident set stays near the step's peak; the tensor accounting (tensor_peak_mib) is unchanged. Left
// as glibc has it when DTRAIN_MALLOC=system or the user set MALLOC_MMAP_THRESHOLD_ or
// MALLOC_TRIM_THRESHOLD_; any other DTRAIN_MALLOC is an error. Returns whether it changed anything.
// dtrain::init() calls it.
bool keep_freed_heap(const EnvMap& env);

// Whether keep_freed_heap() changed this process's heap (timings measured under one setting are not the
// other's: the compute profile's signature says which).
bool freed_heap_kept();

}  // namespace dtrain

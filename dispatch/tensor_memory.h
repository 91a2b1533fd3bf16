// The bytes held by CPU tensors in this process, and their peak: a counting allocator installed in front of
// libtorch's CPU allocator (it allocates as libtorch's default does, with c10::alloc_cpu), the CPU's
// counterpart of torch.cuda.memory_allocated and max_memory_allocated. It lives here, beside the dispatch
// keys, because it too hooks into libtorch's own machinery; the Trainer's `tensor_peak_mib` metric and the
// planner's activation profile (plan/compute_profile.h) read it.
//
// Installed once, for the rest of the process, by the first install_tensor_memory_counter(). Only tensors
// allocated after that are counted: install it before the model is built (dtrain train does so when it
// writes metrics or plans).
#pragma once

#include <cstdint>

namespace dtrain::dispatch {

// Installs the counter (idempotent, thread-safe).
void install_tensor_memory_counter();
bool tensor_memory_counter_installed();

// Bytes held now by tensors allocated since the counter was installed (0 without it).
int64_t tensor_bytes_live();
// Their peak since the counter was installed or since the last reset_tensor_peak().
int64_t tensor_bytes_peak();
// From now on the peak counts from what is live now.
void reset_tensor_peak();

}  // namespace dtrain::dispatch

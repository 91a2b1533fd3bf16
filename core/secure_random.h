// Random bytes from the kernel (getrandom), for secrets and challenges; not for simulation.
#pragma once

#include <string>

namespace dtrain {

// 2 * `bytes` lowercase hex digits of kernel randomness. Throws Error if the kernel cannot provide them.
std::string random_hex(int bytes);

}  // namespace dtrain

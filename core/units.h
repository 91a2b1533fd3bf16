// Sizes as users write them on command lines and in environment variables: "25M", "64KiB", "4096".
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// "1K" -> 1024, "64M" -> 67108864, "4096" -> 4096 (units K, M, G and their KB/KiB spellings are powers of
// 1024). ValueError naming `what` (the flag or variable, e.g. "--bucket-bytes") and the value when `s` is not
// a positive size of at most 1 TiB.
int64_t parse_bytes(const std::string& what, const std::string& s);

}  // namespace dtrain

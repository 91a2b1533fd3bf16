// Sizes as users write them; see units.h.
#include "core/units.h"

#include <cstdlib>

#include "core/error.h"

namespace dtrain {

int64_t parse_bytes(const std::string& what, const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double mult = -1;
  if (unit.empty() || unit == "B") mult = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB") mult = 1024.0;
  if (unit == "M" || unit == "MB" || unit == "MiB") mult = 1024.0 * 1024;
  if (unit == "G" || unit == "GB" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  if (end == s.c_str() || mult < 0 || !(v > 0)) {
    throw ValueError(str_cat(what, ": '", s, "' is not a size. Use a positive number with an optional unit ",
                             "K, M or G (powers of 1024), e.g. 1K, 25M or 4096."));
  }
  if (!(v * mult <= static_cast<double>(int64_t{1} << 40))) {
    throw ValueError(
        str_cat(what, ": '", s, "' is more than 1 TiB, beyond what a rank can hold. Use e.g. 64M."));
  }
  return static_cast<int64_t>(v * mult);
}

}  // namespace dtrain

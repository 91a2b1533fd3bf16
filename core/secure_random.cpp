// random_hex; see secure_random.h.
#include "core/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace dtrain {

std::string random_hex(int bytes) {
  std::vector<unsigned char> b(static_cast<size_t>(bytes));
  size_t got = 0;
  while (got < b.size()) {
    ssize_t n = ::getrandom(b.data() + got, b.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(str_cat("getrandom failed: ", std::strerror(errno), "."));
    got += static_cast<size_t>(n);
  }
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

}  // namespace dtrain

// Out-of-line pieces of the error helpers.
#include "core/error.h"

namespace dtrain {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(str_cat("internal error: ", file, ":", line, ": assertion `", expr, "` failed",
                      msg.empty() ? "" : ": ", msg, ". This is a bug in dtrain; please report it."));
}

}  // namespace dtrain

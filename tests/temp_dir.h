// A fresh folder under /tmp for one test (mkdtemp: unique even when CTest runs tests of one file in parallel,
// each in its own process). The test removes it.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace dtrain::test {

inline std::filesystem::path temp_dir(const std::string& prefix = "dtrain_comm_test") {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  return mkdtemp(tmpl.data());
}

}  // namespace dtrain::test

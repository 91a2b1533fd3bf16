// Result checks shared by the suites of tests/comm_worker: every check counts, and a failure records what
// differs (first mismatches and the largest difference, as llm.c's check_tensor does) instead of stopping the
// rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace dtrain::test {

extern int g_checks;
extern std::string g_failures;

void check_equal(const std::string& what, const at::Tensor& actual, const at::Tensor& expected);
void check_close(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                 double tol = 1e-5);

}  // namespace dtrain::test

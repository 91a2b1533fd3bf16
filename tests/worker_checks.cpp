// Result checks; see worker_checks.h.
#include "tests/worker_checks.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace dtrain::test {

int g_checks = 0;
std::string g_failures;

// Compares exactly; on mismatch records the first differing indices and the largest difference (llm.c's
// check).
void check_equal(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) {
  ++g_checks;
  at::Tensor a = actual.to(at::kDouble).reshape({-1}), e = expected.to(at::kDouble).reshape({-1});
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    g_failures += str_cat("FAIL ", what, ": shape/dtype ", actual.sizes(), "/", actual.scalar_type(),
                          " vs expected ", expected.sizes(), "/", expected.scalar_type(), "\n");
    return;
  }
  if (at::equal(a, e)) return;
  at::Tensor diff = (a - e).abs();
  std::string first;
  auto idx = at::nonzero(diff).reshape({-1});
  for (int64_t k = 0; k < std::min<int64_t>(idx.numel(), 3); ++k) {
    int64_t i = idx[k].item<int64_t>();
    first += str_cat(" [", i, "] got ", a[i].item<double>(), " want ", e[i].item<double>());
  }
  g_failures += str_cat("FAIL ", what, ": ", idx.numel(), " mismatches, max diff ", diff.max().item<double>(),
                        ";", first, "\n");
}

// For float results whose summation order differs from the reference (partial sums on several ranks).
void check_close(const std::string& what, const at::Tensor& actual, const at::Tensor& expected, double tol) {
  ++g_checks;
  if (actual.sizes() != expected.sizes()) {
    g_failures += str_cat("FAIL ", what, ": shape ", actual.sizes(), " vs expected ", expected.sizes(), "\n");
    return;
  }
  double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  if (!(diff <= tol)) g_failures += str_cat("FAIL ", what, ": max diff ", diff, " > ", tol, "\n");
}

}  // namespace dtrain::test

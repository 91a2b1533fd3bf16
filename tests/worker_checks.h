// Result checks shared by the suites of tests/comm_worker: every check counts, and a failure records what
// differs (first mismatches and the largest difference, as llm.c's check_tensor does) instead of stopping the
// rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "tensor/placement.h"

namespace dtrain::test {

extern int g_checks;
extern std::string g_failures;

void check_equal(const std::string& what, const at::Tensor& actual, const at::Tensor& expected);
void check_close(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                 double tol = 1e-5);

// Integer-valued data of `shape` (double, values -6..6), different per salt.
at::Tensor data(std::vector<int64_t> shape, int salt);

// This rank's block of the global tensor `g` laid out as `placements` on `m`, with asymmetric integer-valued
// parts on Partial axes (and the same values at every coordinate of a Replicate axis).
at::Tensor block_of(const at::Tensor& g, const mesh::DeviceMesh& m, const tensor::Placements& placements);

}  // namespace dtrain::test

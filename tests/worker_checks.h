// Result checks shared by the suites of tests/comm_worker: every check counts, and a failure records what
// differs (first mismatches and the largest difference, as llm.c's check_tensor does) instead of stopping the
// rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "tensor/placement.h"

namespace dtrain::test {

extern int g_checks;
extern std::string g_failures;

void check_equal(const std::string& what, const at::Tensor& actual, const at::Tensor& expected);
void check_close(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                 double tol = 1e-5);
// A check that `ok` holds; `what` says what was expected and what came.
void check_true(const std::string& what, bool ok);
// ||actual - expected|| <= tol * ||expected||, relative by the norm of the difference (shapes must match). A
// tensor that is zero in exact arithmetic (attention's key bias: softmax ignores it; its gradient is rounding
// noise) holds only float64 noise, about 1e-14: it compares against an absolute floor of 1e-10.
void check_relative(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                    double tol);

// The strategy parity tests' optimizer: AdamW(lr 3e-3, weight decay 0.1) over `params` (an OptimizerFactory).
std::unique_ptr<torch::optim::Optimizer> parity_adamw(std::vector<at::Tensor> params);
// Two models::GPT of `cfg` in `dtype` with the same initial values: the one-process reference and the model
// to lay out.
std::pair<models::GPT, models::GPT> twin_gpts(const models::GPTConfig& cfg, at::ScalarType dtype);

// Integer-valued data of `shape` (double, values -6..6), different per salt.
at::Tensor data(std::vector<int64_t> shape, int salt);

// This rank's block of the global tensor `g` laid out as `placements` on `m`, with asymmetric integer-valued
// parts on Partial axes (and the same values at every coordinate of a Replicate axis).
at::Tensor block_of(const at::Tensor& g, const mesh::DeviceMesh& m, const tensor::Placements& placements);

}  // namespace dtrain::test

// Result checks; see worker_checks.h.
#include "tests/worker_checks.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "core/error.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"

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
  if (actual.numel() == 0) return;  // an empty block (more ranks than rows)
  double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  if (!(diff <= tol)) g_failures += str_cat("FAIL ", what, ": max diff ", diff, " > ", tol, "\n");
}

// Values whose reduction with `op` over the k coordinates of axis `axis` is `v`, and that differ between
// coordinates (so a result cannot match by coincidence): this coordinate's part. Integer-valued, so every
// check is exact.
// `other` (the coordinates on the other axes) also varies the parts, so that reducing over the wrong axis or
// in the wrong order shows.
namespace {

at::Tensor partial_part(const at::Tensor& v, comm::ReduceOp op, int64_t k, int64_t c, int axis,
                        int64_t other) {
  at::Tensor idx = at::arange(v.numel(), at::kLong).view(v.sizes()).to(v.scalar_type());
  auto noise = [&](int64_t i) { return at::remainder(idx * 7 + i * 5 + axis * 3 + other * 11, 9) - 4; };
  auto sum_part = [&](const at::Tensor& total) {
    if (c < k - 1) return noise(c);
    at::Tensor rest = total.clone();
    for (int64_t i = 0; i < k - 1; ++i) rest -= noise(i);
    return rest;
  };
  switch (op) {
    case comm::ReduceOp::kSum:
      return sum_part(v);
    case comm::ReduceOp::kAvg:  // multiples of k, so that P(avg) -> P(sum) (a division by k) stays exact
      return sum_part(v) * static_cast<double>(k);
    case comm::ReduceOp::kMax:    // the coordinate holding the extreme varies by element and axis (not by the
    case comm::ReduceOp::kMin: {  // others: then some rank holds it on every axis, as the nesting needs)
      at::Tensor holder = at::remainder(idx + axis, static_cast<double>(k)).eq(static_cast<double>(c));
      at::Tensor off = 1 + at::remainder(idx + c, 3);
      return at::where(holder, v, op == comm::ReduceOp::kMax ? v - off : v + off);
    }
  }
  return v;
}

}  // namespace

at::Tensor data(std::vector<int64_t> shape, int salt) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return ((at::arange(n, at::kLong) * (3 + salt) + salt) % 13 - 6).view(shape).to(at::kDouble);
}

// This rank's block of `g` laid out as `placements`, with asymmetric parts on Partial axes.
at::Tensor block_of(const at::Tensor& g, const mesh::DeviceMesh& m, const tensor::Placements& placements) {
  at::Tensor v = g;
  for (size_t a = 0; a < placements.size(); ++a) {
    if (placements[a].is_partial()) {
      // The coordinates on the other axes, except Replicate ones: a Replicate axis holds the same values at
      // each of its coordinates (that is what the ops' rules rely on, e.g. (R, P) x (P, R) -> (P, P)).
      int64_t other = 0;
      for (size_t b = 0; b < placements.size(); ++b) {
        if (b != a && !placements[b].is_replicate()) other = other * 3 + m.coordinate()[b];
      }
      v = partial_part(v, placements[a].op, m.size(static_cast<int>(a)), m.coordinate()[a],
                       static_cast<int>(a), other);
    }
  }
  tensor::Placements shards_only = placements;
  for (auto& p : shards_only) {
    if (p.is_partial()) p = tensor::Replicate();
  }
  return tensor::local_block(v, m.shape(), shards_only, m.coordinate());
}

void check_true(const std::string& what, bool ok) {
  ++g_checks;
  if (!ok) g_failures += str_cat("FAIL ", what, "\n");
}

void check_relative(const std::string& what, const at::Tensor& actual, const at::Tensor& expected,
                    double tol) {
  ++g_checks;
  if (!actual.sizes().equals(expected.sizes())) {
    g_failures += str_cat("FAIL ", what, ": shape ", actual.sizes(), " vs ", expected.sizes(), "\n");
    return;
  }
  double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).norm().item<double>();
  double scale = std::max(expected.to(at::kDouble).norm().item<double>(), 1e-10 / tol);
  if (!(diff <= tol * scale)) {
    g_failures += str_cat("FAIL ", what, ": |diff| ", diff, " > ", tol, " x |expected| ", scale, "\n");
  }
}

std::unique_ptr<torch::optim::Optimizer> parity_adamw(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
}

std::pair<models::GPT, models::GPT> twin_gpts(const models::GPTConfig& cfg, at::ScalarType dtype) {
  models::GPT ref(cfg), gpt(cfg);
  ref->to(dtype);
  gpt->to(dtype);
  return {ref, gpt};
}

}  // namespace dtrain::test

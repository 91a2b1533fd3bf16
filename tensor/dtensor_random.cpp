// DTensor random numbers; see dtensor_random.h.
#include "tensor/dtensor_random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <cmath>
#include <map>
#include <mutex>

#include "core/error.h"

namespace dtrain::tensor {

namespace {

struct State {
  std::mutex mu;
  bool seeded = false;  // manual_seed() was called
  uint64_t seed = 0;
  uint64_t op = 0;                          // the next random op's offset
  std::map<std::vector<int>, bool> synced;  // meshes (by their ranks) whose ranks share the state
};

State& state() {
  static auto* s = new State;
  return *s;
}

constexpr double kTwo53 = 9007199254740992.0;

double u53(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) / kTwo53;  // [0, 1)
}

}  // namespace

void manual_seed(uint64_t seed) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.seeded = true;
  s.seed = seed;
  s.op = 0;
  s.synced.clear();
}

namespace detail {

void random_fill(at::Tensor& block, const std::vector<int64_t>& global_shape,
                 const std::vector<int64_t>& offset, const MeshPtr& mesh, RandomKind kind, double a,
                 double b) {
  State& s = state();
  uint64_t seed, op;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    if (!s.synced[mesh->global_ranks()]) {
      // Mesh rank 0's state for every rank of the mesh: one broadcast, the first time on this mesh.
      if (!s.seeded) {
        s.seed = at::detail::getDefaultCPUGenerator().current_seed();
        s.seeded = true;
      }
      at::Tensor st = at::tensor({static_cast<int64_t>(s.seed), static_cast<int64_t>(s.op)}, at::kLong);
      lock.unlock();
      mesh->group()->broadcast(st, {0})->wait();
      lock.lock();
      s.seed = static_cast<uint64_t>(st[0].item<int64_t>());
      s.op = static_cast<uint64_t>(st[1].item<int64_t>());
      s.synced[mesh->global_ranks()] = true;
    }
    seed = s.seed;
    op = s.op++;
  }
  const size_t n = global_shape.size();
  std::vector<int64_t> gstride(n, 1);
  for (size_t d = n; d-- > 1;) gstride[d - 1] = gstride[d] * global_shape[d];
  const std::vector<int64_t> shape = block.sizes().vec();
  const int64_t count = block.numel();
  std::vector<double> values(static_cast<size_t>(count));
  std::vector<int64_t> idx(n, 0);  // position within the block, row-major
  for (int64_t e = 0; e < count; ++e) {
    int64_t g = 0;
    for (size_t d = 0; d < n; ++d) g += (offset[d] + idx[d]) * gstride[d];
    at::Philox4_32 engine(seed, static_cast<uint64_t>(g), op);
    const uint32_t w0 = engine(), w1 = engine(), w2 = engine(), w3 = engine();
    double v = 0;
    switch (kind) {
      case RandomKind::kUniform:
        v = a + (b - a) * u53(w0, w1);
        break;
      case RandomKind::kBernoulli:
        v = u53(w0, w1) < a ? 1.0 : 0.0;
        break;
      case RandomKind::kNormal: {
        const double r = std::sqrt(-2.0 * std::log(1.0 - u53(w0, w1)));  // 1 - u in (0, 1]
        v = a + b * r * std::cos(2.0 * M_PI * u53(w2, w3));
        break;
      }
    }
    values[static_cast<size_t>(e)] = v;
    for (size_t d = n; d-- > 0;) {  // next position
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  block.copy_(at::from_blob(values.data(), shape, at::kDouble).to(block.scalar_type()));
}

}  // namespace detail

}  // namespace dtrain::tensor

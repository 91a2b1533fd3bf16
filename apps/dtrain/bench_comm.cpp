// `dtrain bench comm`; see bench_comm.h.
#include "apps/dtrain/bench_comm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "comm/backend.h"
#include "comm/factory.h"
#include "core/error.h"
#include "tensor/cost_model.h"

namespace dtrain::apps {

void run_collective(comm::Backend& b, const std::string& op, at::Tensor& in, at::Tensor& out) {
  if (op == "all_reduce") {
    b.all_reduce(in)->wait();
  } else if (op == "all_gather") {
    b.all_gather(out, in)->wait();
  } else if (op == "reduce_scatter") {
    b.reduce_scatter(out, in)->wait();
  } else if (op == "broadcast") {
    b.broadcast(in)->wait();
  } else {
    b.all_to_all(out, in)->wait();
  }
}

double bus_factor(const std::string& op, int n) {
  if (n <= 1) return op == "broadcast" ? 1.0 : 0.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

namespace {

const std::vector<std::string> kOps{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "float32") return at::kFloat;
  if (s == "float64") return at::kDouble;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float16") return at::kHalf;
  if (s == "int32") return at::kInt;
  if (s == "int64") return at::kLong;
  throw ValueError(str_cat("bench comm: --dtype ", s,
                           " is unknown. Use float32, float64, bfloat16, float16, int32 or int64."));
}

// Buffers for one op of `count` elements (nccl-tests convention: all_gather's size is its output,
// reduce_scatter's its input).
struct Buffers {
  at::Tensor in, out;
};

Buffers make_buffers(const std::string& op, int64_t count, int n, at::ScalarType dtype) {
  auto o = at::TensorOptions().dtype(dtype);
  if (op == "all_gather") return {at::ones({count / n}, o), at::empty({count / n * n}, o)};
  if (op == "reduce_scatter") return {at::ones({count / n * n}, o), at::empty({count / n}, o)};
  if (op == "all_to_all") return {at::ones({count / n * n}, o), at::empty({count / n * n}, o)};
  return {at::ones({count}, o), at::Tensor()};
}

}  // namespace

int run_bench_comm(const BenchCommOptions& opts) {
  for (const auto& op : opts.ops) {
    if (std::find(kOps.begin(), kOps.end(), op) == kOps.end()) {
      throw ValueError(
          str_cat("bench comm: --ops contains '", op,
                  "'. Use a comma-separated subset of all_reduce,all_gather,reduce_scatter,broadcast,"
                  "all_to_all."));
    }
  }
  if (opts.min_bytes < 1 || opts.max_bytes < opts.min_bytes) {
    throw ValueError(str_cat("bench comm: sizes ", opts.min_bytes, "..", opts.max_bytes,
                             " bytes are not a range. Give 1 <= --min-bytes <= --max-bytes."));
  }
  if (opts.step_factor < 2) throw ValueError("bench comm: --step-factor must be 2 or more.");
  if (opts.iters < 0 || opts.warmup < 0)
    throw ValueError("bench comm: --iters and --warmup must be 0 or more.");
  at::ScalarType dtype = parse_dtype(opts.dtype);
  int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));

  comm::InitOptions init;
  init.backend = opts.backend;
  comm::BackendPtr world = comm::init(init);
  const int n = world->group_size();
  if (!opts.profile.empty() && n < 2) {
    throw ValueError(
        str_cat("bench comm: --profile ", opts.profile,
                " needs at least 2 ranks (one rank moves nothing). Run it under `dtrain run -n 2` or more."));
  }
  tensor::CommProfile profile{world->name(), n, {}};
  const bool printer = world->group_rank() == 0;
  if (printer && !opts.json) {
    std::printf("# dtrain bench comm: backend %s, %d ranks, dtype %s, OMP_NUM_THREADS=%d\n",
                world->name().c_str(), n, opts.dtype.c_str(), at::get_num_threads());
    std::printf("# time: per call, the slowest rank's; min and median over iterations; bw from the median\n");
  }
  for (const auto& op : opts.ops) {
    std::vector<std::pair<double, double>> fit_points;  // (bus bytes, median seconds)
    if (printer && !opts.json) {
      std::printf("\n# %s\n%12s %12s %8s %12s %12s %10s %10s\n", op.c_str(), "size(B)", "count", "iters",
                  "min(us)", "median(us)", "algbw", "busbw");
      std::printf("%12s %12s %8s %12s %12s %10s %10s\n", "", "(elements)", "", "", "", "(GB/s)", "(GB/s)");
    }
    for (int64_t bytes = opts.min_bytes; bytes <= opts.max_bytes; bytes *= opts.step_factor) {
      int64_t count = std::max<int64_t>(bytes / elem, n);
      count = count / n * n;  // divisible by the ranks, as nccl-tests rounds
      int64_t real_bytes = count * elem;
      int iters = opts.iters > 0
                      ? opts.iters
                      : static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / real_bytes, 5, 50));
      Buffers buf = make_buffers(op, count, n, dtype);
      for (int i = 0; i < opts.warmup; ++i) run_collective(*world, op, buf.in, buf.out);
      at::Tensor times = at::empty({iters}, at::kDouble);
      auto t = times.accessor<double, 1>();
      for (int i = 0; i < iters; ++i) {
        world->barrier()->wait();
        auto t0 = std::chrono::steady_clock::now();
        run_collective(*world, op, buf.in, buf.out);
        t[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      world->all_reduce(times, {comm::ReduceOp::kMax})->wait();
      at::Tensor sorted = std::get<0>(times.sort());
      double tmin = sorted[0].item<double>();
      double tmed = sorted[iters / 2].item<double>();
      double algbw = static_cast<double>(real_bytes) / tmed / 1e9;
      double busbw = algbw * bus_factor(op, n);
      fit_points.emplace_back(static_cast<double>(real_bytes) * bus_factor(op, n), tmed);
      if (!printer) continue;
      if (opts.json) {
        nlohmann::json j{
            {"tool", "dtrain"},     {"backend", world->name()}, {"ranks", n},          {"op", op},
            {"bytes", real_bytes},  {"count", count},           {"dtype", opts.dtype}, {"iters", iters},
            {"min_us", tmin * 1e6}, {"median_us", tmed * 1e6},  {"algbw_gbs", algbw},  {"busbw_gbs", busbw}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%12lld %12lld %8d %12.1f %12.1f %10.3f %10.3f\n", static_cast<long long>(real_bytes),
                    static_cast<long long>(count), iters, tmin * 1e6, tmed * 1e6, algbw, busbw);
      }
      std::fflush(stdout);
    }
    if (!opts.profile.empty() && fit_points.size() >= 2)
      profile.collectives[op] = tensor::fit_alpha_beta(fit_points);
  }
  if (!opts.profile.empty() && printer) {
    tensor::write_profile(opts.profile, profile);
    std::printf("\n# profile written to %s (alpha + beta * bus bytes per collective)\n",
                opts.profile.c_str());
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace dtrain::apps

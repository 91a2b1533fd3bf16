// The collective benchmark; see comm_benchmark.h.
#include "plan/comm_benchmark.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace dtrain::plan {

namespace {

const std::vector<std::string> kOps{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};

}  // namespace

void validate(const CommBenchOptions& opts) {
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
  if (opts.step_factor < 2) {
    throw ValueError(str_cat("bench comm: --step-factor ", opts.step_factor, " must be 2 or more."));
  }
  if (opts.iters < 0 || opts.warmup < 0) {
    throw ValueError(
        str_cat("bench comm: --iters ", opts.iters, " and --warmup ", opts.warmup, " must be 0 or more."));
  }
  parse_bench_dtype(opts.dtype);
}

at::ScalarType parse_bench_dtype(const std::string& s) {
  if (s == "float32") return at::kFloat;
  if (s == "float64") return at::kDouble;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float16") return at::kHalf;
  if (s == "int32") return at::kInt;
  if (s == "int64") return at::kLong;
  throw ValueError(str_cat("bench comm: --dtype ", s,
                           " is unknown. Use float32, float64, bfloat16, float16, int32 or int64."));
}

BenchBuffers make_bench_buffers(const std::string& op, int64_t count, int n, at::ScalarType dtype) {
  auto o = at::TensorOptions().dtype(dtype);
  if (op == "all_gather") return {at::ones({count / n}, o), at::empty({count / n * n}, o)};
  if (op == "reduce_scatter") return {at::ones({count / n * n}, o), at::empty({count / n}, o)};
  if (op == "all_to_all") return {at::ones({count / n * n}, o), at::empty({count / n * n}, o)};
  return {at::ones({count}, o), at::Tensor()};
}

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

comm::CommProfile run_comm_benchmark(comm::Backend& world, const CommBenchOptions& opts,
                                     const std::function<void(const CommBenchRow&)>& on_row) {
  validate(opts);
  const at::ScalarType dtype = parse_bench_dtype(opts.dtype);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  const int n = world.group_size();
  comm::CommProfile profile{world.name(), n, {}};
  for (const auto& op : opts.ops) {
    std::vector<std::pair<double, double>> fit_points;  // (bus bytes, median seconds)
    for (int64_t bytes = opts.min_bytes; bytes <= opts.max_bytes; bytes *= opts.step_factor) {
      CommBenchRow row;
      row.op = op;
      row.count = std::max<int64_t>(bytes / elem, n) / n * n;  // divisible by the ranks, as nccl-tests rounds
      row.bytes = row.count * elem;
      row.iters = opts.iters > 0
                      ? opts.iters
                      : static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / row.bytes, 5, 50));
      BenchBuffers buf = make_bench_buffers(op, row.count, n, dtype);
      for (int i = 0; i < opts.warmup; ++i) run_collective(world, op, buf.in, buf.out);
      at::Tensor times = at::empty({row.iters}, at::kDouble);
      auto t = times.accessor<double, 1>();
      for (int i = 0; i < row.iters; ++i) {
        world.barrier()->wait();
        auto t0 = std::chrono::steady_clock::now();
        run_collective(world, op, buf.in, buf.out);
        t[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      world.all_reduce(times, {comm::ReduceOp::kMax})->wait();  // the slowest rank's time per call
      at::Tensor sorted = std::get<0>(times.sort());
      row.min_s = sorted[0].item<double>();
      row.median_s = sorted[row.iters / 2].item<double>();
      row.algbw_gbs = static_cast<double>(row.bytes) / row.median_s / 1e9;
      row.busbw_gbs = row.algbw_gbs * bus_factor(op, n);
      fit_points.emplace_back(static_cast<double>(row.bytes) * bus_factor(op, n), row.median_s);
      on_row(row);
    }
    if (fit_points.size() >= 2) profile.collectives[op] = comm::fit_alpha_beta(fit_points);
  }
  return profile;
}

}  // namespace dtrain::plan

// Command-line options of `dtrain bench comm`; see cmd_bench.h.
#include "apps/dtrain/cmd_bench.h"

#include <cstdlib>

#include "core/error.h"
#include "core/units.h"

namespace dtrain::apps {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchCommOptions& opts) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* comm = bench->add_subcommand("comm", "Collective bandwidth table; run it inside `dtrain run`");
  comm->add_option("--backend", opts.backend, "gloo or mpi (default: from the launcher's environment)")
      ->check(CLI::IsMember({"gloo", "mpi", "nccl"}));
  comm->add_option_function<std::string>(
      "--ops", [&opts](const std::string& v) { opts.sweep.ops = split_commas(v); },
      "Comma-separated collectives (default: all_reduce,all_gather,reduce_scatter,broadcast,all_to_all)");
  comm->add_option_function<std::string>(
          "--min-bytes",
          [&opts](const std::string& v) { opts.sweep.min_bytes = parse_bytes("bench comm: size", v); },
          "Smallest size, e.g. 1K")
      ->default_str("1K");
  comm->add_option_function<std::string>(
          "--max-bytes",
          [&opts](const std::string& v) { opts.sweep.max_bytes = parse_bytes("bench comm: size", v); },
          "Largest size, e.g. 64M")
      ->default_str("64M");
  comm->add_option("--step-factor", opts.sweep.step_factor, "Size multiplier between rows")
      ->capture_default_str();
  comm->add_option("--dtype", opts.sweep.dtype, "Element type")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16", "int32", "int64"}))
      ->capture_default_str();
  comm->add_option("--iters", opts.sweep.iters, "Timed iterations per size (0: automatic)")
      ->capture_default_str();
  comm->add_option("--warmup", opts.sweep.warmup, "Untimed iterations per size")->capture_default_str();
  comm->add_flag("--json", opts.json, "One JSON object per row instead of the table");
  comm->add_option(
      "--profile", opts.profile,
      "Also fit alpha + beta * bytes per collective and write them to this JSON file (the cost model "
      "of DTensor redistribution reads it)");
  return comm;
}

}  // namespace dtrain::apps

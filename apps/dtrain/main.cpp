// The dtrain command-line tool: `dtrain run` (launcher) and `dtrain bench comm` (collective benchmark).
// Argument parsing and exit codes only; the work is done by the libraries. Exit codes: 0 success, 1 failure
// at run time, 2 bad usage or input.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/dtrain/bench_comm.h"
#include "apps/dtrain/cmd_run.h"
#include "core/error.h"
#include "launch/launcher.h"

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

int64_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double mult = unit.empty() || unit == "B"   ? 1
                : unit == "K" || unit == "KB" ? 1024
                : unit == "M" || unit == "MB" ? 1024.0 * 1024
                : unit == "G" || unit == "GB" ? 1024.0 * 1024 * 1024
                                              : -1;
  if (end == s.c_str() || mult < 0 || v <= 0) {
    throw dtrain::ValueError(
        dtrain::str_cat("bench comm: size '", s, "' is not a size. Use e.g. 1K, 64M or 4096."));
  }
  return static_cast<int64_t>(v * mult);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed training on libtorch"};
  app.require_subcommand(1);

  dtrain::launch::LaunchOptions run_opts;
  CLI::App* run = dtrain::apps::add_run_command(app, run_opts);

  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  CLI::App* bench_comm = bench->add_subcommand("comm", "collective bandwidth table, run inside `dtrain run`");
  dtrain::apps::BenchCommOptions bc;
  std::string ops, min_bytes = "1K", max_bytes = "64M";
  bench_comm->add_option("--backend", bc.backend, "gloo or mpi (default: from the launcher's environment)");
  bench_comm->add_option("--ops", ops, "comma-separated collectives (default: all)");
  bench_comm->add_option("--min-bytes", min_bytes, "smallest size, e.g. 1K")->capture_default_str();
  bench_comm->add_option("--max-bytes", max_bytes, "largest size, e.g. 64M")->capture_default_str();
  bench_comm->add_option("--step-factor", bc.step_factor, "size multiplier between rows")
      ->capture_default_str();
  bench_comm->add_option("--dtype", bc.dtype, "element type")->capture_default_str();
  bench_comm->add_option("--iters", bc.iters, "timed iterations per size (0: automatic)")
      ->capture_default_str();
  bench_comm->add_option("--warmup", bc.warmup, "untimed iterations per size")->capture_default_str();
  bench_comm->add_flag("--json", bc.json, "one JSON object per row");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (run->parsed()) {
      return dtrain::launch::run(run_opts);
    }
    if (bench_comm->parsed()) {
      if (!ops.empty()) bc.ops = split_commas(ops);
      bc.min_bytes = parse_bytes(min_bytes);
      bc.max_bytes = parse_bytes(max_bytes);
      return dtrain::apps::run_bench_comm(bc);
    }
  } catch (const dtrain::ValueError& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 2;
  } catch (const dtrain::NotSupportedError& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

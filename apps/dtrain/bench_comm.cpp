// `dtrain bench comm`; see bench_comm.h.
#include "apps/dtrain/bench_comm.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "comm/factory.h"
#include "core/error.h"
#include "plan/cluster_profile.h"
#include "plan/comm_benchmark.h"
#include "plan/overlap_benchmark.h"

namespace dtrain::apps {

int run_bench_comm(const BenchCommOptions& opts) {
  plan::validate(opts.sweep);

  comm::InitOptions init;
  init.backend = opts.backend;
  comm::BackendPtr world = comm::init(init);
  const int n = world->group_size();
  if (!opts.profile.empty() && n < 2) {
    throw ValueError(
        str_cat("bench comm: --profile ", opts.profile,
                " needs at least 2 ranks (one rank moves nothing). Run it under `dtrain run -n 2` or more."));
  }
  const bool printer = world->group_rank() == 0;
  if (printer && !opts.json) {
    std::printf("# dtrain bench comm: backend %s, %d ranks, dtype %s, OMP_NUM_THREADS=%d\n",
                world->name().c_str(), n, opts.sweep.dtype.c_str(), at::get_num_threads());
    std::printf("# time: per call, the slowest rank's; min and median over iterations; bw from the median\n");
  }
  std::string last_op;
  comm::CommProfile profile = plan::run_comm_benchmark(*world, opts.sweep, [&](const plan::CommBenchRow& r) {
    if (!printer) return;
    if (opts.json) {
      nlohmann::json j{{"tool", "dtrain"},
                       {"backend", world->name()},
                       {"ranks", n},
                       {"op", r.op},
                       {"bytes", r.bytes},
                       {"count", r.count},
                       {"dtype", opts.sweep.dtype},
                       {"iters", r.iters},
                       {"min_us", r.min_s * 1e6},
                       {"median_us", r.median_s * 1e6},
                       {"algbw_gbs", r.algbw_gbs},
                       {"busbw_gbs", r.busbw_gbs}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      if (r.op != last_op) {
        std::printf("\n# %s\n%12s %12s %8s %12s %12s %10s %10s\n", r.op.c_str(), "size(B)", "count", "iters",
                    "min(us)", "median(us)", "algbw", "busbw");
        std::printf("%12s %12s %8s %12s %12s %10s %10s\n", "", "(elements)", "", "", "", "(GB/s)", "(GB/s)");
        last_op = r.op;
      }
      std::printf("%12lld %12lld %8d %12.1f %12.1f %10.3f %10.3f\n", static_cast<long long>(r.bytes),
                  static_cast<long long>(r.count), r.iters, r.min_s * 1e6, r.median_s * 1e6, r.algbw_gbs,
                  r.busbw_gbs);
    }
    std::fflush(stdout);
  });
  if (!opts.profile.empty()) {
    // ranks on one host: the intra-host links (and the overlap); on several: the links across hosts. A
    // profile already at the path keeps its other part (measure on one host, then across hosts).
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const bool across = local != nullptr && std::atoi(local) > 0 && std::atoi(local) < n;
    const double overlap = across ? -1 : plan::measure_overlap(*world);
    if (printer) {
      plan::ClusterProfile cp;
      if (std::filesystem::exists(opts.profile)) {
        try {
          cp = plan::read_cluster_profile(opts.profile);
        } catch (const ValueError&) {
          cp = plan::ClusterProfile{};  // (not a profile: replaced whole)
        }
      }
      cp.backend = world->name();
      cp.source = "measured by dtrain bench comm";
      plan::LinkProfile& links = across ? cp.inter_host : cp.intra_host;
      links.ranks = n;
      links.collectives = profile.collectives;
      if (!across) cp.overlap = overlap;
      plan::write_cluster_profile(opts.profile, cp);
      std::printf("\n# profile written to %s: alpha + beta * bus bytes per collective, %s%s\n",
                  opts.profile.c_str(), across ? "across hosts (inter_host)" : "within one host",
                  across ? "" : str_cat("; overlap ", overlap, " (plan/overlap_benchmark.h)").c_str());
    }
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace dtrain::apps

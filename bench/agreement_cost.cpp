// What the agreement check costs (comm/backend.h, "Agreement"): in one run, dtrain's all_reduce with the
// check and without it (comm::set_agreement_check), alternating call by call and which goes first, each after
// a barrier, sizes 1 KiB to 64 MiB, the whole sweep repeated --rounds times. A call's time is the slowest
// rank's. Prints one JSON line per round and size on rank 0: the medians of both sides, their minimums, and
// the paired overhead = median over iterations of (with - without) / median(without). Pairing the two calls
// of one iteration cancels the slow drifts of a busy machine that move the medians of either side by ~10%.
// --aa 1 runs the same pairing with the check on both sides (an A/A run: the spread the machine alone gives
// the paired figure); --min-bytes B starts the sweep at B.
//   dtrain run -n 2 --backend gloo -- build/bench/agreement_cost [--iters N] [--rounds R] [--aa 1]
//       [--min-bytes B]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/detail/agreement.h"
#include "comm/factory.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 0, rounds = 3;
  bool aa = false;
  int64_t min_bytes = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") iters = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--aa") aa = std::stoi(argv[i + 1]) != 0;
    if (std::string(argv[i]) == "--min-bytes") min_bytes = std::stoll(argv[i + 1]);
  }
  at::set_num_threads(1);
  comm::BackendPtr world = comm::init();
  const int n = world->group_size();
  for (int round = 0; round < rounds; ++round) {
    for (int64_t bytes = min_bytes; bytes <= (int64_t{64} << 20); bytes *= 4) {
      const int64_t count = bytes / 4;
      const int it =
          iters > 0 ? iters : static_cast<int>(std::clamp<int64_t>((int64_t{1} << 30) / bytes, 20, 200));
      at::Tensor x = at::ones({count});
      std::vector<double> times[2];  // [0]: with the check, [1]: without
      for (int i = 0; i < it + 2; ++i) {
        for (int k = 0; k < 2; ++k) {
          const int side = (i + k) % 2;
          comm::set_agreement_check(true);
          world->barrier()->wait();
          comm::set_agreement_check(side == 0 || aa);
          auto t0 = Clock::now();
          world->all_reduce(x)->wait();
          double t = std::chrono::duration<double>(Clock::now() - t0).count();
          if (i >= 2) times[side].push_back(t);
          x.fill_(1);
        }
      }
      comm::set_agreement_check(true);
      for (auto& t : times) {
        at::Tensor tt = at::tensor(t, at::kDouble);
        world->all_reduce(tt, {comm::ReduceOp::kMax})->wait();
        t.assign(tt.data_ptr<double>(), tt.data_ptr<double>() + tt.numel());
      }
      if (world->group_rank() != 0) continue;
      double with = median(times[0]), without = median(times[1]);
      std::vector<double> diff(times[0].size());
      for (size_t i = 0; i < diff.size(); ++i) diff[i] = times[0][i] - times[1][i];
      nlohmann::json j{{"backend", world->name()},
                       {"mode", aa ? "A/A (check on both sides)" : "with/without"},
                       {"ranks", n},
                       {"round", round},
                       {"bytes", bytes},
                       {"iters", it},
                       {"with_check_median_us", with * 1e6},
                       {"without_check_median_us", without * 1e6},
                       {"with_check_min_us", *std::min_element(times[0].begin(), times[0].end()) * 1e6},
                       {"without_check_min_us", *std::min_element(times[1].begin(), times[1].end()) * 1e6},
                       {"overhead_pct", (with / without - 1) * 100},
                       {"paired_overhead_pct", median(diff) / without * 100}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  world->barrier()->wait();
  return 0;
}

// dtrain's collectives against the same collectives called directly on the engine (blocking MPI calls on
// MPI_COMM_WORLD, or c10d's ProcessGroupGloo on its own store), alternating call by call in one run so both
// see the same machine state. Each side synchronises with its own barrier before its timed call (a barrier on
// one side would warm that side's threads only), and the times are compared once all are taken. Run inside
// `dtrain run -n N --backend B`; rank 0 prints one JSON object per (op, size) and the memcpy ceiling.
//   usage: comm_vs_engine [--ops all_reduce,...] [--min-bytes N] [--max-bytes N] [--iters N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <mpi.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/factory.h"
#include "core/env.h"
#include "plan/comm_benchmark.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

namespace {

// One side of the comparison: its call for `op` on the buffers, and its own barrier.
struct Side {
  std::function<void(const std::string& op, at::Tensor& in, at::Tensor& out)> call;
  std::function<void()> barrier;
};

Side mpi_engine() {
  Side side;
  side.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
  side.call = [](const std::string& op, at::Tensor& in, at::Tensor& out) {
    int n = static_cast<int>(in.numel());
    if (op == "all_reduce") {
      MPI_Allreduce(MPI_IN_PLACE, in.data_ptr(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "all_gather") {
      MPI_Allgather(in.data_ptr(), n, MPI_FLOAT, out.data_ptr(), n, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op == "reduce_scatter") {
      MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(out.numel()), MPI_FLOAT,
                               MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "broadcast") {
      MPI_Bcast(in.data_ptr(), n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else {
      int size = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      MPI_Alltoall(in.data_ptr(), n / size, MPI_FLOAT, out.data_ptr(), n / size, MPI_FLOAT, MPI_COMM_WORLD);
    }
  };
  return side;
}

Side gloo_engine(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg) {
  Side side;
  side.barrier = [pg] { pg->barrier()->wait(); };
  side.call = [pg](const std::string& op, at::Tensor& in, at::Tensor& out) {
    std::vector<at::Tensor> v{in};
    if (op == "all_reduce") {
      pg->allreduce(v)->wait();
    } else if (op == "all_gather") {
      pg->_allgather_base(out, in)->wait();
    } else if (op == "reduce_scatter") {
      pg->_reduce_scatter_base(out, in)->wait();
    } else if (op == "broadcast") {
      pg->broadcast(v)->wait();
    } else {
      std::vector<int64_t> none;
      pg->alltoall_base(out, in, none, none)->wait();
    }
  };
  return side;
}

Side dtrain_side(const comm::BackendPtr& ours) {
  return {[ours](const std::string& op, at::Tensor& in, at::Tensor& out) {
            plan::run_collective(*ours, op, in, out);
          },
          [ours] { ours->barrier()->wait(); }};
}

// Bytes read + written per second by one thread copying 256 MiB (the ceiling for any transport on this host).
double memcpy_gbs() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * bytes / best / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};
  int64_t min_bytes = 1024, max_bytes = 64 << 20;
  int iters = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--ops") {
      ops.clear();
      for (size_t s = 0, e; s <= v.size(); s = e + 1) {
        e = v.find(',', s);
        if (e == std::string::npos) e = v.size();
        ops.push_back(v.substr(s, e - s));
      }
    } else if (k == "--min-bytes") {
      min_bytes = std::stoll(v);
    } else if (k == "--max-bytes") {
      max_bytes = std::stoll(v);
    } else if (k == "--iters") {
      iters = std::stoi(v);
    }
  }
  EnvMap env = current_env();
  RankInfo info = parse_rank_env(env);
  std::string backend = env_get(env, "DTRAIN_BACKEND").value_or("gloo");
  auto timeout = std::chrono::milliseconds(300000);

  // dtrain's side through the factory, as any program gets it (for mpi it also initialises MPI).
  comm::BackendPtr ours = comm::create_backend(backend, info, timeout);
  Side engine;
  if (backend == "mpi") {
    engine = mpi_engine();
  } else {
    // The engine's own group on its own store (the next port), so that nothing of dtrain's is shared.
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(info.master_port + 1);
    so.isServer = info.rank == 0;
    so.numWorkers = info.world_size;
    so.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 2;
    engine = gloo_engine(c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("engine", store), info.rank, info.world_size, opts));
  }
  const Side sides[2] = {dtrain_side(ours), engine};
  const int n = ours->group_size();
  const bool printer = ours->group_rank() == 0;
  if (printer) {
    nlohmann::json j{{"memcpy_gbs_1thread", memcpy_gbs()},
                     {"backend", backend},
                     {"ranks", n},
                     {"omp_threads", at::get_num_threads()}};
    std::printf("%s\n", j.dump().c_str());
  }
  for (const auto& op : ops) {
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      int64_t count = std::max<int64_t>(bytes / 4, n) / n * n;
      int it = iters > 0 ? iters
                         : static_cast<int>(std::clamp<int64_t>((int64_t{512} << 20) / (count * 4), 10, 100));
      bool gathers = op == "all_gather";
      at::Tensor in = at::ones({gathers ? count / n : count});
      at::Tensor out = at::empty({op == "reduce_scatter" ? count / n : count});
      std::vector<double> t_ours, t_engine;  // this rank's times; the slowest rank's are taken at the end
      for (int i = 0; i < it + 2; ++i) {
        for (int k = 0; k < 2; ++k) {
          int side = (i + k) % 2;  // alternate which side goes first
          sides[side].barrier();
          auto t0 = Clock::now();
          sides[side].call(op, in, out);
          double t = std::chrono::duration<double>(Clock::now() - t0).count();
          if (i >= 2) (side == 0 ? t_ours : t_engine).push_back(t);
        }
        in.fill_(1);  // keep all_reduce inputs from growing without bound
      }
      for (auto* times : {&t_ours, &t_engine}) {
        at::Tensor tt = at::tensor(*times, at::kDouble);
        ours->all_reduce(tt, {comm::ReduceOp::kMax})->wait();  // per call, the slowest rank's time
        *times = std::vector<double>(tt.data_ptr<double>(), tt.data_ptr<double>() + tt.numel());
      }
      if (!printer) continue;
      double m_ours = median(t_ours), m_engine = median(t_engine);
      double real_bytes = static_cast<double>(count) * 4;
      nlohmann::json j{{"backend", backend},
                       {"ranks", n},
                       {"op", op},
                       {"bytes", static_cast<int64_t>(real_bytes)},
                       {"iters", it},
                       {"dtrain_median_us", m_ours * 1e6},
                       {"engine_median_us", m_engine * 1e6},
                       {"dtrain_min_us", *std::min_element(t_ours.begin(), t_ours.end()) * 1e6},
                       {"engine_min_us", *std::min_element(t_engine.begin(), t_engine.end()) * 1e6},
                       {"dtrain_busbw_gbs", real_bytes / m_ours / 1e9 * plan::bus_factor(op, n)},
                       {"engine_busbw_gbs", real_bytes / m_engine / 1e9 * plan::bus_factor(op, n)},
                       {"ratio", m_engine / m_ours}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  ours->barrier()->wait();
  return 0;
}

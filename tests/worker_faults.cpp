// The fault suites of tests/comm_worker, run as ranks by tests/fault_test.cpp: a frozen rank 0, ranks that
// outlive a killed launcher, a rank that leaves early, and ranks that disagree on a collective. Each writes
// "<dir>/<suite><rank>.txt" with what it saw.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "mesh/device_mesh.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

using Clock = std::chrono::steady_clock;

// Writes `text` to `path` whole: written to a temporary name, then renamed, so a reader never sees half of
// it.
void write_report(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Ends this rank with exit code 3 (a failed rank: the launcher then stops the job) once every rank in `ranks`
// has written "<dir>/<prefix><r>.txt" (or 20 s passed): the launcher stops the others as soon as one fails,
// so the first to finish must not take the others' reports with it.
[[noreturn]] void fail_after_reports(const std::string& dir, const std::string& prefix,
                                     const std::vector<int>& ranks) {
  auto until = Clock::now() + std::chrono::seconds(20);
  for (int r : ranks) {
    while (!std::ifstream(str_cat(dir, "/", prefix, r, ".txt")).good() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::_Exit(3);
}

}  // namespace

void suite_freeze(const comm::BackendPtr& world, const std::string& dir) {
  const int me = world->group_rank();
  at::Tensor x = at::ones({8});
  world->all_reduce(x)->wait();
  check_equal("all_reduce before the freeze", x, at::full({8}, static_cast<float>(world->group_size())));
  if (me == 0) {
    ::raise(SIGSTOP);  // a machine that stops answering; the launcher's SIGKILL ends it
    return;
  }
  std::string text;
  auto t0 = Clock::now();
  try {
    world->all_reduce(x)->wait();
    text = "completed\n";
  } catch (const std::exception& e) {
    text = str_cat("elapsed_ms ", ms_since(t0), "\nmessage ", e.what(), "\n");
  }
  write_report(str_cat(dir, "/freeze", me, ".txt"), text);
  std::vector<int> others;
  for (int r = 1; r < world->group_size(); ++r) others.push_back(r);
  fail_after_reports(dir, "freeze", others);  // rank 0 is frozen and would never exit
}

void suite_linger(const comm::BackendPtr& world, const std::string& dir) {
  {
    std::ofstream out(str_cat(dir, "/pid", world->group_rank(), ".txt"));
    out << ::getpid() << "\n";
  }
  world->barrier()->wait();
  // A rank that prints rarely: nothing tells it that its launcher is gone but the launcher's death itself.
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

void suite_await_go(const comm::BackendPtr& world, const std::string& dir) {
  write_report(str_cat(dir, "/pid", world->group_rank(), ".txt"), str_cat(::getpid(), "\n"));
  world->barrier()->wait();
  auto until = Clock::now() + std::chrono::seconds(60);
  while (!std::ifstream(dir + "/go").good() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the test's signal, polled with a deadline
  }
  at::Tensor x = at::full({4}, static_cast<float>(world->group_rank() + 1));
  world->all_reduce(x)->wait();
  const int n = world->group_size();
  check_equal("all_reduce after the go", x, at::full({4}, static_cast<float>(n * (n + 1) / 2)));
}

void suite_early_exit(const comm::BackendPtr& world, const std::string& dir) {
  const int me = world->group_rank(), last = world->group_size() - 1;
  world->barrier()->wait();
  if (me == last) return;  // leaves with code 0 while the others wait for it
  std::string text;
  at::Tensor x = at::ones({4});
  try {
    world->all_reduce(x)->wait();
    text = "completed\n";
  } catch (const std::exception& e) {
    text = str_cat("message ", e.what(), "\n");
  }
  write_report(str_cat(dir, "/early", me, ".txt"), text);
  std::vector<int> others;
  for (int r = 0; r < last; ++r) others.push_back(r);
  fail_after_reports(dir, "early", others);
}

void suite_cut_link(const comm::BackendPtr& world, const std::string& dir) {
  const int me = world->group_rank();
  at::Tensor x = at::ones({1024});
  world->all_reduce(x)->wait();
  write_report(str_cat(dir, "/ready", me, ".txt"), str_cat("ready ", ::getpid(), "\n"));
  std::ofstream out(str_cat(dir, "/cut", me, ".txt"));
  // One all_reduce every 50 ms (the pace of a training loop) until the link is cut and one fails.
  for (int i = 0; i < 1200; ++i) {
    auto t0 = Clock::now();
    try {
      world->all_reduce(x)->wait();
    } catch (const std::exception& e) {
      out << "elapsed_ms " << ms_since(t0) << "\nmessage " << e.what() << "\n";
      out.close();
      throw;  // leaves through main's ordinary exit path, as a training program would
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  out << "completed\n";
}

void suite_mismatch(const comm::BackendPtr& world, const std::string& dir, const std::string& which) {
  const int me = world->group_rank(), last = world->group_size() - 1;
  const bool odd = me == last;  // the rank that differs
  std::ofstream out(str_cat(dir, "/mismatch", me, ".txt"));
  try {
    if (which == "dtype") {  // same bytes, other dtype
      at::Tensor x = odd ? at::ones({4}, at::kInt) : at::ones({4}, at::kFloat);
      world->all_reduce(x)->wait();
    } else if (which == "count") {
      at::Tensor x = at::ones({odd ? 5 : 4});
      world->all_reduce(x)->wait();
    } else if (which == "op") {
      at::Tensor x = at::ones({4});
      world->all_reduce(x, {odd ? comm::ReduceOp::kMax : comm::ReduceOp::kSum})->wait();
    } else if (which == "root") {
      at::Tensor x = at::full({4}, static_cast<float>(me));
      world->broadcast(x, {odd ? 1 : 0})->wait();
    } else if (which == "skip") {  // the odd rank skips the first of two all_reduces
      at::Tensor a = at::ones({4}), b = at::ones({6});
      if (!odd) world->all_reduce(a)->wait();
      world->all_reduce(b)->wait();
    } else if (which == "gather-counts") {
      std::vector<int64_t> counts(world->group_size(), 2);
      if (odd) counts[0] = 3;
      at::Tensor in = at::ones({counts[me]}),
                 o = at::empty({std::accumulate(counts.begin(), counts.end(), 0L)});
      world->all_gather_v(o, in, counts)->wait();
    } else if (which == "mesh") {
      std::vector<int64_t> shape =
          odd ? std::vector<int64_t>{world->group_size()} : std::vector<int64_t>{2, world->group_size() / 2};
      std::vector<std::string> names =
          odd ? std::vector<std::string>{"dp"} : std::vector<std::string>{"dp", "tp"};
      mesh::DeviceMesh m(world, shape, names);
    } else {
      out << "unknown case " << which << "\n";
      return;
    }
    out << "completed\n";
  } catch (const std::exception& e) {
    out << "caught " << e.what() << "\n";
    ++g_checks;
  }
}

}  // namespace dtrain::test

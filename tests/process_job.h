// Running ranks and plain processes from a test, shared by the process and fault tiers: a job of
// tests/comm_worker ranks under the launcher (in this process), and one program as a child with its output in
// a file and a deadline after which it is killed.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/env.h"
#include "launch/launcher.h"
#include "tests/temp_dir.h"

namespace dtrain::test {

namespace fs = std::filesystem;

struct Job {
  int rc = -1;
  fs::path dir;
  double seconds = 0;
};

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `n` ranks of DTRAIN_COMM_WORKER running `suite`, started by the launcher with DTRAIN_TIMEOUT = `timeout`
// seconds and the extra environment `env` (set for the launcher and its ranks, removed afterwards).
inline Job run_worker(const std::string& backend, int n, const std::string& suite,
                      const std::string& timeout = "60",
                      const std::vector<std::pair<std::string, std::string>>& env = {}) {
  Job job;
  job.dir = temp_dir();
  dtrain::launch::LaunchOptions o;
  o.nproc = n;
  o.backend = backend;
  o.stop_grace = std::chrono::milliseconds(2000);
  o.command = {DTRAIN_COMM_WORKER, suite, job.dir.string()};
  setenv("DTRAIN_TIMEOUT", timeout.c_str(), 1);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  auto t0 = std::chrono::steady_clock::now();
  job.rc = dtrain::launch::run(o);
  for (const auto& [k, v] : env) unsetenv(k.c_str());
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return job;
}

// Every one of the job's `n` ranks reported success ("ok N", N > 0 checks) and the launcher returned 0; the
// job's folder is then removed.
inline void expect_all_ok(const Job& job, int n) {
  EXPECT_EQ(job.rc, 0);
  for (int r = 0; r < n; ++r) {
    std::string report = read_file(job.dir / ("rank" + std::to_string(r) + ".txt"));
    EXPECT_EQ(report.rfind("ok ", 0), 0u) << "rank " << r << " reported:\n" << report;
    EXPECT_GT(std::atoi(report.c_str() + 3), 0) << "rank " << r << " ran no checks";
  }
  fs::remove_all(job.dir);
}

// "gloo_3ranks": the test name suffix of a (backend, ranks) parameter.
inline std::string backend_ranks_name(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
}

// A TCP port on 127.0.0.1 that was free a moment ago (for a job's MASTER_PORT).
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A child process: started by spawn(), finished by finish().
struct Child {
  pid_t pid = -1;
  fs::path output;  // stdout and stderr
  std::chrono::steady_clock::time_point started;
};

struct Finished {
  int status = -1;  // wait status
  bool timed_out = false;
  double seconds = 0;
  std::string output;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

// Starts `argv` with this process's environment plus `env`, stdout and stderr to `output`.
inline Child spawn(const std::vector<std::string>& argv,
                   const std::vector<std::pair<std::string, std::string>>& env, const fs::path& output) {
  Child c;
  c.output = output;
  EnvMap merged = current_env();
  for (const auto& [k, v] : env) merged[k] = v;
  CStringArray envp(env_strings(merged)), args(argv);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  c.started = std::chrono::steady_clock::now();
  if (posix_spawnp(&c.pid, args.data()[0], &actions, nullptr, args.data(), envp.data()) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return c;
}

// Waits for `c` until `limit` after its start; past it, kills it (SIGKILL) and says so.
inline Finished finish(const Child& c, std::chrono::milliseconds limit) {
  Finished f;
  const auto deadline = c.started + limit;
  for (;;) {
    pid_t r = waitpid(c.pid, &f.status, WNOHANG);
    if (r == c.pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      f.timed_out = true;
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &f.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's exit, not a sync
  }
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.started).count();
  f.output = read_file(c.output);
  return f;
}

}  // namespace dtrain::test

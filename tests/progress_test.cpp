// The progress bar as a user reads it on a terminal: `dtrain run -n 2 -- dtrain train` on a pseudo-terminal,
// its output read as it comes. The bar's loss must be the global loss of a step at most about a second old
// (and say which step when it is not the current one), not the loss of the last logged step.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/env.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Bar {
  double at = 0;     // seconds after the start at which it was read
  long step = 0;     // the current step it shows
  long loss_of = 0;  // the step its loss belongs to
  double loss = 0;
};

struct TerminalRun {
  int status = -1;
  std::string output;
  std::vector<Bar> bars;
};

// Runs `argv` with its stdin, stdout and stderr on a new pseudo-terminal; reads the terminal until the
// program ends (killed past `limit`), noting when each bar was drawn.
TerminalRun run_on_terminal(const std::vector<std::string>& argv, std::chrono::seconds limit) {
  TerminalRun run;
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) return run;
  const std::string slave = ptsname(master);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd = 0; fd < 3; ++fd) posix_spawn_file_actions_addopen(&actions, fd, slave.c_str(), O_RDWR, 0);
  posix_spawn_file_actions_addclose(&actions, master);
  dtrain::EnvMap env = dtrain::current_env();
  env.erase("DTRAIN_PROGRESS");  // decided by the launcher: its stdout is a terminal
  dtrain::CStringArray envp(dtrain::env_strings(env)), args(argv);
  pid_t pid = -1;
  const auto t0 = Clock::now();
  if (posix_spawnp(&pid, args.data()[0], &actions, nullptr, args.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  if (pid < 0) return run;
  const std::regex bar(R"(\] step (\d+)/\d+  loss ([0-9.]+)(?: \(step (\d+)\))?)");
  std::string pending;
  char buf[4096];
  for (;;) {
    pollfd p{master, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    if (ready > 0) {
      const ssize_t n = ::read(master, buf, sizeof(buf));
      if (n <= 0) break;  // EIO: every holder of the terminal closed it
      pending.append(buf, static_cast<size_t>(n));
      run.output.append(buf, static_cast<size_t>(n));
      size_t end;
      while ((end = pending.find_first_of("\r\n")) != std::string::npos) {
        std::smatch m;
        const std::string line = pending.substr(0, end);
        if (std::regex_search(line, m, bar)) {
          const long step = std::stol(m[1]);
          run.bars.push_back({now, step, m[3].matched ? std::stol(m[3]) : step, std::stod(m[2])});
        }
        pending.erase(0, end + 1);
      }
    }
    if (now > static_cast<double>(limit.count())) {
      ::kill(pid, SIGKILL);
      break;
    }
    if (ready == 0 && ::waitpid(pid, &run.status, WNOHANG) == pid) {
      pid = -1;
      break;
    }
  }
  if (pid > 0) ::waitpid(pid, &run.status, 0);
  ::close(master);
  return run;
}

// Under dp the loss rides with the gradients (the bar shows each step's own); under zero1 it is gathered
// every half second or so, on steps every rank picks alike.
class ProgressBar : public ::testing::TestWithParam<std::string> {};

TEST_P(ProgressBar, ShowsALossFromTheLastSecond) {
  const TerminalRun run = run_on_terminal({DTRAIN_BINARY, "run", "-n", "2", "--", DTRAIN_BINARY, "train",
                                           "--strategy", GetParam(), "--steps", "150", "--log-every", "100"},
                                          std::chrono::seconds(240));
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << run.output;
  ASSERT_GT(run.bars.size(), 100u) << run.output;
  // When each step was first on the screen (the bar is drawn as each step ends).
  std::vector<double> shown_at(run.bars.back().step + 1, -1);
  for (const Bar& b : run.bars) {
    if (shown_at[b.step] < 0) shown_at[b.step] = b.at;
  }
  std::set<double> losses;
  for (const Bar& b : run.bars) {
    ASSERT_LE(b.loss_of, b.step);
    losses.insert(b.loss);
    if (b.step < 3 || shown_at[b.loss_of] < 0) continue;
    EXPECT_LT(b.at - shown_at[b.loss_of], 1.5) << "the bar at step " << b.step << " shows the loss of step "
                                               << b.loss_of << ", " << b.at - shown_at[b.loss_of] << " s old";
  }
  // Between the logged steps 1 and 100 the bar follows the training: many losses, falling.
  EXPECT_GT(losses.size(), 5u);
  EXPECT_LT(run.bars.back().loss, run.bars.front().loss);
  std::printf("%zu bars, %zu distinct losses, last: step %ld loss %.4f of step %ld\n", run.bars.size(),
              losses.size(), run.bars.back().step, run.bars.back().loss, run.bars.back().loss_of);
}

INSTANTIATE_TEST_SUITE_P(Strategies, ProgressBar, ::testing::Values("dp", "zero1"));

}  // namespace

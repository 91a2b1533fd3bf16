// A stand-in for a training program, used by launch_test as the rank that `dtrain run` starts (no libtorch,
// no gtest). Steps, in order, each optional:
//   --check-env       RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT present and
//   consistent,
//                     else exit 4; prints "env rank=R world=W local=L/LW master=A:P restart=K"
//   --print N         N lines "out R i" on stdout and "err R i" on stderr; at a clean exit "tail R" without a
//                     newline
//   --fail-first K    exit 3 while DTRAIN_RESTART_COUNT < K
//   --exit-code C     exit with C           } on the rank given by --on-rank R (every rank when absent)
//   --signal S        raise(S) (a number)   }
//   --hang            print "ready R pid P", then pause() until killed; --ignore-term also ignores SIGTERM
//   and SIGINT
// The rank is RANK, else OMPI_COMM_WORLD_RANK, else 0. Usage errors exit 2.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

int check_env() {
  const char* names[] = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT"};
  for (const char* n : names) {
    if (!std::getenv(n)) {
      std::fprintf(stderr, "fake_rank: %s is not set\n", n);
      return 4;
    }
  }
  const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
  const int local = env_int("LOCAL_RANK", -1), local_world = env_int("LOCAL_WORLD_SIZE", -1);
  const int port = env_int("MASTER_PORT", -1);
  const bool ok = world >= 1 && rank >= 0 && rank < world && local_world >= 1 && local >= 0 &&
                  local < local_world && world % local_world == 0 && rank % local_world == local &&
                  port > 0 && port < 65536 && std::strlen(env_or("MASTER_ADDR", "")) > 0;
  std::printf("env rank=%d world=%d local=%d/%d master=%s:%d restart=%s\n", rank, world, local, local_world,
              env_or("MASTER_ADDR", ""), port, env_or("DTRAIN_RESTART_COUNT", "?"));
  std::fflush(stdout);
  if (!ok) {
    std::fprintf(stderr, "fake_rank: inconsistent rank environment\n");
    return 4;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Safety net for the tests: if the launcher dies (a test deadline killed it), do not outlive it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 5;

  bool do_check_env = false, hang = false, ignore_term = false;
  int print = 0, fail_first = 0, exit_code = -1, sig = 0, on_rank = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fake_rank: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--check-env")
      do_check_env = true;
    else if (a == "--print")
      print = next();
    else if (a == "--fail-first")
      fail_first = next();
    else if (a == "--exit-code")
      exit_code = next();
    else if (a == "--signal")
      sig = next();
    else if (a == "--on-rank")
      on_rank = next();
    else if (a == "--hang")
      hang = true;
    else if (a == "--ignore-term")
      ignore_term = true;
    else {
      std::fprintf(stderr, "fake_rank: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int rank = env_int("RANK", env_int("OMPI_COMM_WORLD_RANK", 0));
  const bool selected = on_rank < 0 || on_rank == rank;

  if (do_check_env) {
    if (int rc = check_env(); rc != 0) return rc;
  }
  for (int i = 0; i < print; ++i) {
    std::printf("out %d %d\n", rank, i);
    std::fprintf(stderr, "err %d %d\n", rank, i);
  }
  std::fflush(stdout);
  if (selected && env_int("DTRAIN_RESTART_COUNT", 0) < fail_first) {
    std::fprintf(stderr, "failing at restart %d\n", env_int("DTRAIN_RESTART_COUNT", 0));
    return 3;
  }
  if (selected && exit_code >= 0) return exit_code;
  if (selected && sig > 0) raise(sig);
  if (hang) {
    if (ignore_term) {
      signal(SIGTERM, SIG_IGN);
      signal(SIGINT, SIG_IGN);
    }
    std::printf("ready %d pid %d\n", rank, static_cast<int>(getpid()));
    std::fflush(stdout);
    while (true) pause();
  }
  if (print > 0) std::printf("tail %d", rank);  // a partial last line, flushed at exit
  return 0;
}

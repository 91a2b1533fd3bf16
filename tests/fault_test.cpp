// Fault tier (CTest label `fault`, `ctest -L fault`): the ways a job can hang, admit a stranger or compute a
// wrong result without an error, each on real ranks. Every case must end, on every surviving rank, within the
// timeout + 5 s with an error that names the cause: a frozen rank 0 (the store's host), a master port that
// accepts but never answers, a refused or unresolvable master, a killed launcher, a process without the job's
// secret, two claims to one rank, another world size, and ranks that disagree on a collective or a mesh.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <functional>
#include <map>
#include <tuple>

#include "tests/process_job.h"

namespace {

using namespace dtrain::test;
using namespace std::chrono_literals;

constexpr double kSlack = 5.0;  // seconds past the timeout within which every failure must be reported

// A listening socket on 127.0.0.1 that never accepts: connections complete in the kernel's backlog and then
// nothing answers (a frozen host, or a port some other program holds).
struct SilentPort {
  int fd = -1;
  int port = 0;
  SilentPort() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd, 16);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~SilentPort() { close(fd); }
};

// An IPv4 address of this host other than loopback ("" if it has none).
std::string other_ipv4() {
  ifaddrs* ifs = nullptr;
  std::string found;
  if (getifaddrs(&ifs) != 0) return found;
  for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  freeifaddrs(ifs);
  return found;
}

// Whether a TCP connection to ip:port is accepted.
bool accepts(const std::string& ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A single-host job's store is reachable on loopback only.
void expect_loopback_only(int port) {
  EXPECT_TRUE(accepts("127.0.0.1", port));
  if (std::string ip = other_ipv4(); !ip.empty()) {
    EXPECT_FALSE(accepts(ip, port)) << ip << ":" << port;
  }
}

int closed_port() {
  SilentPort p;
  return p.port;  // closed again when p goes
}

// One rank of a 2-rank gloo job started by hand, against MASTER_ADDR:MASTER_PORT, with DTRAIN_TIMEOUT 3 s.
Finished lone_rank(const std::string& addr, int port, const fs::path& dir) {
  Child c = spawn({DTRAIN_COMM_WORKER, "collectives", dir.string()},
                  {{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", addr},
                   {"MASTER_PORT", std::to_string(port)},
                   {"DTRAIN_BACKEND", "gloo"},
                   {"DTRAIN_TIMEOUT", "3"}},
                  dir / "lone.txt");
  return finish(c, 30s);
}

class Fault : public ::testing::TestWithParam<std::string> {};

// Rank 0, which hosts the store, stops (SIGSTOP) while the others wait in a collective: they must not hang in
// the store's diagnosis, and their error says that the store's host did not answer.
TEST_P(Fault, FrozenRankZeroIsReportedWithinTheTimeout) {
  const double timeout = 4;
  Job job = run_worker(GetParam(), 3, "freeze", "4");
  EXPECT_NE(job.rc, 0);
  EXPECT_LT(job.seconds, timeout + kSlack + 2 /* stop grace */ + 3 /* start-up */);
  for (int r = 1; r < 3; ++r) {
    std::string report = read_file(job.dir / ("freeze" + std::to_string(r) + ".txt"));
    ASSERT_EQ(report.rfind("elapsed_ms ", 0), 0u) << "rank " << r << ": " << report;
    EXPECT_LT(std::atol(report.c_str() + 11), (timeout + kSlack) * 1000) << report;
    EXPECT_NE(report.find("the job's store at 127.0.0.1:"), std::string::npos) << report;
    EXPECT_NE(report.find("did not answer"), std::string::npos) << report;
    EXPECT_NE(report.find("all_reduce (seq 2"), std::string::npos) << report;
  }
  fs::remove_all(job.dir);
}

// `dtrain run` is killed (SIGKILL): every rank it started dies with it, mpirun's too. A single-node store
// listens on loopback only.
TEST_P(Fault, RanksDieWithTheirLauncher) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1),
            0);  // orphaned ranks become our children: reap them, no zombies
  fs::path dir = temp_dir();
  Child launcher = spawn({DTRAIN_BINARY, "run", "-n", "2", "--backend", GetParam(), "--", DTRAIN_COMM_WORKER,
                          "linger", dir.string()},
                         {{"DTRAIN_TIMEOUT", "60"}}, dir / "launcher.txt");
  std::vector<pid_t> ranks;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (ranks.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    ranks.clear();
    for (int r = 0; r < 2; ++r) {
      std::string pid = read_file(dir / ("pid" + std::to_string(r) + ".txt"));
      if (!pid.empty() && pid.back() == '\n') ranks.push_back(std::atoi(pid.c_str()));
    }
    std::this_thread::sleep_for(50ms);  // polling for the ranks' pid files
  }
  ASSERT_EQ(ranks.size(), 2u) << read_file(dir / "launcher.txt");
  kill(launcher.pid, SIGKILL);
  waitpid(launcher.pid, nullptr, 0);
  auto killed = std::chrono::steady_clock::now();
  auto alive = [](pid_t p) {
    int st;
    waitpid(p, &st, WNOHANG);  // reaps it if it is our (adopted) zombie
    return kill(p, 0) == 0;
  };
  while ((alive(ranks[0]) || alive(ranks[1])) && std::chrono::steady_clock::now() < killed + 10s) {
    std::this_thread::sleep_for(20ms);  // polling for the ranks' exit
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_FALSE(alive(ranks[0]) || alive(ranks[1])) << "ranks outlived their launcher by " << took << " s";
  EXPECT_LT(took, kSlack);
  while (waitpid(-1, nullptr, WNOHANG) > 0) {  // mpirun, if it was adopted
  }
  fs::remove_all(dir);
}

// Two ranks disagree on a collective: every rank raises an error naming the rank that differs and what
// differs, instead of an abort (gloo) or a wrong result with exit code 0.
TEST_P(Fault, RanksThatDisagreeOnACollectiveAreNamed) {
  const std::map<std::string, std::string> cases{
      {"dtype", "disagree on the dtype: rank 2 passed Int where ranks 0, 1 passed Float"},
      {"count", "disagree on the element count: rank 2 passed 5 elements where ranks 0, 1 passed 4"},
      {"op", "disagree on the reduce op: rank 2 passed max where ranks 0, 1 passed sum"},
      {"root", "disagree on the root: rank 2 passed root 1 where ranks 0, 1 passed root 0"},
      {"skip", "disagree on the element count: rank 2 passed 6 elements where ranks 0, 1 passed 4"},
      {"gather-counts", "disagree on the element count: rank 2 passed 7 elements where ranks 0, 1 passed 6"},
  };
  for (const auto& [which, needle] : cases) {
    Job job = run_worker(GetParam(), 3, "mismatch-" + which, "20");
    EXPECT_LT(job.seconds, 20) << which;
    for (int r = 0; r < 3; ++r) {
      std::string report = read_file(job.dir / ("mismatch" + std::to_string(r) + ".txt"));
      EXPECT_EQ(report.rfind("caught ", 0), 0u) << which << ", rank " << r << ": " << report;
      EXPECT_NE(report.find(needle), std::string::npos) << which << ", rank " << r << ": " << report;
    }
    fs::remove_all(job.dir);
  }
  if (GetParam() == "gloo") {
    // The same check through Gloo's all_gather (what a group spanning several hosts uses).
    for (const std::string which : {"count", "dtype"}) {
      Job job = run_worker("gloo", 3, "mismatch-" + which, "20", {{"DTRAIN_GLOO_AGREEMENT", "engine"}});
      EXPECT_LT(job.seconds, 20) << which;
      for (int r = 0; r < 3; ++r) {
        std::string report = read_file(job.dir / ("mismatch" + std::to_string(r) + ".txt"));
        EXPECT_NE(report.find(cases.at(which)), std::string::npos)
            << which << ", engine, rank " << r << ": " << report;
      }
      fs::remove_all(job.dir);
    }
  }
  // Ranks that build different meshes (4 ranks: rank 3 a 1-d mesh, the others 2 x 2).
  Job job = run_worker(GetParam(), 4, "mismatch-mesh", "20");
  for (int r = 0; r < 4; ++r) {
    std::string report = read_file(job.dir / ("mismatch" + std::to_string(r) + ".txt"));
    EXPECT_NE(
        report.find("the ranks build different meshes: rank 3 builds shape (4) but rank 0 builds (2, 2)"),
        std::string::npos)
        << "rank " << r << ": " << report;
  }
  fs::remove_all(job.dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, Fault, ::testing::Values("gloo", "mpi"));

// A port that accepts connections but never answers, a refused port, an unresolvable master: a starting rank
// gives up within the timeout (3 s) with an error that names the address, never hangs.
TEST(FaultRendezvous, SilentRefusedAndUnresolvableMastersEndWithinTheTimeout) {
  fs::path dir = temp_dir();
  SilentPort silent;
  Finished f = lone_rank("127.0.0.1", silent.port, dir);
  EXPECT_FALSE(f.timed_out) << f.output;
  EXPECT_NE(f.exit_code(), 0);
  EXPECT_LT(f.seconds, 3 + kSlack) << f.output;
  EXPECT_NE(f.output.find("127.0.0.1:" + std::to_string(silent.port)), std::string::npos) << f.output;
  EXPECT_NE(f.output.find("did not "), std::string::npos) << f.output;

  const int refused = closed_port();
  f = lone_rank("127.0.0.1", refused, dir);
  EXPECT_FALSE(f.timed_out) << f.output;
  EXPECT_LT(f.seconds, 3 + kSlack) << f.output;
  EXPECT_NE(f.output.find("127.0.0.1:" + std::to_string(refused)), std::string::npos) << f.output;

  f = lone_rank("no-such-host.invalid", 29999, dir);
  EXPECT_FALSE(f.timed_out) << f.output;
  EXPECT_LT(f.seconds, 3 + kSlack) << f.output;
  EXPECT_NE(f.output.find("MASTER_ADDR 'no-such-host.invalid' does not resolve"), std::string::npos)
      << f.output;
  fs::remove_all(dir);
}

// The environment of a hand-started gloo rank of a 2-rank job on MASTER_PORT `port`.
std::vector<std::pair<std::string, std::string>> rank_env(int rank, int port, const std::string& secret) {
  std::vector<std::pair<std::string, std::string>> env{{"RANK", std::to_string(rank)},
                                                       {"WORLD_SIZE", "2"},
                                                       {"LOCAL_WORLD_SIZE", "2"},
                                                       {"MASTER_ADDR", "127.0.0.1"},
                                                       {"MASTER_PORT", std::to_string(port)},
                                                       {"DTRAIN_BACKEND", "gloo"},
                                                       {"DTRAIN_TIMEOUT", "20"}};
  if (!secret.empty()) env.emplace_back("DTRAIN_JOB_SECRET", secret);
  return env;
}

// A process without the job's secret claims rank 1 first, while rank 0 waits for its ranks: it is refused
// (both sides say so), and the real rank 1 then joins and the job computes the right results.
TEST(FaultRendezvous, StrangerFirstIsRefusedAndTheJobGoesOn) {
  fs::path dir = temp_dir();
  for (const char* sub : {"stranger", "r0", "r1"}) fs::create_directories(dir / sub);
  const int port = closed_port();
  Child stranger = spawn({DTRAIN_COMM_WORKER, "collectives", (dir / "stranger").string()},
                         rank_env(1, port, ""), dir / "stranger.txt");
  Child rank0 = spawn({DTRAIN_COMM_WORKER, "collectives", (dir / "r0").string()},
                      rank_env(0, port, "job-s3cret"), dir / "rank0.txt");
  Finished s = finish(stranger, 30s);
  Child rank1 = spawn({DTRAIN_COMM_WORKER, "collectives", (dir / "r1").string()},
                      rank_env(1, port, "job-s3cret"), dir / "rank1.txt");
  Finished r0 = finish(rank0, 60s), r1 = finish(rank1, 60s);
  EXPECT_NE(s.exit_code(), 0) << s.output;
  EXPECT_NE(s.output.find("rank 0 refused this process: it does not prove the job's secret"),
            std::string::npos)
      << s.output;
  EXPECT_NE(s.output.find("This process has no job secret"), std::string::npos) << s.output;
  EXPECT_NE(r0.output.find("refused a process claiming rank 1"), std::string::npos) << r0.output;
  EXPECT_EQ(r0.exit_code(), 0) << r0.output;
  EXPECT_EQ(r1.exit_code(), 0) << r1.output;
  EXPECT_EQ(read_file(dir / "r0" / "rank0.txt").rfind("ok ", 0), 0u);
  EXPECT_EQ(read_file(dir / "r1" / "rank1.txt").rfind("ok ", 0), 0u);
  fs::remove_all(dir);
}

// Starts `dtrain run -n 2 <launcher_args> -- comm_worker await-go`, waits until its ranks run, finds the
// store's port with `port_of` (given the job's output so far), checks that the store listens on loopback
// only, sends a process without the secret claiming rank 1 to it, then lets the job finish: the stranger is
// refused (both sides say so) and the job's results are right.
void expect_stranger_refused_while_running(std::vector<std::string> launcher_args,
                                           const std::vector<std::pair<std::string, std::string>>& env,
                                           const std::function<int(const std::string&)>& port_of) {
  fs::path dir = temp_dir(), stranger_dir = dir / "stranger";
  fs::create_directories(stranger_dir);
  std::vector<std::string> argv{DTRAIN_BINARY, "run", "-n", "2"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  for (const char* a : {"--", DTRAIN_COMM_WORKER, "await-go"}) argv.push_back(a);
  argv.push_back(dir.string());
  Child job = spawn(argv, env, dir / "job.txt");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!(fs::exists(dir / "pid0.txt") && fs::exists(dir / "pid1.txt")) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);  // polling for the job's ranks to be admitted and running
  }
  const int port = port_of(read_file(dir / "job.txt"));
  ASSERT_GT(port, 0) << read_file(dir / "job.txt");
  expect_loopback_only(port);
  Finished s = finish(spawn({DTRAIN_COMM_WORKER, "collectives", stranger_dir.string()}, rank_env(1, port, ""),
                            dir / "stranger.txt"),
                      30s);
  std::ofstream(dir / "go") << "go\n";
  Finished j = finish(job, 60s);
  EXPECT_NE(s.exit_code(), 0) << s.output;
  EXPECT_NE(s.output.find("rank 0 refused this process: it does not prove the job's secret"),
            std::string::npos)
      << s.output;
  EXPECT_NE(j.output.find("refused a process claiming rank 1"), std::string::npos) << j.output;
  EXPECT_EQ(j.exit_code(), 0) << j.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(read_file(dir / ("rank" + std::to_string(r) + ".txt")).rfind("ok ", 0), 0u) << j.output;
  }
  fs::remove_all(dir);
}

// A stranger arriving while a `dtrain run` job is running (every rank admitted) is refused too, and the job
// is unaffected.
TEST(FaultRendezvous, LateStrangerIsRefusedWhileTheJobRuns) {
  const int port = closed_port();
  expect_stranger_refused_while_running({"--master-port", std::to_string(port)}, {{"DTRAIN_TIMEOUT", "30"}},
                                        [port](const std::string&) { return port; });
}

// The mpi backend's store gets the same treatment: a process that finds its port (here from rank 0's debug
// log) and claims rank 1 without the job's secret is refused, and the job is unaffected.
TEST(FaultRendezvous, StrangerAtTheMpiStoreIsRefused) {
  expect_stranger_refused_while_running(
      {"--backend", "mpi"}, {{"DTRAIN_TIMEOUT", "30"}, {"DTRAIN_LOG_LEVEL", "debug"}},
      [](const std::string& log) {
        const std::string marker = "the job's store listens on 127.0.0.1, port ";
        auto at = log.find(marker);
        return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + marker.size());
      });
}

// One host, but a routable MASTER_ADDR (an address of this host other than loopback): the store serves it.
TEST(FaultRendezvous, RoutableMasterAddressOnOneHostIsServed) {
  const std::string ip = other_ipv4();
  if (ip.empty()) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  fs::path dir = temp_dir();
  Finished j = finish(spawn({DTRAIN_BINARY, "run", "-n", "2", "--master-addr", ip, "--", DTRAIN_COMM_WORKER,
                             "collectives", dir.string()},
                            {{"DTRAIN_TIMEOUT", "20"}}, dir / "job.txt"),
                      60s);
  EXPECT_EQ(j.exit_code(), 0) << j.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(read_file(dir / ("rank" + std::to_string(r) + ".txt")).rfind("ok ", 0), 0u) << j.output;
  }
  fs::remove_all(dir);
}

// Processes that hold the secret but collide: two claim rank 1 (a world of 3, so rank 0 sees both claims), or
// one claims another world size. Every process stops with an error naming both claimants.
TEST(FaultRendezvous, DuplicateRankAndWrongWorldSizeStopTheJob) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> ranks;  // (RANK, WORLD_SIZE) per process
    std::string needle;
  };
  const std::vector<Case> cases{
      {{{"0", "3"}, {"1", "3"}, {"1", "3"}}, "rank 1 was claimed twice: by pid "},
      {{{"0", "2"}, {"1", "3"}}, "rank 1 (pid "},
  };
  for (const auto& c : cases) {
    fs::path dir = temp_dir();
    const int port = closed_port();
    std::vector<Child> children;
    for (size_t i = 0; i < c.ranks.size(); ++i) {
      children.push_back(spawn({DTRAIN_COMM_WORKER, "collectives", (dir / std::to_string(i)).string()},
                               {{"RANK", c.ranks[i].first},
                                {"WORLD_SIZE", c.ranks[i].second},
                                {"LOCAL_WORLD_SIZE", c.ranks[i].second},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", std::to_string(port)},
                                {"DTRAIN_BACKEND", "gloo"},
                                {"DTRAIN_JOB_SECRET", "shared-by-all"},
                                {"DTRAIN_TIMEOUT", "10"}},
                               dir / ("out" + std::to_string(i) + ".txt")));
    }
    for (auto& child : children) {
      Finished f = finish(child, 30s);
      EXPECT_FALSE(f.timed_out) << f.output;
      EXPECT_LT(f.seconds, 10 + kSlack) << f.output;
      EXPECT_NE(f.exit_code(), 0) << f.output;
      EXPECT_NE(f.output.find(c.needle), std::string::npos) << f.output;
      if (c.ranks.size() == 2) {
        EXPECT_NE(f.output.find("says the world size is 3 but rank 0"), std::string::npos);
      }
    }
    fs::remove_all(dir);
  }
}

// A rank that leaves early (exit code 0) while the others wait: the others' error names it and only it, and
// the launcher says that it left first.
TEST(FaultDiagnosis, TheRankThatLeftFirstIsNamed) {
  fs::path dir = temp_dir();
  Child job = spawn({DTRAIN_BINARY, "run", "-n", "3", "--", DTRAIN_COMM_WORKER, "early-exit", dir.string()},
                    {{"DTRAIN_TIMEOUT", "10"}}, dir / "job.txt");
  Finished j = finish(job, 60s);
  EXPECT_NE(j.exit_code(), 0);
  EXPECT_NE(j.output.find(") had already exited with code 0"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("dtrain run: rank 2 (pid "), std::string::npos) << j.output;
  for (int r = 0; r < 2; ++r) {
    std::string report = read_file(dir / ("early" + std::to_string(r) + ".txt"));
    EXPECT_NE(report.find("Rank 2 has not entered it"), std::string::npos)
        << "rank " << r << ": " << report << j.output;
    EXPECT_EQ(report.find("Rank " + std::to_string(1 - r) + " has not entered it"), std::string::npos)
        << "rank " << r << ": " << report;
  }
  fs::remove_all(dir);
}

// Two hosts: network namespaces joined by a veth pair (the test machines run as root), 10.77.0.1 and
// 10.77.0.2. Removed, with every process still inside, when the test ends.
struct TwoHosts {
  std::string tag = std::to_string(getpid() % 100000);
  std::string ns[2] = {"dta" + tag, "dtb" + tag};
  std::string dev[2] = {"va" + tag, "vb" + tag};
  std::string ip[2] = {"10.77.0.1", "10.77.0.2"};
  bool made = false;

  static int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }
  bool make() {
    if (sh("ip netns add " + ns[0]) != 0) return false;
    made = true;
    bool ok = sh("ip netns add " + ns[1]) == 0 &&
              sh("ip link add " + dev[0] + " type veth peer name " + dev[1]) == 0;
    for (int h = 0; h < 2 && ok; ++h) {
      ok = sh("ip link set " + dev[h] + " netns " + ns[h]) == 0 &&
           sh(in(h, "ip addr add " + ip[h] + "/24 dev " + dev[h])) == 0 &&
           sh(in(h, "ip link set " + dev[h] + " up")) == 0 && sh(in(h, "ip link set lo up")) == 0;
    }
    return ok;
  }
  std::string in(int h, const std::string& cmd) const { return "ip netns exec " + ns[h] + " " + cmd; }
  int cut() const { return sh(in(1, "ip link set " + dev[1] + " down")); }
  ~TwoHosts() {
    if (!made) return;
    for (const auto& n : ns) {
      sh("ip netns pids " + n + " | xargs -r kill -9");
      sh("ip netns del " + n);
    }
  }
};

// Waits until each rank wrote `ready<rank>.txt` ("ready PID"); returns the pids (0 where none came).
std::vector<pid_t> await_ready(const fs::path& dir, int n) {
  std::vector<pid_t> pids(n, 0);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (int r = 0; r < n; ++r) {
    while (std::chrono::steady_clock::now() < deadline) {
      std::string text = read_file(dir / ("ready" + std::to_string(r) + ".txt"));
      if (text.find('\n') != std::string::npos) {
        pids[r] = std::atoi(text.c_str() + 6);
        break;
      }
      std::this_thread::sleep_for(20ms);  // polling for the rank to be in its loop
    }
  }
  return pids;
}

// Whether a process has ended (gone, or a zombie its parent has not reaped yet).
bool ended(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return stat.empty() || (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z');
}

// Checks each rank's report of the cut (written when its failing op threw, then it left through main): the
// op failed within the timeout + 5 s, the process ended within that time of the cut, and rank 1 (the host
// without the store) named the store.
void expect_cut_reported(const fs::path& dir, const std::vector<pid_t>& pids,
                         std::chrono::steady_clock::time_point cut_at) {
  const auto deadline = cut_at + std::chrono::duration<double>(3 + kSlack);
  for (int r = 0; r < 2; ++r) {
    while (!ended(pids[r]) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);  // polling: the ranks are not this process's children under mpirun
    }
    EXPECT_TRUE(ended(pids[r])) << "rank " << r << " (pid " << pids[r] << ") still runs 8 s after the cut";
    std::string report = read_file(dir / ("cut" + std::to_string(r) + ".txt"));
    ASSERT_EQ(report.rfind("elapsed_ms ", 0), 0u) << "rank " << r << ": " << report;
    EXPECT_LT(std::atol(report.c_str() + 11), (3 + kSlack) * 1000) << report;
    std::printf("rank %d: %s", r, report.c_str());  // what a user would read
  }
  EXPECT_NE(read_file(dir / "cut1.txt").find("the job's store at 10.77.0.1:"), std::string::npos)
      << read_file(dir / "cut1.txt");
}

// Rank 0 on one host, rank 1 on the other, gloo; the link is cut mid-run. Both ranks, the one without the
// store included, report the failure within the timeout + 5 s and exit.
TEST(FaultNetwork, CutLinkBetweenTwoHostsEndsBothRanks) {
  TwoHosts hosts;
  if (!hosts.make()) GTEST_SKIP() << "cannot create network namespaces here (needs root)";
  fs::path dir = temp_dir();
  std::vector<Child> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(spawn({"ip", "netns", "exec", hosts.ns[r], DTRAIN_COMM_WORKER, "cut-link", dir.string()},
                          {{"RANK", std::to_string(r)},
                           {"WORLD_SIZE", "2"},
                           {"LOCAL_WORLD_SIZE", "1"},
                           {"MASTER_ADDR", hosts.ip[0]},
                           {"MASTER_PORT", "29517"},
                           {"GLOO_SOCKET_IFNAME", hosts.dev[r]},
                           {"DTRAIN_BACKEND", "gloo"},
                           {"DTRAIN_JOB_SECRET", "two-hosts"},
                           {"DTRAIN_TIMEOUT", "3"}},
                          dir / ("out" + std::to_string(r) + ".txt")));
  }
  auto pids = await_ready(dir, 2);
  ASSERT_EQ(hosts.cut(), 0);
  expect_cut_reported(dir, pids, std::chrono::steady_clock::now());
  for (int r = 0; r < 2; ++r) {
    Finished f = finish(ranks[r], 10s);
    EXPECT_FALSE(f.timed_out) << "rank " << r << " did not exit: " << f.output;
  }
  fs::remove_all(dir);
}

// The same under mpi, started as a multi-host MPI job is: mpirun on the first host reaches the second
// through an ssh stand-in that enters its namespace, and the ranks talk over TCP between the hosts. Both
// ranks report and exit within the timeout + 5 s. (mpirun itself then waits for its daemon across the cut
// link, as OpenMPI does; the test ends it.)
TEST(FaultNetwork, CutLinkBetweenTwoHostsEndsBothRanksUnderMpi) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun is not on PATH";
  TwoHosts hosts;
  if (!hosts.make()) GTEST_SKIP() << "cannot create network namespaces here (needs root)";
  fs::path dir = temp_dir();
  {
    std::ofstream agent(dir / "agent.sh");
    agent << "#!/bin/sh\n# ssh stand-in: agent [options] HOST COMMAND; runs COMMAND in HOST's namespace\n"
          << "while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n"
          << "host=$1; shift\nexec ip netns exec \"$(cat \"$(dirname \"$0\")/ns-$host\")\" sh -c \"$*\"\n";
    std::ofstream(dir / "hosts") << hosts.ip[0] << " slots=1\n" << hosts.ip[1] << " slots=1\n";
    for (int h = 0; h < 2; ++h) std::ofstream(dir / ("ns-" + hosts.ip[h])) << hosts.ns[h] << "\n";
  }
  fs::permissions(dir / "agent.sh", fs::perms::owner_all);
  const std::string net = "10.77.0.0/24";
  Child mpirun = spawn({"ip",
                        "netns",
                        "exec",
                        hosts.ns[0],
                        "mpirun",
                        "--allow-run-as-root",
                        "-np",
                        "2",
                        "--hostfile",
                        (dir / "hosts").string(),
                        "--mca",
                        "plm_rsh_agent",
                        (dir / "agent.sh").string(),
                        "--mca",
                        "pml",
                        "ob1",
                        "--mca",
                        "btl",
                        "tcp,self",
                        "--mca",
                        "btl_tcp_if_include",
                        net,
                        "--mca",
                        "oob_tcp_if_include",
                        net,
                        "-x",
                        "DTRAIN_BACKEND=mpi",
                        "-x",
                        "MASTER_ADDR=" + hosts.ip[0],
                        "-x",
                        "DTRAIN_TIMEOUT=3",
                        "-x",
                        "OMP_NUM_THREADS=1",
                        DTRAIN_COMM_WORKER,
                        "cut-link",
                        dir.string()},
                       {}, dir / "mpirun.txt");
  auto pids = await_ready(dir, 2);
  ASSERT_TRUE(pids[0] > 0 && pids[1] > 0) << read_file(dir / "mpirun.txt");
  ASSERT_EQ(hosts.cut(), 0);
  expect_cut_reported(dir, pids, std::chrono::steady_clock::now());
  ::kill(mpirun.pid, SIGKILL);
  finish(mpirun, 10s);
  fs::remove_all(dir);
}

// A second node without the job's secret is refused by its own launcher, before any rank starts.
TEST(FaultRendezvous, SecondNodeWithoutTheSecretIsToldHowToGetIt) {
  fs::path dir = temp_dir();
  Child node1 = spawn({DTRAIN_BINARY, "run", "-n", "1", "--nnodes", "2", "--node-rank", "1", "--master-port",
                       "29999", "--", "true"},
                      {}, dir / "node1.txt");
  Finished f = finish(node1, 20s);
  EXPECT_EQ(f.exit_code(), 2) << f.output;
  EXPECT_NE(f.output.find("has no job secret"), std::string::npos) << f.output;
  EXPECT_NE(f.output.find("DTRAIN_JOB_SECRET_FILE"), std::string::npos) << f.output;
  fs::remove_all(dir);
}

}  // namespace

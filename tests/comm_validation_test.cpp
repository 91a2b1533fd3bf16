// Pure tier for comm: argument checks and their messages on a one-rank gloo group (no other process needed),
// and backend choice from the environment.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "comm/detail/agreement.h"
#include "comm/detail/job_store.h"
#include "comm/factory.h"
#include "comm/gloo/gloo_backend.h"
#include "core/error.h"

using namespace dtrain;

namespace {

comm::BackendPtr single() {
  static comm::BackendPtr b = comm::create_backend("gloo", RankInfo{}, std::chrono::seconds(10));
  return b;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CommValidation, SingleRankCollectivesAreIdentity) {
  auto b = single();
  at::Tensor x = at::arange(5, at::kFloat);
  b->all_reduce(x, {comm::ReduceOp::kAvg})->wait();
  EXPECT_TRUE(at::equal(x, at::arange(5, at::kFloat)));
  at::Tensor out = at::empty({5});
  b->all_gather(out, at::arange(5, at::kFloat))->wait();
  EXPECT_TRUE(at::equal(out, at::arange(5, at::kFloat)));
}

TEST(CommValidation, MessagesNameTheValueAndTheFix) {
  auto b = single();
  at::Tensor i = at::ones({4}, at::kInt);
  EXPECT_NE(error_of([&] { b->all_reduce(i, {comm::ReduceOp::kAvg}); }).find("avg on Int would truncate"),
            std::string::npos);
  at::Tensor u8 = at::ones({4}, at::kByte);
  EXPECT_NE(error_of([&] { b->all_reduce(u8); }).find("has dtype Byte; supported are"), std::string::npos);
  at::Tensor out = at::empty({3});
  EXPECT_NE(error_of([&] { b->all_gather(out, at::ones({4})); }).find("output has 3 elements but needs 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              b->all_gather_v(out, at::ones({3}), {3, 1});
            }).find("counts has 2 entries but the group has 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { b->all_gather_v(out, at::ones({3}), {-1}); }).find("counts[0] = -1 is negative"),
            std::string::npos);
  at::Tensor d = at::ones({3}, at::kDouble);
  EXPECT_NE(
      error_of([&] { b->all_gather(out, d); }).find("output dtype Float differs from input dtype Double"),
      std::string::npos);
  EXPECT_NE(error_of([&] { b->send(out, 0); }).find("dst 0 is not another rank of this group"),
            std::string::npos);
  at::Tensor x = at::ones({2});
  EXPECT_NE(error_of([&] { b->broadcast(x, {3}); }).find("root 3 is outside the group (0..0)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              b->all_reduce(x, {comm::ReduceOp::kSum, std::chrono::milliseconds(0)});
            }).find("timeout 0 ms is not positive"),
            std::string::npos);
}

TEST(CommValidation, UnknownAndUnbuiltBackends) {
  EXPECT_NE(error_of([] {
              comm::create_backend("tcp", RankInfo{}, std::chrono::seconds(1));
            }).find("backend 'tcp' is unknown. Use one of: gloo, mpi, nccl."),
            std::string::npos);
  EXPECT_NE(
      error_of([] { comm::create_backend("nccl", RankInfo{}, std::chrono::seconds(1)); }).find("has no NCCL"),
      std::string::npos);
}

TEST(CommValidation, ChooseBackend) {
  RankInfo none;
  EXPECT_EQ(comm::choose_backend("", none, {}), "gloo");
  EXPECT_EQ(comm::choose_backend("mpi", none, {}), "mpi");
  EXPECT_EQ(comm::choose_backend("", none, {{"DTRAIN_BACKEND", "mpi"}}), "mpi");
  RankInfo mpirun;
  mpirun.launcher = Launcher::kMpirun;
  EXPECT_EQ(comm::choose_backend("", mpirun, {}), "mpi");
  mpirun.master_addr = "10.0.0.1";
  EXPECT_EQ(comm::choose_backend("", mpirun, {}), "gloo");
}

// A multi-host job whose host name resolves to loopback would advertise 127.x to the other hosts: refused
// with the variable to set; a single-host job, or one with GLOO_SOCKET_IFNAME, is fine.
TEST(CommValidation, LoopbackAdvertisedToOtherHostsIsRefused) {
  EnvMap multi{{"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}};
  std::string problem = comm::loopback_advertise_problem(multi, "localhost");
  EXPECT_NE(problem.find("a loopback address"), std::string::npos) << problem;
  EXPECT_NE(problem.find("Set GLOO_SOCKET_IFNAME"), std::string::npos) << problem;
  EnvMap with_ifname = multi;
  with_ifname["GLOO_SOCKET_IFNAME"] = "eth0";
  EXPECT_EQ(comm::loopback_advertise_problem(with_ifname, "localhost"), "");
  EnvMap single_host{{"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"}};
  EXPECT_EQ(comm::loopback_advertise_problem(single_host, "localhost"), "");
  EXPECT_TRUE(comm::single_host_job({{"MASTER_ADDR", "127.0.0.1"}}));
  EXPECT_FALSE(comm::single_host_job(multi));
}

TEST(CommValidation, JobSecretFromTheEnvironmentOrAPrivateFile) {
  EXPECT_EQ(comm::job_secret_from_env({{"DTRAIN_JOB_SECRET", "abc"}}), "abc");
  EXPECT_EQ(comm::job_secret_from_env({}), "");
  char tmpl[] = "/tmp/dtrain_secret_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "s3cret\n", 7), 7);
  close(fd);
  chmod(tmpl, 0644);
  EXPECT_NE(error_of([&] {
              comm::job_secret_from_env({{"DTRAIN_JOB_SECRET_FILE", tmpl}});
            }).find("can be read by other users (mode 644). Run `chmod 600"),
            std::string::npos);
  chmod(tmpl, 0600);
  EXPECT_EQ(comm::job_secret_from_env({{"DTRAIN_JOB_SECRET_FILE", tmpl}}), "s3cret");
  std::remove(tmpl);
  EXPECT_NE(error_of([&] {
              comm::job_secret_from_env({{"DTRAIN_JOB_SECRET_FILE", tmpl}});
            }).find("is not a readable file"),
            std::string::npos);
  EXPECT_EQ(comm::random_secret().size(), 64u);
  EXPECT_NE(comm::random_secret(), comm::random_secret());
}

// The agreement check on gathered signatures: the rank that differs is named with both values.
TEST(CommValidation, SignaturesThatDifferNameTheRank) {
  comm::OpInfo info;
  info.op = "all_reduce";
  info.backend = "gloo";
  info.group = "world";
  info.seq = 5;
  const int64_t f = static_cast<int64_t>(at::kFloat), i = static_cast<int64_t>(at::kInt);
  std::vector<int64_t> same{1, f, 4, 0, 0, -1, 1, f, 4, 0, 0, -1, 1, f, 4, 0, 0, -1};
  EXPECT_NO_THROW(comm::check_signatures(info, same.data(), {0, 1, 2}));
  std::vector<int64_t> dtype = same;
  dtype[13] = i;
  EXPECT_NE(error_of([&] {
              comm::check_signatures(info, dtype.data(), {0, 1, 2});
            }).find("the ranks disagree on the dtype: rank 2 passed Int where ranks 0, 1 passed Float"),
            std::string::npos);
  std::vector<int64_t> kind = same;
  kind[0] = 6;  // group rank 0 (global rank 4) entered a barrier
  EXPECT_NE(error_of([&] {
              comm::check_signatures(info, kind.data(), {4, 5, 6});
            }).find("rank 4 passed barrier where ranks 5, 6 passed all_reduce"),
            std::string::npos);
}

}  // namespace

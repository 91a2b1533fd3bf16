// Pure tier for comm: argument checks and their messages on a one-rank gloo group (no other process needed),
// and backend choice from the environment.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/factory.h"
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

}  // namespace

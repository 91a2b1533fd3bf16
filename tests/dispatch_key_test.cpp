// Pure tier: DTensor's dispatch key (DTRAIN_DISPATCH_KEY) claimed by another extension first is a clear error
// at the first DTensor, naming the key and the build option, not a crash at load time.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include "comm/factory.h"
#include "core/error.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/dtensor.h"

namespace {

void another_extensions_fallback(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*) {}

TEST(DispatchKey, ClaimedByAnotherExtensionIsNamed) {
  // Another extension registers a backend fallback on the key first.
  torch::Library other(torch::Library::IMPL, "_", dtrain::tensor::detail::kDTensorKey, __FILE__, __LINE__);
  other.fallback(torch::CppFunction::makeFromBoxedFunction<&another_extensions_fallback>());
  auto world = dtrain::comm::create_backend("gloo", dtrain::RankInfo{}, std::chrono::seconds(30));
  auto mesh = std::make_shared<const dtrain::mesh::DeviceMesh>(world, std::vector<int64_t>{1},
                                                               std::vector<std::string>{"x"});
  try {
    dtrain::tensor::from_local(at::ones({2}), mesh, {dtrain::tensor::Replicate()});
    FAIL() << "no error";
  } catch (const dtrain::NotSupportedError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("is already claimed by another extension"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-DDTRAIN_DISPATCH_KEY=PrivateUse2"), std::string::npos) << msg;
  }
}

}  // namespace

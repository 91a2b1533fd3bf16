// Unit tier: the dispatch keys dtrain rides (dispatch/keys.h).
// - The layout keys, libtorch's TESTING_ONLY wrapper keys: libtorch registers nothing on them, and a kernel
//   on them sees an op before autograd records it. When a libtorch release changes either, this fails (and
//   the static_asserts in dispatch/keys.h fail the build when the keys are renamed or moved below autograd).
// - The extension key (DTRAIN_DISPATCH_KEY) claimed by another extension first is a clear error at the first
//   DTensor, naming the key and the build option, not a crash at load time.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include "comm/factory.h"
#include "core/error.h"
#include "dispatch/keys.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/dtensor.h"

namespace {

using dtrain::dispatch::kLossParallelKey;
using dtrain::dispatch::kTensorParallelKey;

TEST(LayoutKeys, LibtorchRegistersNothingOnThem) {
  auto& d = c10::Dispatcher::singleton();
  for (c10::DispatchKey key : {kTensorParallelKey, kLossParallelKey}) {
    EXPECT_FALSE(d.hasBackendFallbackForDispatchKey(key)) << c10::toString(key);
    for (const auto& name : d.getAllOpNames()) {
      auto h = d.findOp(name);
      EXPECT_FALSE(h && h->hasKernelForDispatchKey(key))
          << name.name << " has a kernel on " << c10::toString(key);
    }
  }
}

bool g_autograd_below = false;
int g_calls = 0;

void record_and_pass_on(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (g_calls++ == 0) g_autograd_below = ks.has_any(c10::autograd_dispatch_keyset);  // the outermost call
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kTensorParallelKey), stack);
}

TEST(LayoutKeys, AKernelOnThemRunsBeforeAutograd) {
  torch::Library lib(torch::Library::IMPL, "_", kTensorParallelKey, __FILE__, __LINE__);
  lib.fallback(torch::CppFunction::makeFromBoxedFunction<&record_and_pass_on>());
  at::Tensor w = dtrain::dispatch::with_layout_keys(at::arange(6.0).view({2, 3}),
                                                    c10::DispatchKeySet(kTensorParallelKey));
  ASSERT_TRUE(w.key_set().has(kTensorParallelKey));
  w.requires_grad_(true);
  const at::Tensor x = at::arange(3.0).view({3, 1});
  at::Tensor y = at::mm(w, x);  // what a tensor-parallel kernel intercepts
  EXPECT_GT(g_calls, 0);
  EXPECT_TRUE(g_autograd_below) << "autograd ran before the layout key's kernel";
  EXPECT_TRUE(y.requires_grad());
  EXPECT_TRUE(at::equal(y.detach(), at::mm(at::arange(6.0).view({2, 3}), x)));
}

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

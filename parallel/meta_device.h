// Building a module without its memory, for ZeRO-3 (parallel/zero.h): OnMetaDevice, and the function that
// gives each tensor its values once it is sharded (ZeroOptions::materialize).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

namespace dtrain::parallel {

// Gives a tensor built on the meta device its values: called with its name and a whole tensor of its shape
// and dtype to fill.
using MaterializeFn = std::function<void(const std::string& name, at::Tensor& whole)>;

// While alive, the tensors this thread creates are on the meta device: shapes and dtypes, no memory. A module
// built under it (any torch::nn::Module: libtorch's own modules allocate in their constructors) goes to
// ZeRO-3 with ZeroOptions::materialize giving each parameter its values, one at a time, so that the
// model is never whole on a rank (DeepSpeed's zero.Init, FSDP's meta-device initialisation):
//
//   models::GPT gpt{nullptr};
//   { parallel::OnMetaDevice meta; gpt = models::GPT(cfg); }
//   parallel::ZeroOptions o;
//   models::GPTInit init(cfg.seed);
//   o.materialize = [&](const std::string& name, at::Tensor& t) { init(name, t); };
//   parallel::Zero zero(*gpt, world, 3, make_optimizer, o);
//
// How: libtorch has no default device in C++, so the first OnMetaDevice puts dtrain's kernels in front of the
// factories every tensor starts from (aten::empty and aten::empty_strided, at their device-choosing
// BackendSelect step): while a guard is alive on the thread, a CPU (or unspecified) device becomes meta;
// otherwise they choose as libtorch does. Nests; thread-local.
class OnMetaDevice {
 public:
  OnMetaDevice();
  ~OnMetaDevice();
  OnMetaDevice(const OnMetaDevice&) = delete;
  OnMetaDevice& operator=(const OnMetaDevice&) = delete;

 private:
  bool previous_;
};

}  // namespace dtrain::parallel

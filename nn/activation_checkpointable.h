// The opt-in interface for activation checkpointing (parallel/activation_checkpointing.h). A module whose
// forward is a block `body` (input to output) derives ActivationCheckpointable and runs the body through
// run_body(); parallelize()'s activation-checkpointing patterns install a runner that keeps only the input
// and recomputes the body in backward. Without a runner, run_body() is body(x).
//
//   struct BlockImpl : torch::nn::Module, nn::ActivationCheckpointable {
//     at::Tensor forward(const at::Tensor& x) { return run_body(body_, x, parameters()); }
//     nn::BlockBody body_ = [this](const at::Tensor& x) { ... };  // outlives every backward
//   };
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

namespace dtrain::nn {

// A block's computation, from its input to its output.
using BlockBody = std::function<at::Tensor(const at::Tensor&)>;
// How a strategy runs a block: (body, input, the parameters the body reads) to the output.
using BodyRunner = std::function<at::Tensor(const BlockBody& body, const at::Tensor& x,
                                            const std::vector<at::Tensor>& params)>;

class ActivationCheckpointable {
 public:
  virtual ~ActivationCheckpointable() = default;
  // Installed by activation checkpointing (parallel/activation_checkpointing.h); null: run the body directly.
  void set_body_runner(BodyRunner runner) { runner_ = std::move(runner); }
  bool has_body_runner() const { return static_cast<bool>(runner_); }

 protected:
  // body(x), or what the installed runner makes of it. `body` must outlive the backward (a module's member);
  // `params` are the parameters it reads (a module's parameters()).
  at::Tensor run_body(const BlockBody& body, const at::Tensor& x,
                      const std::vector<at::Tensor>& params) const {
    return runner_ ? runner_(body, x, params) : body(x);
  }

 private:
  BodyRunner runner_;
};

}  // namespace dtrain::nn
